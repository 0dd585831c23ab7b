"""SWE-v0 with ``tool_set="str_replace_editor"``: the editor's schema, the prompt that names it,
and an episode that views, edits, undoes and submits through it on a shipped instance."""

import json

import gymnasium
import pytest

import agentrl  # noqa: F401  (registers the environments)
from agentrl.envs.swe.workspace import REPO_DIR

pytestmark = pytest.mark.slow

INSTANCE = "toolz__1.2.0-5"


def hermes(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_the_default_tool_set_is_unchanged():
    env = gymnasium.make("agentrl/SWE-v0", sandbox="bwrap", instance_ids=[INSTANCE])
    assert env.unwrapped.tools.names == ["bash", "view", "create", "str_replace", "submit"]
    assert "str_replace_editor" not in env.unwrapped.default_system_prompt()


async def test_an_episode_with_the_editor_tool_set():
    env = gymnasium.make(
        "agentrl/SWE-v0", sandbox="bwrap", instance_ids=[INSTANCE], tool_set="str_replace_editor"
    ).unwrapped
    try:
        messages, info = await env.areset(seed=0, options={"index": 0})
        names = [tool["function"]["name"] for tool in info["tools"]]
        assert names == ["bash", "str_replace_editor", "submit"]
        editor = info["tools"][1]["function"]
        assert editor["parameters"]["required"] == ["command", "path"]
        assert REPO_DIR in editor["parameters"]["properties"]["path"]["description"]
        prompt = messages[0]["content"]
        assert "Tools: bash, str_replace_editor and submit." in prompt
        assert "undo_edit" in prompt and '"command": "str_replace"' in prompt

        listing, *_ = await env.astep(hermes("str_replace_editor", command="view", path=REPO_DIR))
        assert listing[0]["content"].startswith(
            f"Here's the files and directories up to 2 levels deep in {REPO_DIR}"
        )
        readme = f"{REPO_DIR}/README.rst"
        calls = hermes("str_replace_editor", command="create", path=readme, file_text="x")
        calls += hermes(
            "str_replace_editor",
            command="insert",
            path=readme,
            insert_line=0,
            new_str="NEW FIRST LINE",
        )
        calls += hermes("str_replace_editor", command="undo_edit", path=readme)
        calls += hermes("str_replace_editor", command="frobnicate", path=readme)
        calls += hermes("bash", command=f"head -c 5 {readme}")
        (refused, inserted, undone, unknown, head), reward, done, _, _ = await env.astep(calls)
        assert refused["content"].startswith("ERROR:\nInvalid `path` parameter")
        assert "Cannot overwrite files using command `create`" in refused["content"]
        assert "     1\tNEW FIRST LINE" in inserted["content"]
        assert undone["content"].startswith(f"Last edit to {readme} undone successfully.")
        assert unknown["content"].startswith("ERROR:\nUnrecognized command frobnicate.")
        assert head["content"] != "NEW F" and not done and reward == 0.0
        *_, done, _, info = await env.astep(hermes("submit"))
        assert done and info["submitted"] and "infra_error" not in info
    finally:
        await env.aclose()
