"""``str_replace_editor``: the file editor of OpenHands and SWE-agent, acting on a sandbox.

One tool, ``str_replace_editor(command, path, ...)``, with the commands ``view`` (a file with
``cat -n`` numbers, or a directory two levels deep), ``create`` (refused over an existing file),
``str_replace`` (one exact occurrence), ``insert`` (after a line) and ``undo_edit``. The anchor is
openhands-aci 0.3.3's ``OHEditor`` as OpenHands' ``file_editor`` reports it: the result text, the
``ERROR:\\n...`` messages, the 16,000-character clip with its ``<response clipped>`` notice (the
editor keeps the head only, as the anchor does) and the four context lines around an edit are the
anchor's, checked against its own code in ``tests/tools/test_editor_golden.py``. The schema is
OpenHands 0.62.0's ``create_str_replace_editor_tool()`` (:mod:`agentrl.tools.editor_schema`).

Our own: every command runs on the sandbox (``exec``, ``read_file``, ``write_file``), and the undo
history (ten entries per file, as the anchor keeps) lives here, per sandbox: a new sandbox (a new
episode) starts with none. Not reproduced: files are read as UTF-8 (the anchor guesses the
encoding); a file is "binary" when its first 1,024 bytes hold a NUL or 0xFF byte, it ends in
``.pyc`` or it is not UTF-8 (the anchor asks ``binaryornot``); ``.pdf``/``.docx``/... are not
converted to Markdown (the anchor's conversion-failure message is returned). Arguments of the
wrong JSON type are refused by :class:`~agentrl.tools.Tool`'s validation with its own message.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Awaitable, Callable
from pathlib import PurePosixPath

from agentrl.tools.editor_schema import editor_description, editor_parameters
from agentrl.tools.sandbox import Sandbox, SandboxError
from agentrl.tools.tool import Tool

EDITOR_COMMANDS = ("view", "create", "str_replace", "insert", "undo_edit")
MAX_RESPONSE_CHARS = 16_000
"""Longer file and directory views are clipped here (openhands-aci's MAX_RESPONSE_LEN_CHAR)."""

_SNIPPET_LINES = 4
_HISTORY_PER_FILE = 10
_MAX_FILE_BYTES = 10 << 20
_LISTING_BYTES = 8 << 20  # what a directory view may read back before clipping to 16,000 chars
_BINARY_SUFFIXES = (".docx", ".xlsx", ".pptx", ".pdf", ".mp3", ".wav", ".m4a", ".flac")
_CLIPPED = "<response clipped><NOTE>Due to the max output limit, only part of "
_FILE_CLIPPED = (
    _CLIPPED + "this file has been shown to you. You should retry this tool after you have "
    "searched inside the file with `grep -n` in order to find the line numbers of what you are "
    "looking for.</NOTE>"
)
_DIR_CLIPPED = (
    _CLIPPED + "this directory has been shown to you. You should use `ls -la` instead to view "
    "large directories incrementally.</NOTE>"
)
_ANY_CLIPPED = _CLIPPED + "the full response has been shown to you.</NOTE>"

# What the path is: "dir", "file SIZE", "missing"; then what its parent is: dir, missing, other.
_PROBE_SH = """p=$1
if [ -d "$p" ]; then echo dir; elif [ -e "$p" ]; then echo "file $(stat -L -c %s "$p")"
else echo missing; fi
d=$(dirname "$p"); if [ -d "$d" ]; then echo dir; elif [ -e "$d" ]; then echo other
else echo missing; fi"""
# The listing (sorted, its stderr kept), then the number of hidden entries, then the directories.
_TREE = """-maxdepth 2 -not \\( -path "$1/\\.*" -o -path "$1/*/\\.*" \\)"""
_LIST_SH = f"""find -L "$1" {_TREE} | sort
printf '\\0'; find -L "$1" -mindepth 1 -maxdepth 1 -name '.*' 2>/dev/null | wc -l
printf '\\0'; find -L "$1" {_TREE} -type d 2>/dev/null"""


class EditorError(Exception):
    """A refused command; its message is what the model reads after ``ERROR:``."""


@dataclasses.dataclass(frozen=True)
class _Target:
    path: str  # normalised as pathlib prints it: no trailing or doubled slashes
    kind: str  # "dir", "file" or "missing"
    size: int
    parent: str  # "dir", "missing" or "other"


class SandboxEditor:
    """The editor's commands on ``await get_sandbox()``; :meth:`tool` wraps it for a ToolSet.

    ``workspace_root`` (absolute) is where a relative path is looked up for the anchor's "Maybe
    you meant ...?" hint and the example path in the schema; None gives neither hint nor root.
    """

    def __init__(
        self,
        get_sandbox: Callable[[], Awaitable[Sandbox]],
        *,
        workspace_root: str | None = None,
        timeout: float = 60.0,
    ) -> None:
        if workspace_root is not None and not workspace_root.startswith("/"):
            raise ValueError(f"workspace_root must be an absolute path, got {workspace_root!r}")
        self._get_sandbox = get_sandbox
        self.workspace_root = workspace_root
        self._timeout = timeout
        self._sandbox: Sandbox | None = None
        self._history: dict[str, list[str]] = {}
        self._lock = asyncio.Lock()  # calls of one message run one at a time, in order

    def tool(self) -> Tool:
        """The ``str_replace_editor`` tool with OpenHands' description and parameter schema."""
        tool = Tool.from_function(
            self.run, name="str_replace_editor", description=editor_description()
        )
        return dataclasses.replace(
            tool, parameters=editor_parameters(self.workspace_root or "/workspace")
        )

    async def run(
        self,
        command: str,
        path: str,
        file_text: str | None = None,
        view_range: list[int] | None = None,
        old_str: str | None = None,
        new_str: str | None = None,
        insert_line: int | None = None,
    ) -> str:
        """Run one editor command; a refusal is returned as ``ERROR:\\n<why>``, never raised."""
        async with self._lock:
            return await self._run(
                command, path, file_text, view_range, old_str, new_str, insert_line
            )

    async def _run(
        self,
        command: str,
        path: str,
        file_text: str | None,
        view_range: list[int] | None,
        old_str: str | None,
        new_str: str | None,
        insert_line: int | None,
    ) -> str:
        sandbox = await self._get_sandbox()
        if sandbox is not self._sandbox:  # a new episode: the old history is another repository's
            self._sandbox, self._history = sandbox, {}
        try:
            target = await self._probe(sandbox, path, command)
            if command == "view":
                return await self._view(sandbox, target, view_range)
            if command == "create":
                if file_text is None:
                    raise _missing("file_text", command)
                await self._write(sandbox, target, file_text)
                self._remember(target.path, file_text)
                return f"File created successfully at: {target.path}"
            if command == "str_replace":
                if old_str is None:
                    raise _missing("old_str", command)
                if new_str == old_str:
                    why = "No replacement was performed. `new_str` and `old_str` must be different."
                    raise _invalid("new_str", new_str, why)
                return await self._replace(sandbox, target, old_str, new_str or "")
            if command == "insert":
                if insert_line is None:
                    raise _missing("insert_line", command)
                if new_str is None:
                    raise _missing("new_str", command)
                return await self._insert(sandbox, target, insert_line, new_str)
            if command == "undo_edit":
                return await self._undo(sandbox, target)
            raise EditorError(
                f"Unrecognized command {command}. The allowed commands for the oh_editor tool "
                f"are: {', '.join(EDITOR_COMMANDS)}"
            )
        except EditorError as exc:
            return f"ERROR:\n{exc}"

    async def _probe(self, sandbox: Sandbox, raw: str, command: str) -> _Target:
        path = str(PurePosixPath(raw))
        if not path.startswith("/"):
            why = "The path should be an absolute path, starting with `/`."
            if self.workspace_root is not None:
                suggested = str(PurePosixPath(self.workspace_root, path))
                if (await self._stat(sandbox, suggested)).kind != "missing":
                    why += f" Maybe you meant {suggested}?"
            raise _invalid("path", path, why)
        target = await self._stat(sandbox, path)
        if command == "create" and target.kind != "missing":
            why = f"File already exists at: {path}. Cannot overwrite files using command `create`."
            raise _invalid("path", path, why)
        if command != "create" and target.kind == "missing":
            raise _invalid(
                "path", path, f"The path {path} does not exist. Please provide a valid path."
            )
        if command != "view" and target.kind == "dir":
            why = f"The path {path} is a directory and only the `view` command can be used on directories."
            raise _invalid("path", path, why)
        if command != "view" and path.lower().endswith(_BINARY_SUFFIXES):
            suffix = PurePosixPath(path).suffix
            why = (
                f"The path {path} points to a binary file ({suffix}) and only the `view` command "
                "can be used on supported binary files."
            )
            raise _invalid("path", path, why)
        return target

    async def _stat(self, sandbox: Sandbox, path: str) -> _Target:
        result = await sandbox.exec(["sh", "-c", _PROBE_SH, "sh", path], timeout=self._timeout)
        lines = result.stdout.split()
        if result.exit_code != 0 or len(lines) not in (2, 3):
            raise EditorError(f"Ran into {result.stderr.strip()} while trying to read {path}")
        size = int(lines[1]) if lines[0] == "file" else 0
        return _Target(path, lines[0], size, lines[-1])

    async def _read(self, sandbox: Sandbox, target: _Target) -> str:
        """The file's text with newlines made ``\\n`` (Python's universal newlines, as the
        anchor reads); refuses files over 10 MB and binary ones with the anchor's messages."""
        if target.size > _MAX_FILE_BYTES:
            why = (
                f"File is too large ({target.size / 1024 / 1024:.1f}MB). Maximum allowed size is "
                f"{_MAX_FILE_BYTES >> 20}MB."
            )
            raise EditorError(f"File validation failed for {target.path}: {why}")
        try:
            data = await sandbox.read_file(target.path, max_bytes=_MAX_FILE_BYTES)
        except SandboxError as exc:
            raise EditorError(f"Ran into {exc} while trying to read {target.path}") from None
        head = data[:1024]
        try:
            if b"\x00" in head or b"\xff" in head or target.path.endswith(".pyc"):
                raise UnicodeDecodeError("utf-8", head, 0, 1, "binary")
            text = data.decode()
        except UnicodeDecodeError:
            why = "File appears to be binary and this file type cannot be read or edited by this tool."
            raise EditorError(f"File validation failed for {target.path}: {why}") from None
        return _universal(text)

    async def _write(self, sandbox: Sandbox, target: _Target, text: str) -> None:
        if target.kind == "missing" and target.parent != "dir":
            errno = (
                "[Errno 2] No such file or directory"
                if target.parent == "missing"
                else ("[Errno 20] Not a directory")
            )
            raise EditorError(
                f"Ran into {errno}: '{target.path}' while trying to write to {target.path}"
            )
        try:
            await sandbox.write_file(target.path, text)
        except SandboxError as exc:
            raise EditorError(f"Ran into {exc} while trying to write to {target.path}") from None

    def _remember(self, path: str, text: str) -> None:
        entries = self._history.setdefault(path, [])
        entries.append(text)
        del entries[:-_HISTORY_PER_FILE]

    async def _view(self, sandbox: Sandbox, target: _Target, view_range: list[int] | None) -> str:
        if target.kind == "dir":
            if view_range:
                why = "The `view_range` parameter is not allowed when `path` points to a directory."
                raise _invalid("view_range", view_range, why)
            return await self._list(sandbox, target.path)
        if target.path.lower().endswith(_BINARY_SUFFIXES):
            raise EditorError(
                "Error in converting file to Markdown: no converter in this sandbox. "
                f"Please use Python code to read {target.path}"
            )
        text = await self._read(sandbox, target)
        if not view_range:
            return numbered(text, target.path, 1)
        lines = _lines(text)
        if len(view_range) != 2:
            raise _invalid("view_range", view_range, "It should be a list of two integers.")
        first, last = view_range
        if not 1 <= first <= len(lines):
            why = (
                f"Its first element `{first}` should be within the range of lines of the file: "
                f"{[1, len(lines)]}."
            )
            raise _invalid("view_range", view_range, why)
        note = ""
        if last == -1:
            last = len(lines)
        elif last > len(lines):
            note = (
                f"NOTE: We only show up to {len(lines)} since there're only {len(lines)} lines "
                "in this file.\n"
            )
            last = len(lines)
        if last < first:
            why = (
                f"Its second element `{last}` should be greater than or equal to the first "
                f"element `{first}`."
            )
            raise _invalid("view_range", view_range, why)
        shown = "\n".join("".join(lines[first - 1 : last]).splitlines())
        return note + numbered(shown, target.path, first)

    async def _list(self, sandbox: Sandbox, path: str) -> str:
        result = await sandbox.exec(
            ["sh", "-c", _LIST_SH, "sh", path],
            timeout=self._timeout,
            max_output_bytes=_LISTING_BYTES,
        )
        listing, hidden, dirs = [*result.stdout.split("\0"), "", ""][:3]
        if result.stderr:
            raise EditorError(clip(result.stderr, _ANY_CLIPPED))
        listing = clip(listing, _DIR_CLIPPED)
        directories = set(dirs.splitlines())
        paths = listing.strip().split("\n") if listing.strip() else []
        entries = [p + "/" if p in directories else p for p in paths]
        text = (
            f"Here's the files and directories up to 2 levels deep in {path}, excluding hidden "
            "items:\n" + "\n".join(entries)
        )
        if int(hidden.strip() or 0):
            text += (
                f"\n\n{int(hidden)} hidden files/directories in this directory are excluded. "
                f"You can use 'ls -la {path}' to see them."
            )
        return text

    async def _replace(self, sandbox: Sandbox, target: _Target, old: str, new: str) -> str:
        text = await self._read(sandbox, target)
        found = [m.start() for m in re.finditer(re.escape(old), text)]
        if not found:  # the anchor retries without the ends' whitespace
            old, new = old.strip(), new.strip()
            found = [m.start() for m in re.finditer(re.escape(old), text)]
            if not found:
                raise EditorError(
                    f"No replacement was performed, old_str `{old}` did not appear verbatim "
                    f"in {target.path}."
                )
        line_of = [text.count("\n", 0, start) + 1 for start in found]
        if len(found) > 1:
            raise EditorError(
                f"No replacement was performed. Multiple occurrences of old_str `{old}` in lines "
                f"{sorted(set(line_of))}. Please ensure it is unique."
            )
        edited = text[: found[0]] + new + text[found[0] + len(old) :]
        await self._write(sandbox, target, edited)
        self._remember(target.path, text)
        first = max(0, line_of[0] - _SNIPPET_LINES)
        last = line_of[0] + _SNIPPET_LINES + new.count("\n")
        snippet = "".join(_lines(_universal(edited))[first:last])
        return (
            f"The file {target.path} has been edited. "
            + numbered(snippet, f"a snippet of {target.path}", first + 1)
            + "Review the changes and make sure they are as expected. Edit the file again if "
            "necessary."
        )

    async def _insert(self, sandbox: Sandbox, target: _Target, after: int, new: str) -> str:
        text = await self._read(sandbox, target)
        lines = _lines(text)
        if not 0 <= after <= len(lines):
            why = f"It should be within the range of allowed values: {[0, len(lines)]}"
            raise _invalid("insert_line", after, why)
        added = [line + "\n" for line in new.split("\n")]
        edited = "".join(lines[:after] + added + lines[after:])
        await self._write(sandbox, target, edited)
        first = max(0, after - _SNIPPET_LINES)
        last = min(len(lines) + len(added), after + _SNIPPET_LINES + len(added))
        snippet = "".join(_lines(_universal(edited))[first:last])
        self._remember(target.path, text)
        return (
            f"The file {target.path} has been edited. "
            + numbered(snippet, "a snippet of the edited file", max(1, after - _SNIPPET_LINES + 1))
            + "Review the changes and make sure they are as expected (correct indentation, no "
            "duplicate lines, etc). Edit the file again if necessary."
        )

    async def _undo(self, sandbox: Sandbox, target: _Target) -> str:
        await self._read(sandbox, target)
        entries = self._history.get(target.path)
        if not entries:
            raise EditorError(f"No edit history found for {target.path}.")
        previous = entries.pop()
        await self._write(sandbox, target, previous)
        shown = numbered(previous, target.path, 1)
        return f"Last edit to {target.path} undone successfully. {shown}"


def clip(text: str, notice: str = _ANY_CLIPPED) -> str:
    """``text`` cut after :data:`MAX_RESPONSE_CHARS` characters with ``notice`` (the head only,
    as openhands-aci clips)."""
    return text if len(text) <= MAX_RESPONSE_CHARS else text[:MAX_RESPONSE_CHARS] + notice


def numbered(text: str, description: str, first: int) -> str:
    """The anchor's ``cat -n`` view of ``text`` (clipped first), numbered from ``first``."""
    body = "\n".join(
        f"{number:6}\t{line}"
        for number, line in enumerate(clip(text, _FILE_CLIPPED).split("\n"), first)
    )
    return f"Here's the result of running `cat -n` on {description}:\n{body}\n"


def _lines(text: str) -> list[str]:
    """``text`` split after each ``\\n`` (as iterating over a text file does)."""
    parts = text.split("\n")
    return [part + "\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _universal(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _missing(parameter: str, command: str) -> EditorError:
    return EditorError(f"Parameter `{parameter}` is required for command: {command}.")


def _invalid(parameter: str, value: object, hint: str) -> EditorError:
    return EditorError(f"Invalid `{parameter}` parameter: {value}. {hint}")
