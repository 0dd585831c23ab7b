"""Agent tools that act inside a sandbox: ``python``, ``bash`` and file ``view``/``create_file``/``str_replace``.

``bash`` output over the cap keeps its head and its tail (a test summary comes last) with
:data:`CLIP_MARKER` between them; a command killed by its timeout shows the head it had printed.

``sandbox_tools(get_sandbox)`` builds them around ``get_sandbox``, an ``async () -> Sandbox``
callable that returns the episode's sandbox (started on first use, so an episode that never calls
a tool never starts one). All five share that sandbox: a file written by ``create_file`` is what
``python`` and ``bash`` see, and ``python`` keeps its variables across calls until the interpreter
times out. Results are plain text for the model; a refused request (missing file, ambiguous
replacement) raises, which :class:`~agentrl.tools.ToolSet` turns into an ``Error: ...`` message.
"""

from __future__ import annotations

import shlex
from collections.abc import Awaitable, Callable

from agentrl.tools.sandbox import DEFAULT_MAX_OUTPUT_BYTES, ExecResult, Sandbox, SandboxError
from agentrl.tools.tool import Tool

SandboxGetter = Callable[[], Awaitable[Sandbox]]

_SNIPPET_LINES = 4  # context lines shown around an edit
CLIP_MARKER = "\n[... Observation truncated due to length ...]\n"
"""Stands where ``bash`` output lost its middle (OpenHands' marker for command output)."""
# Runs the command (argv[3:]) and passes each of its streams through: the first half of the
# limit as it comes, the last half at the end, CLIP_MARKER between them when bytes were dropped.
# Once the command exits, pipes that its background children hold get 1 s more (as the agent
# gives). The exit status is the command's (a signal is raised again).
_CLIP_PY = """import os, selectors, signal, subprocess, sys, time
half, marker = int(sys.argv[1]) // 2, sys.argv[2].encode()
child = subprocess.Popen(sys.argv[3:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
streams = {child.stdout: [sys.stdout.buffer, 0, bytearray(), False],
           child.stderr: [sys.stderr.buffer, 0, bytearray(), False]}
selector = selectors.DefaultSelector()
for pipe in streams:
    selector.register(pipe, selectors.EVENT_READ)
deadline = None
while selector.get_map():
    if deadline is None and child.poll() is not None:
        deadline = time.monotonic() + 1.0
    wait = 0.1 if deadline is None else deadline - time.monotonic()
    if wait <= 0:
        break
    for key, _ in selector.select(wait):
        chunk, state = os.read(key.fd, 1 << 16), streams[key.fileobj]
        if not chunk:
            selector.unregister(key.fileobj)
            continue
        head = chunk[: max(half - state[1], 0)]
        state[0].write(head)
        state[0].flush()
        state[1] += len(head)
        state[2] += chunk[len(head):]
        if len(state[2]) > half:
            del state[2][: len(state[2]) - half]
            state[3] = True
for out, _, tail, cut in streams.values():
    out.write((marker if cut else b"") + bytes(tail))
    out.flush()
code = child.wait()
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
"""
_MAX_TEXT_BYTES = 4 << 20  # larger files are refused by view and str_replace, never half-edited


