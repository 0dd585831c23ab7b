"""``str_replace_editor`` against its anchor: openhands-aci 0.3.3's own editor, on the same files.

Each test runs one sequence of calls twice: through our tool on a bubblewrap sandbox, and through
openhands-aci's ``OHEditor`` (``openhands_side.py`` in ``.venv-openhands``, made by
``scripts/setup-openhands-env``) on a copy of the same tree on the host. The shipped tabulate
repository is the tree. The two roots have the same length (the sandbox's is ``/work/`` plus as
many ``r`` as the host path needs), so the clip at 16,000 characters falls in the same place; the
anchor's texts are compared after its root is replaced by ours, and must be equal. The listing's
``sort`` runs in the C locale on both sides (the sandbox has no locale set).
"""

import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from agentrl.envs.swe.env import SHIPPED_INSTANCES
from agentrl.envs.swe.instances import load_instances
from agentrl.envs.swe.projects import SHIPPED_PROJECTS, load_projects, project_of
from agentrl.envs.swe.workspace import BaseTrees
from agentrl.tools import EpisodeSandbox, SandboxLimits, ToolCall, ToolSet, sandbox_factory
from agentrl.tools.editor import SandboxEditor

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SIDE_VENV = ROOT / ".venv-openhands"
SIDE = Path(__file__).with_name("openhands_side.py")
INSTANCE = "tabulate__0.10.0-1"
MODULE = "tabulate/__init__.py"  # about 120,000 characters: clipped


@pytest.fixture(scope="module")
def side_python() -> Path:
    """The anchor's interpreter; missing, the tests fail (CI must not skip them)."""
    if not (SIDE_VENV / ".openhands-env-installed").exists():
        pytest.fail(
            f"the openhands venv is missing ({SIDE_VENV}): run scripts/setup-openhands-env "
            "(make test does)",
            pytrace=False,
        )
    return SIDE_VENV / "bin" / "python"


