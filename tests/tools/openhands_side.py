"""The anchor's side of the str_replace_editor golden tests; runs in ``.venv-openhands``.

``python openhands_side.py editor`` reads ``{"workspace_root": str | null, "calls": [{...}]}`` on
stdin, runs each call through openhands-aci's own ``OHEditor`` (one editor, so the undo history
carries across the calls) and prints the list of texts the model would read: the result's output,
or ``ERROR:\\n`` and the error, as openhands-aci's ``file_editor`` formats them.

``python openhands_side.py schema WORKSPACE`` prints OpenHands' ``create_str_replace_editor_tool(
workspace_mount_path_in_sandbox=WORKSPACE)``. Its module is loaded from the installed
openhands-ai 0.62.0 with the three small modules it imports; openhands-ai's package
``__init__``s (which import its whole agent runtime) are skipped, and ``litellm``, whose two
TypedDict constructors the function calls, is a stand-in that builds the same plain dicts.
"""

import importlib.util
import json
import sys
import types
from pathlib import Path


def editor() -> None:
    from openhands_aci.editor import OHEditor, ToolError, ToolResult, _make_api_tool_result

    request = json.load(sys.stdin)
    oh_editor = OHEditor(workspace_root=request["workspace_root"])
    texts = []
    for call in request["calls"]:
        try:
            result = oh_editor(**call)
        except ToolError as exc:
            result = ToolResult(error=exc.message)
        texts.append(_make_api_tool_result(result))
    json.dump(texts, sys.stdout)


def schema(workspace: str) -> None:
    spec = importlib.util.find_spec("openhands")
    assert spec is not None and spec.submodule_search_locations, "openhands-ai is not installed"
    root = Path(next(iter(spec.submodule_search_locations)))
    litellm = types.ModuleType("litellm")
    litellm.ChatCompletionToolParam = dict  # TypedDicts: calling one gives a plain dict
    litellm.ChatCompletionToolParamFunctionChunk = dict
    sys.modules["litellm"] = litellm
    for package in [
        "openhands",
        "openhands.core",
        "openhands.core.config",
        "openhands.llm",
        "openhands.agenthub",
        "openhands.agenthub.codeact_agent",
        "openhands.agenthub.codeact_agent.tools",
    ]:
        module = types.ModuleType(package)
        module.__path__ = [str(root.joinpath(*package.split(".")[1:]))]
        sys.modules[package] = module
    for name in [
        "openhands.core.config.config_utils",
        "openhands.llm.tool_names",
        "openhands.agenthub.codeact_agent.tools.security_utils",
        "openhands.agenthub.codeact_agent.tools.str_replace_editor",
    ]:
        path = root.joinpath(*name.split(".")[1:]).with_suffix(".py")
        module_spec = importlib.util.spec_from_file_location(name, path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
    tool = module.create_str_replace_editor_tool(workspace_mount_path_in_sandbox=workspace)
    json.dump(tool, sys.stdout)


if __name__ == "__main__":
    if sys.argv[1] == "editor":
        editor()
    else:
        schema(sys.argv[2])