def sandbox_tools(
    get_sandbox: SandboxGetter,
    *,
    timeout: float = 30.0,
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    names: tuple[str, ...] = ("python", "bash", "view", "create_file", "str_replace"),
    workdir: str | None = None,
) -> list[Tool]:
    """The tools named in ``names`` (default: all five), each running in ``await get_sandbox()``.

    ``workdir`` (absolute) is where ``bash`` starts and what relative file paths resolve against;
    default: the sandbox's own work directory.
    """
    if workdir is not None and not workdir.startswith("/"):
        raise ValueError(f"workdir must be an absolute path, got {workdir!r}")
    enter = f"cd {shlex.quote(workdir)} || exit 1\n" if workdir else ""

    def where(path: str) -> str:
        return path if workdir is None or path.startswith("/") else f"{workdir}/{path}"

    limits = f"Time limit: {timeout:g} s; output is cut after {max_output_bytes} bytes per stream."
    bash_limits = (
        f"Time limit: {timeout:g} s; output longer than {max_output_bytes} bytes per stream keeps "
        "its first and last halves."
    )

    async def python(code: str) -> str:
        """Run Python code in a persistent interpreter and return what it printed.

        Args:
            code: Python statements. Variables, imports and functions persist across calls; the
                value of a final expression is printed.
        """
        sandbox = await get_sandbox()
        result = await sandbox.run_python(code, timeout=timeout, max_output_bytes=max_output_bytes)
        return result_text(result, timeout=timeout, max_output_bytes=max_output_bytes)

    async def bash(command: str) -> str:
        """Run a bash command in the work directory and return its output and exit code.

        Args:
            command: The command line, e.g. `ls -la` or `python3 solution.py`.
        """
        sandbox = await get_sandbox()
        clipped = ["python3", "-I", "-c", _CLIP_PY, str(max_output_bytes), CLIP_MARKER]
        result = await sandbox.exec(
            [*clipped, "bash", "-c", enter + command],
            timeout=timeout,
            max_output_bytes=max_output_bytes + len(CLIP_MARKER) + 8,
        )
        return result_text(result, timeout=timeout, max_output_bytes=max_output_bytes)

    async def view(path: str, start_line: int = 1, end_line: int = -1) -> str:
        """Show a text file with line numbers.

        Args:
            path: File path, relative to the work directory or absolute.
            start_line: First line to show (1-based).
            end_line: Last line to show; -1 means the end of the file.
        """
        lines = await _read_lines(await get_sandbox(), where(path))
        last = len(lines) if end_line == -1 else min(end_line, len(lines))
        if start_line < 1 or last < start_line - 1:
            raise SandboxError(
                f"{path} has {len(lines)} lines; cannot show {start_line}..{end_line}"
            )
        return _numbered(lines, start_line, last) or f"({path} is empty)"

    async def create_file(path: str, content: str) -> str:
        """Create a file, or overwrite it, with the given content.

        Args:
            path: File path, relative to the work directory or absolute.
            content: The complete file content.
        """
        await (await get_sandbox()).write_file(where(path), content)
        return f"Wrote {len(content.splitlines())} lines to {path}."

    async def str_replace(path: str, old: str, new: str) -> str:
        """Replace one exact occurrence of a piece of text in a file.

        Args:
            path: File path, relative to the work directory or absolute.
            old: The exact text to replace; it must occur exactly once in the file.
            new: The replacement text.
        """
        sandbox = await get_sandbox()
        text = "".join(await _read_lines(sandbox, where(path)))
        count = text.count(old) if old else 0
        if count != 1:
            problem = "is empty" if not old else f"occurs {count} times in {path}"
            raise SandboxError(f"`old` {problem}; it must occur exactly once (add context lines)")
        start = text[: text.index(old)].count("\n") + 1
        text = text.replace(old, new, 1)
        await sandbox.write_file(where(path), text)
        lines = text.splitlines(keepends=True)
        first = max(start - _SNIPPET_LINES, 1)
        last = min(start + new.count("\n") + _SNIPPET_LINES, len(lines))
        return f"Edited {path}. Lines {first}-{last} now read:\n{_numbered(lines, first, last)}"

    descriptions = {
        "python": f"Run Python in a persistent interpreter inside the sandbox. {limits}",
        "bash": f"Run a bash command inside the sandbox (no network). {bash_limits}",
    }
    tools = {
        fn.__name__: Tool.from_function(fn, description=descriptions.get(fn.__name__))
        for fn in (python, bash, view, create_file, str_replace)
    }
    unknown = set(names) - set(tools)
    if unknown:
        raise ValueError(f"unknown sandbox tools {sorted(unknown)}; choose from {sorted(tools)}")
    return [tools[name] for name in names]


def result_text(result: ExecResult, *, timeout: float, max_output_bytes: int) -> str:
    """A run's stdout, then stderr, then one line per condition, for the model to read.

    The conditions: ``[exit code N]`` when non-zero, ``[timed out after N s]``, ``[the Python
    interpreter was restarted: earlier variables are gone]`` and ``[output truncated to N bytes]``.
    A silent successful run gives ``""``.
    """
    notes = []
    if result.timed_out:
        notes.append(f"[timed out after {timeout:g} s]")
    elif result.exit_code:
        notes.append(f"[exit code {result.exit_code}]")
    if result.restarted:
        notes.append("[the Python interpreter was restarted: earlier variables are gone]")
    if result.truncated:
        notes.append(f"[output truncated to {max_output_bytes} bytes]")
    text = ""
    for section in (result.stdout, result.stderr, *notes):
        if section:
            text += section if not text or text.endswith("\n") else "\n" + section
    return text


async def _read_lines(sandbox: Sandbox, path: str) -> list[str]:
    data = await sandbox.read_file(path, max_bytes=_MAX_TEXT_BYTES + 1)
    if len(data) > _MAX_TEXT_BYTES:
        raise SandboxError(f"{path} is larger than {_MAX_TEXT_BYTES} bytes; use bash to inspect it")
    try:
        return data.decode().splitlines(keepends=True)
    except UnicodeDecodeError:
        raise SandboxError(f"{path} is not a UTF-8 text file") from None


def _numbered(lines: list[str], first: int, last: int) -> str:
    width = len(str(last))
    return "".join(
        f"{number:>{width}}\t{lines[number - 1].rstrip(chr(10))}\n"
        for number in range(first, last + 1)
    )