@pytest.fixture(scope="module")
def archive() -> bytes:
    (instance,) = [i for i in load_instances(SHIPPED_INSTANCES) if i.instance_id == INSTANCE]
    project = project_of(instance, load_projects(SHIPPED_PROJECTS))
    tree = BaseTrees().archive(instance, project.sdist)
    buffer = io.BytesIO()  # plus a binary file and a hidden directory
    with (
        tarfile.open(fileobj=io.BytesIO(tree)) as source,
        tarfile.open(fileobj=buffer, mode="w:gz") as out,
    ):
        for member in source.getmembers():
            out.addfile(member, source.extractfile(member) if member.isfile() else None)
        for name, data in [("data.bin", b"\x00\x01\x02binary"), (".hidden/x", b"x\n")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class Twins:
    """The same tree at ``host`` (for the anchor) and at ``box`` in a sandbox (for our tool)."""

    def __init__(self, side_python: Path, host: Path, box: str, episode: EpisodeSandbox):
        self.side_python, self.host, self.box, self.episode = side_python, host, box, episode
        self.tools = ToolSet([SandboxEditor(episode.get, workspace_root=box).tool()])

    async def both(self, calls: list[dict]) -> tuple[list[str], list[str]]:
        """Our texts and the anchor's (its root mapped to ours) for ``calls`` on ``box`` paths."""
        ours = [m["content"] for m in await self.tools.run([self._call(c) for c in calls])]
        host_calls = [self._on_host(call) for call in calls]
        request = json.dumps({"workspace_root": str(self.host), "calls": host_calls})
        done = subprocess.run(
            [self.side_python, SIDE, "editor"],
            input=request,
            capture_output=True,
            text=True,
            cwd=self.host.parent,
            env={**os.environ, "LC_ALL": "C"},
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return ours, [self._mapped(text) for text in json.loads(done.stdout)]

    async def check(self, calls: list[dict]) -> list[str]:
        ours, theirs = await self.both(calls)
        for call, mine, anchor in zip(calls, ours, theirs, strict=True):
            assert mine == anchor, f"{call}:\nours:\n{mine[:3000]}\nanchor:\n{anchor[:3000]}"
        return ours

    def _mapped(self, text: str) -> str:
        """The anchor's ``text`` with its root replaced by ours, also where a clip cut it."""
        text = text.replace(str(self.host), self.box)
        clipped = text.find("<response clipped>")
        start = text.rfind("\n", 0, clipped) + 1
        if clipped > 0 and str(self.host).startswith(text[start:clipped]):
            text = text[:start] + self.box[: clipped - start] + text[clipped:]
        return text

    def _call(self, call: dict) -> ToolCall:
        return ToolCall("str_replace_editor", call, raw="")

    def _on_host(self, call: dict) -> dict:
        path = call.get("path", "")
        return call | {"path": path.replace(self.box, str(self.host), 1)}


@pytest.fixture
async def twins(side_python, archive, tmp_path):
    host = tmp_path / "repo"
    host.mkdir()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tree:
        # our own archive; Python before 3.11.4 (Debian's 3.11.2) has no extraction filters
        tree.extractall(host, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    box = "/work/" + "r" * (len(str(host)) - len("/work/"))
    episode = EpisodeSandbox(sandbox_factory("bwrap", SandboxLimits(memory_mb=512, pids=64)))
    sandbox = await episode.get()
    await sandbox.write_file("/tmp/tree.tar.gz", archive)
    unpack = await sandbox.exec(f"mkdir {box} && tar -xzf /tmp/tree.tar.gz -C {box}", timeout=60)
    assert unpack.exit_code == 0, unpack.stderr
    yield Twins(side_python, host, box, episode)
    await episode.release()


async def test_a_directory_view_lists_two_levels_and_counts_the_hidden_entries(twins):
    listing, *_ = await twins.check(
        [
            {"command": "view", "path": twins.box},
            {"command": "view", "path": twins.box + "/tabulate/"},
            {"command": "view", "path": twins.box, "view_range": [1, 2]},
        ]
    )
    assert f"{twins.box}/tabulate/\n" in listing and "hidden files/directories" in listing, listing


async def test_long_views_are_clipped_at_16000_characters_with_the_anchors_notice(twins):
    many = "".join(f"mkdir -p {twins.box}/wide/d{i:04d}; " for i in range(400))
    await (await twins.episode.get()).exec(many, timeout=60)
    for i in range(400):
        (twins.host / "wide" / f"d{i:04d}").mkdir(parents=True)
    module = twins.box + "/" + MODULE
    whole, ranged, directory = await twins.check(
        [
            {"command": "view", "path": module},
            {"command": "view", "path": module, "view_range": [100, -1]},
            {"command": "view", "path": twins.box + "/wide"},
        ]
    )
    assert "<response clipped>" in whole and len(whole) < 25_000
    assert "<response clipped>" in ranged and "<response clipped>" in directory


async def test_view_ranges_and_their_refusals_match(twins):
    module = twins.box + "/" + MODULE
    await twins.check(
        [
            {"command": "view", "path": module, "view_range": [1, 12]},
            {"command": "view", "path": module, "view_range": [2890, 99999]},
            {"command": "view", "path": module, "view_range": [0, 5]},
            {"command": "view", "path": module, "view_range": [10, 5]},
            {"command": "view", "path": module, "view_range": [10, -3]},
            {"command": "view", "path": module, "view_range": [1]},
            {"command": "view", "path": module, "view_range": [1, 2, 3]},
            {"command": "view", "path": module, "view_range": [999999, 1000000]},
            {"command": "view", "path": twins.box + "/data.bin"},
        ]
    )


async def test_create_refuses_an_existing_file_and_a_missing_directory(twins):
    await twins.check(
        [
            {"command": "create", "path": twins.box + "/README.md", "file_text": "gone\n"},
            {"command": "create", "path": twins.box + "/new.py", "file_text": "a = 1\n\nb = 2"},
            {"command": "view", "path": twins.box + "/new.py"},
            {"command": "create", "path": twins.box + "/nodir/new.py", "file_text": "x"},
            {"command": "create", "path": twins.box + "/other.py"},
            {"command": "create", "path": twins.box + "/tabulate", "file_text": "x"},
        ]
    )


async def test_str_replace_needs_one_exact_occurrence(twins):
    module = twins.box + "/" + MODULE
    await twins.check(
        [
            {"command": "str_replace", "path": module, "old_str": "import ", "new_str": "x"},
            {"command": "str_replace", "path": module, "old_str": "no such text", "new_str": ""},
            {"command": "str_replace", "path": module, "old_str": "same", "new_str": "same"},
            {"command": "str_replace", "path": module, "new_str": "x"},
            {"command": "str_replace", "path": module, "old_str": "", "new_str": "x"},
            {
                "command": "str_replace",
                "path": module,
                "old_str": "  def _is_file(f):  \n",
                "new_str": "\ndef _is_a_file(f):\n",
            },
            {"command": "str_replace", "path": module, "old_str": "def simple_separated_format"},
            {"command": "view", "path": module, "view_range": [1, 40]},
        ]
    )


async def test_insert_puts_text_after_a_line_and_checks_the_line(twins):
    readme = twins.box + "/README.md"
    await twins.check(
        [
            {"command": "insert", "path": readme, "insert_line": 0, "new_str": "TOP\nLINE"},
            {"command": "insert", "path": readme, "insert_line": 7, "new_str": "seven"},
            {"command": "insert", "path": readme, "insert_line": -1, "new_str": "x"},
            {"command": "insert", "path": readme, "insert_line": 10**6, "new_str": "x"},
            {"command": "insert", "path": readme, "new_str": "x"},
            {"command": "insert", "path": readme, "insert_line": 1},
            {"command": "view", "path": readme, "view_range": [1, 12]},
        ]
    )


async def test_undo_edit_walks_back_each_edit_then_reports_no_history(twins):
    module = twins.box + "/" + MODULE
    new = twins.box + "/new.py"
    await twins.check(
        [
            {"command": "undo_edit", "path": module},
            {
                "command": "str_replace",
                "path": module,
                "old_str": "def tabulate(",
                "new_str": "def t(",
            },
            {"command": "insert", "path": module, "insert_line": 2, "new_str": "# added"},
            {"command": "undo_edit", "path": module},
            {"command": "undo_edit", "path": module},
            {"command": "undo_edit", "path": module},
            {"command": "create", "path": new, "file_text": "v1\n"},
            {"command": "str_replace", "path": new, "old_str": "v1", "new_str": "v2"},
            {"command": "undo_edit", "path": new},
            {"command": "undo_edit", "path": new},
            {"command": "undo_edit", "path": new},
        ]
    )


async def test_malformed_calls_get_the_anchors_error_text(twins):
    await twins.check(
        [
            {"command": "delete", "path": twins.box + "/README.md"},
            {"command": "view", "path": "README.md"},
            {"command": "view", "path": "no/such/file.py"},
            {"command": "view", "path": twins.box + "/missing.py"},
            {"command": "undo_edit", "path": twins.box + "/tabulate"},
            {
                "command": "insert",
                "path": twins.box + "/data.bin",
                "insert_line": 0,
                "new_str": "x",
            },
            {"command": "str_replace", "path": twins.box + "/x.pdf", "old_str": "a"},
        ]
    )


async def test_schema_is_openhands_own(side_python):
    done = subprocess.run(
        [side_python, SIDE, "schema", "/work/repo"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    anchor = json.loads(done.stdout)
    parameters = anchor["function"]["parameters"]
    del parameters["properties"][
        "security_risk"
    ]  # OpenHands' security analyzer's, not the editor's
    parameters["required"].remove("security_risk")
    tool = SandboxEditor(EpisodeSandbox(sandbox_factory("bwrap")).get, workspace_root="/work/repo")
    assert tool.tool().schema() == anchor
