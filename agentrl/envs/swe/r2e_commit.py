"""R2E-Gym's commit model: its ``ParsedCommit`` read from a git diff, and what R2E-Gym derives from
one (the gold patch, which files are tests, the task shown to the agent).

R2E-Gym (github.com/R2E-Gym/R2E-Gym) is not on PyPI; each function names the code of
``src/r2egym`` it reproduces. A ``ParsedCommit`` is handled here as the JSON R2E-Gym's rows hold
(``parsed_commit_content``): ``file_diffs`` (each a header with the path and the mode lines, an
``index`` line, the ``---``/``+++`` paths and hunks of typed lines), the two commit hashes, the
message and the date.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)")
_MODE_LINES = ("old mode", "new mode", "deleted file mode", "new file mode")


def parsed_commit(diff: str, old: str, new: str, message: str) -> dict[str, Any]:
    """``diff`` (a git diff) as R2E-Gym's ``ParsedCommit``, read line by line as its
    ``CommitParser.parse_git_diff`` reads one without a repository."""
    files: list[dict[str, Any]] = []
    hunk: dict[str, Any] | None = None
    for line in diff.removesuffix("\n").split("\n"):
        if line.startswith("diff --git"):
            match = re.match(r'diff --git (?:")?a/([^"]+)(?:")? (?:")?b/([^"]+)(?:")?', line)
            if match is None or match.group(1) != match.group(2):
                raise ValueError(f"R2E-Gym reads no renames or odd headers: {line!r}")
            files.append(_file_diff(match.group(1)))
            hunk = None
        elif not files:
            continue
        elif line.startswith("@@ "):
            hunk = _hunk(line)
            files[-1]["hunks"].append(hunk)
        elif hunk is not None:
            kind = {" ": "context", "": "context", "-": "deleted", "+": "added"}.get(line[:1])
            if kind is not None:
                hunk["line_group"]["all_lines"].append({"content": line[1:], "type": kind})
            elif line.startswith("\\"):
                hunk["line_group"]["all_lines"].append({"content": line[2:], "type": "note"})
        else:
            _header_line(files[-1], line)
    return {
        "file_diffs": files,
        "old_commit_hash": old,
        "new_commit_hash": new,
        "commit_message": message,
        "commit_date": "2000-01-01T00:00:00Z",
        "metadata": {},
    }


def _file_diff(path: str) -> dict[str, Any]:
    return {
        "old_file_content": "",
        "new_file_content": "",
        "header": {"file": {"path": path}, "misc_line": None},
        "index_line": None,
        "is_binary_file": False,
        "binary_line": None,
        "minus_file": None,
        "plus_file": None,
        "hunks": [],
    }


def _hunk(line: str) -> dict[str, Any]:
    match = _HUNK.match(line)
    if match is None:
        raise ValueError(f"invalid hunk header: {line!r}")
    a, b, c, d, section = match.groups()
    return {
        "descriptor": {
            "old_range": {"start": int(a), "length": int(b) if b else None},
            "new_range": {"start": int(c), "length": int(d) if d else None},
            "section": section.lstrip(),
        },
        "line_group": {"all_lines": []},
        "modified_entities": [],
        "added_entities": [],
        "deleted_entities": [],
    }


def _header_line(file: dict[str, Any], line: str) -> None:
    if line.startswith("index"):
        parts = line.split()
        old, _, new = parts[1].partition("..")
        mode = parts[2] if len(parts) > 2 else ""
        file["index_line"] = {"old_commit_hash": old, "new_commit_hash": new, "mode": mode}
    elif line.startswith(_MODE_LINES):
        misc = file["header"]["misc_line"]
        file["header"]["misc_line"] = f"{misc}\n{line}" if misc else line
    elif line.startswith("+++ "):
        file["plus_file"] = {"path": line[4:]}
    elif line.startswith("--- "):
        file["minus_file"] = {"path": line[4:]}
    elif line.startswith("Binary files"):
        file["is_binary_file"], file["binary_line"] = True, line
    elif line:
        raise ValueError(f"unexpected line in a diff header: {line!r}")


def r2e_task_instruction(problem_statement: str) -> str:
    """What R2E-Gym shows the agent (``DockerRuntime.get_task_instruction``): the text inside
    ``[ISSUE]...[/ISSUE]``, else the whole statement."""
    match = re.search(r"\[ISSUE\](.*)\[/ISSUE\]", problem_statement, re.DOTALL)
    return match.group(1) if match else problem_statement


def r2e_is_test_file(path: str) -> bool:
    # R2E-Gym src/r2egym/commit_models/diff_classes.py, FileDiff.is_test_file.
    parts = path.split("/")
    return (
        path.endswith("_test.py")
        or path.startswith("test_")
        or parts[-1].startswith("test_")
        or any(part in parts for part in ("tests", "Tests", "test", "Test"))
    )


def r2e_gold_patch(commit: Mapping[str, Any]) -> str:
    """R2E-Gym's ``ParsedCommit.get_patch(test_file=False)`` (its gold patch): the non-test
    Python files' diffs, serialised as ``FileDiff.get_patch`` does."""
    marks = {"context": " ", "added": "+", "deleted": "-", "note": "\\ "}
    patch = ""
    for diff in commit["file_diffs"]:
        path = diff["header"]["file"]["path"]
        if not path.endswith(".py") or r2e_is_test_file(path):
            continue
        patch += f"diff --git a/{path} b/{path}\n"
        if diff["header"].get("misc_line"):
            patch += diff["header"]["misc_line"] + "\n"
        if index := diff.get("index_line"):
            mode = f" {index['mode']}" if index["mode"] else ""
            patch += f"index {index['old_commit_hash']}..{index['new_commit_hash']}{mode}\n"
        if diff.get("is_binary_file"):
            patch += diff["binary_line"] + "\n"
        if diff.get("minus_file") and diff.get("plus_file"):
            patch += f"--- {diff['minus_file']['path']}\n+++ {diff['plus_file']['path']}\n"
        for hunk in diff.get("hunks", []):
            head = hunk["descriptor"]
            ranges = [
                f"{r['start']}" + (f",{r['length']}" if r.get("length") is not None else "")
                for r in (head["old_range"], head["new_range"])
            ]
            section = f" {head['section']}" if head["section"] else ""
            patch += f"@@ -{ranges[0]} +{ranges[1]} @@{section}\n"
            for line in hunk["line_group"]["all_lines"]:
                patch += marks[line["type"]] + line["content"] + "\n"
    return patch
