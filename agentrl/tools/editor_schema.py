"""The ``str_replace_editor`` tool as OpenHands shows it to the model: description and schema.

The text is OpenHands 0.62.0's (``agenthub/codeact_agent/tools/str_replace_editor.py``,
``create_str_replace_editor_tool()`` with its default, detailed description), and
``tests/tools/test_editor_golden.py`` compares it with that function's own output. One part is
left out on purpose: OpenHands 0.62.0 adds a required ``security_risk`` argument for its security
analyzer. It is not the editor's (openhands-aci never reads it; OpenHands 0.54.0 and SWE-agent's
``str_replace_editor`` have no such argument), and a model trained with SWE-agent's tool set
would be refused for not sending it.
"""

from __future__ import annotations

from typing import Any

_DESCRIPTION = """Custom editing tool for viewing, creating and editing files in plain-text format
* State is persistent across command calls and discussions with the user
* If `path` is a text file, `view` displays the result of applying `cat -n`. If `path` is a directory, `view` lists non-hidden files and directories up to 2 levels deep
* The following binary file extensions can be viewed in Markdown format: [".xlsx", ".pptx", ".wav", ".mp3", ".m4a", ".flac", ".pdf", ".docx"]. IT DOES NOT HANDLE IMAGES.
* The `create` command cannot be used if the specified `path` already exists as a file
* If a `command` generates a long output, it will be truncated and marked with `<response clipped>`
* The `undo_edit` command will revert the last edit made to the file at `path`
* This tool can be used for creating and editing files in plain-text format.


Before using this tool:
1. Use the view tool to understand the file's contents and context
2. Verify the directory path is correct (only applicable when creating new files):
   - Use the view tool to verify the parent directory exists and is the correct location

When making edits:
   - Ensure the edit results in idiomatic, correct code
   - Do not leave the code in a broken state
   - Always use absolute file paths (starting with /)

CRITICAL REQUIREMENTS FOR USING THIS TOOL:

1. EXACT MATCHING: The `old_str` parameter must match EXACTLY one or more consecutive lines from the file, including all whitespace and indentation. The tool will fail if `old_str` matches multiple locations or doesn't match exactly with the file content.

2. UNIQUENESS: The `old_str` must uniquely identify a single instance in the file:
   - Include sufficient context before and after the change point (3-5 lines recommended)
   - If not unique, the replacement will not be performed

3. REPLACEMENT: The `new_str` parameter should contain the edited lines that replace the `old_str`. Both strings must be different.

Remember: when making multiple file edits in a row to the same file, you should prefer to send all edits in a single message with multiple calls to this tool, rather than multiple messages with a single call each.
"""


def editor_description() -> str:
    """OpenHands' detailed description of ``str_replace_editor``."""
    return _DESCRIPTION


def editor_parameters(workspace: str) -> dict[str, Any]:
    """The JSON schema of the tool's arguments; ``workspace`` is the example path's directory."""
    return {
        "type": "object",
        "properties": {
            "command": {
                "description": "The commands to run. Allowed options are: `view`, `create`, "
                "`str_replace`, `insert`, `undo_edit`.",
                "enum": ["view", "create", "str_replace", "insert", "undo_edit"],
                "type": "string",
            },
            "path": {
                "description": f"Absolute path to file or directory, e.g. `{workspace}/file.py` "
                f"or `{workspace}`.",
                "type": "string",
            },
            "file_text": {
                "description": "Required parameter of `create` command, with the content of the "
                "file to be created.",
                "type": "string",
            },
            "old_str": {
                "description": "Required parameter of `str_replace` command containing the "
                "string in `path` to replace.",
                "type": "string",
            },
            "new_str": {
                "description": "Optional parameter of `str_replace` command containing the new "
                "string (if not given, no string will be added). Required parameter of `insert` "
                "command containing the string to insert.",
                "type": "string",
            },
            "insert_line": {
                "description": "Required parameter of `insert` command. The `new_str` will be "
                "inserted AFTER the line `insert_line` of `path`.",
                "type": "integer",
            },
            "view_range": {
                "description": "Optional parameter of `view` command when `path` points to a "
                "file. If none is given, the full file is shown. If provided, the file will be "
                "shown in the indicated line number range, e.g. [11, 12] will show lines 11 and "
                "12. Indexing at 1 to start. Setting `[start_line, -1]` shows all lines from "
                "`start_line` to the end of the file.",
                "items": {"type": "integer"},
                "type": "array",
            },
        },
        "required": ["command", "path"],
    }
