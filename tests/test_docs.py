"""The docs pages' Python examples run as written, and every relative link of the README and the
docs pages reaches an existing file (and heading)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
RUN_PAGES = ["environments.md", "sandboxes.md", "engines.md", "training.md"]
"""Pages whose Python blocks are examples to run (the README's run in tests/test_readme.py)."""
BLOCKS = [
    (page, index, block)
    for page in RUN_PAGES
    for index, block in enumerate(
        re.findall(r"```python\n(.*?)```", (ROOT / "docs" / page).read_text(), flags=re.S)
    )
]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_BLOCK = re.compile(r"```.*?```", flags=re.S)


def test_docs_have_python_examples():
    assert {page for page, _, _ in BLOCKS} == set(RUN_PAGES)


@pytest.mark.parametrize(("page", "index", "block"), BLOCKS, ids=[f"{p}-{i}" for p, i, _ in BLOCKS])
def test_docs_example_runs(page, index, block):
    exec(compile(block, f"docs/{page} block {index}", "exec"), {"__name__": "docs"})


def heading_anchors(page: Path) -> set[str]:
    """GitHub's anchors for the headings of ``page``: lower case, punctuation dropped, spaces to
    hyphens, ``-1``, ``-2``... for repeats."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", CODE_BLOCK.sub("", page.read_text()), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(CODE_BLOCK.sub("", page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and destination.suffix == ".md" and anchor not in heading_anchors(destination):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {', '.join(broken)}"
