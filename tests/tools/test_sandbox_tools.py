"""The agent's sandbox tools, called the way an environment calls them: through a ToolSet."""

import pytest

from agentrl.tools import EpisodeSandbox, SandboxLimits, ToolCall, ToolSet, sandbox_factory
from agentrl.tools.sandbox_tools import CLIP_MARKER, sandbox_tools


@pytest.fixture
async def episode():
    episode = EpisodeSandbox(sandbox_factory("bwrap", SandboxLimits(memory_mb=256, pids=64)))
    yield episode
    await episode.release()


async def call(tools: ToolSet, name: str, **arguments) -> str:
    (message,) = await tools.run([ToolCall(name, arguments, raw="")])
    return message["content"]


async def test_tools_share_one_sandbox_started_on_first_use(episode):
    tools = ToolSet(sandbox_tools(episode.get, timeout=5))
    assert tools.names == ["python", "bash", "view", "create_file", "str_replace"]
    assert not episode.started
    assert await call(tools, "create_file", path="app.py", content="X = 1\nY = 2\n") == (
        "Wrote 2 lines to app.py."
    )
    assert episode.started
    assert await call(tools, "bash", command="python3 -c 'import app; print(app.Y)'") == "2\n"
    assert await call(tools, "python", code="import app\nvalue = app.X + 40") == ""
    assert await call(tools, "python", code="value + 1") == "42\n"
    assert await call(tools, "view", path="app.py") == "1\tX = 1\n2\tY = 2\n"
    assert await call(tools, "view", path="app.py", start_line=2) == "2\tY = 2\n"


async def test_str_replace_edits_exactly_one_occurrence(episode):
    tools = ToolSet(sandbox_tools(episode.get))
    await call(tools, "create_file", path="f.py", content="a = 1\nb = 1\nc = 2\n")
    edited = await call(tools, "str_replace", path="f.py", old="c = 2", new="c = 3\nd = 4")
    assert edited.startswith("Edited f.py. Lines 1-4 now read:\n")
    assert await call(tools, "view", path="f.py") == "1\ta = 1\n2\tb = 1\n3\tc = 3\n4\td = 4\n"
    ambiguous = await call(tools, "str_replace", path="f.py", old="= 1", new="= 9")
    assert ambiguous.startswith("Error:") and "occurs 2 times" in ambiguous
    missing = await call(tools, "str_replace", path="f.py", old="zzz", new="y")
    assert "occurs 0 times" in missing
    assert await call(tools, "view", path="f.py") == "1\ta = 1\n2\tb = 1\n3\tc = 3\n4\td = 4\n"


async def test_tool_errors_are_messages_not_exceptions(episode):
    tools = ToolSet(sandbox_tools(episode.get, timeout=1, max_output_bytes=20))
    assert (await call(tools, "view", path="nope.txt")).startswith("Error:")
    assert "No such file" in await call(tools, "view", path="nope.txt")
    assert await call(tools, "bash", command="exit 3") == "[exit code 3]"
    slow = await call(tools, "python", code="x = 5\nwhile True: pass")
    assert slow == (
        "[timed out after 1 s]\n[the Python interpreter was restarted: earlier variables are gone]"
    )
    assert await call(tools, "bash", command="yes | head -c 1000") == (
        "y\n" * 5 + CLIP_MARKER + "y\n" * 5
    )
    bad = await call(tools, "bash", cmd="ls")
    assert bad.startswith("Error: invalid arguments for tool 'bash'")


async def test_long_bash_output_keeps_its_head_and_its_tail(episode):
    tools = ToolSet(sandbox_tools(episode.get, max_output_bytes=1000))
    text = await call(tools, "bash", command="seq 1 100000; seq 1 3 >&2; exit 4")
    assert text.startswith("1\n2\n3\n") and CLIP_MARKER in text
    assert text.endswith("99999\n100000\n1\n2\n3\n[exit code 4]")
    assert len(text) < 1000 + len(CLIP_MARKER) + 20
    assert await call(tools, "bash", command="seq 1 5") == "1\n2\n3\n4\n5\n"


async def test_a_crashed_sandbox_is_replaced_on_the_next_call(episode):
    tools = ToolSet(sandbox_tools(episode.get))
    await call(tools, "python", code="x = 1")
    # bash's parent clips its output; the agent is the parent's parent
    crashed = await call(tools, "bash", command="kill -9 $(cut -d' ' -f4 /proc/$PPID/stat)")
    assert crashed.startswith("Error: tool 'bash' raised SandboxCrashed")
    assert await call(tools, "python", code="'x' in dir()") == "False\n"


def test_unknown_tool_names_are_rejected():
    with pytest.raises(ValueError, match="unknown sandbox tools"):
        sandbox_tools(lambda: None, names=("python", "rm_rf"))


async def test_a_workdir_is_where_bash_starts_and_relative_paths_resolve(episode):
    tools = ToolSet(sandbox_tools(episode.get, workdir="/work/repo"))
    await (await episode.get()).exec("mkdir /work/repo")
    assert (await call(tools, "create_file", path="a.txt", content="one\n")).startswith("Wrote")
    assert await call(tools, "bash", command="pwd; cat a.txt") == "/work/repo\none\n"
    assert (await call(tools, "str_replace", path="a.txt", old="one", new="two")).startswith(
        "Edited"
    )
    assert await call(tools, "view", path="/work/repo/a.txt") == "1\ttwo\n"
    with pytest.raises(ValueError, match="absolute"):
        sandbox_tools(episode.get, workdir="repo")
