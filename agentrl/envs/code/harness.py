"""The test harness that runs inside a grading sandbox (stdlib only, Python 3.10+).

Started as ``python3 -I -u -c <this source> judge`` with one JSON object on stdin:
``{"nonce", "program", "prompt", "test", "entry_point"}``. It exits 0 and prints the nonce
only when the problem's ``check(candidate)`` returned; on a failure it writes a short report to
stderr and exits 1; :data:`HARNESS_FAILED` means the harness itself could not start.

Two processes, so that the solution never runs in the process that judges it:

* The **judge** (this process) first makes itself non-dumpable, so that no other process of the
  same uid can read its memory or reopen its file descriptors through ``/proc``; then it reads
  the request and closes stdin, starts the solution process, runs the problem's own ``prompt``
  (for helpers the tests use, such as ``poly``) and ``test`` code, and calls
  ``check(candidate)`` where ``candidate`` forwards each call to the solution process. The nonce
  reaches stdout only after ``check`` returned.
* The **solution process** (``... solution REQUEST_FD REPLY_FD``) runs ``program`` as a module
  named ``solution`` (so an ``if __name__ == "__main__":`` block does not run), then answers
  calls of ``entry_point``. Its stdout and stderr go to a file whose tail the judge adds to a
  failure report; it never holds the nonce, nor a descriptor of the judge's stdout.

Arguments and results cross the pipes as tagged JSON (:func:`encode`, :func:`decode`) of built-in
values only: None, bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset.
The judge rebuilds plain built-ins, so an object with a rigged ``__eq__`` cannot reach the tests.

Where this differs from HumanEval's own harness (one process running prompt, completion and test):
the function receives copies of its arguments (so a test could not observe an in-place change;
no HumanEval test needs to), must return a built-in value, and the tests call the prompt's helpers
even when the solution redefines them. All 164 canonical solutions pass (``tests/envs/code``).
"""

import json
import linecache
import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

HARNESS_FAILED = 3
"""Exit status when the harness could not set itself up (an infrastructure failure)."""

PROMPT_FILE = "prompt.py"
TEST_FILE = "test.py"
SOLUTION_FILE = "solution.py"
_PR_SET_DUMPABLE = 4
_MAX_FRAMES = 8  # traceback frames kept per report
_MAX_REPR = 300  # characters of an argument or result repr in a report
_MAX_PRINTED = 1000  # characters of the solution's output in a report
_MAX_REPORT = 8000  # characters of a whole report, well under the sandbox's output cap

_TAGS: dict[str, Callable[[Any], Any]] = {
    "tuple": lambda items: tuple(decode(item) for item in items),
    "set": lambda items: {decode(item) for item in items},
    "frozenset": lambda items: frozenset(decode(item) for item in items),
    "dict": lambda items: {decode(key): decode(value) for key, value in items},
    "bytes": bytes.fromhex,
    "complex": lambda parts: complex(float(parts[0]), float(parts[1])),
}


def encode(value):
    """``value`` as JSON-ready data: JSON arrays are lists, and a one-key JSON object tags every
    other container. Raises TypeError for anything that is not a built-in value."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [encode(item) for item in value]
    if isinstance(value, tuple):
        return {"tuple": [encode(item) for item in value]}
    if isinstance(value, dict):
        return {"dict": [[encode(key), encode(item)] for key, item in value.items()]}
    if isinstance(value, (set, frozenset)):
        tag = "frozenset" if isinstance(value, frozenset) else "set"
        return {tag: [encode(item) for item in value]}
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, complex):
        return {"complex": [value.real, value.imag]}
    raise TypeError(
        f"an object of type {type(value).__name__} cannot be passed between the tests and the solution "
        "(use None, bool, int, float, complex, str, bytes, list, tuple, dict, set or frozenset)"
    )


def decode(data):
    """The plain built-in value that :func:`encode` gave ``data`` for (never a subclass)."""
    if data is None or isinstance(data, (bool, int, float, str)):
        return data  # json.loads makes plain built-ins
    if isinstance(data, list):
        return [decode(item) for item in data]
    if isinstance(data, dict) and len(data) == 1:
        ((tag, items),) = data.items()
        if tag in _TAGS:
            return _TAGS[tag](items)
    raise ValueError(f"malformed value from the solution process: {str(data)[:_MAX_REPR]}")


def report(exc, files):
    """A traceback of ``exc`` showing only the frames of ``files``, and the exception."""
    frames = [frame for frame in traceback.extract_tb(exc.__traceback__) if frame.filename in files]
    lines = traceback.format_list(frames[-_MAX_FRAMES:])
    if isinstance(exc, SolutionFailed):
        return "".join(lines) + f"{exc}\n"
    return "".join(lines + traceback.format_exception_only(type(exc), exc))


def _short(value):
    return _clip(repr(value), _MAX_REPR)


def _clip(text, limit):
    """``text``, or its start and end around a ``[...]`` when longer than ``limit``."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[...]\n{text[-half:]}"


def _register(source, filename):
    """Let tracebacks show the lines of ``source`` under ``filename``."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return compile(source, filename, "exec")


class SolutionFailed(Exception):
    """The solution process failed to load, raised in a call, or died."""


class SolutionProcess:
    """The judge's side of the solution process: start it, load the program, call the function."""

    def __init__(self, entry_point):
        request_read, request_write = os.pipe()
        reply_read, reply_write = os.pipe()
        fds = [str(request_read), str(reply_write)]
        self.output = tempfile.TemporaryFile()  # noqa: SIM115  (lives as long as the process)
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-u", "-c", _own_source(), "solution", *fds],
            stdin=subprocess.DEVNULL,
            stdout=self.output,
            stderr=subprocess.STDOUT,
            pass_fds=(request_read, reply_write),
        )
        os.close(request_read)
        os.close(reply_write)
        self._requests = os.fdopen(request_write, "w")
        self._replies = os.fdopen(reply_read, "r")
        self.entry_point = entry_point
        self.last_call = None

    def load(self, program):
        """Run ``program`` in the solution process; raises :class:`SolutionFailed` if it fails."""
        self._ask({"program": program, "entry_point": self.entry_point}, "loading the solution")

    def __call__(self, *args, **kwargs):
        shown = ", ".join(
            [_short(arg) for arg in args] + [f"{k}={_short(v)}" for k, v in kwargs.items()]
        )
        call = f"{self.entry_point}({shown})"
        self.last_call = (call, None)
        request = {"args": encode(list(args)), "kwargs": encode(kwargs)}
        result = decode(self._ask(request, f"calling {call}"))
        self.last_call = (call, result)
        return result

    def _ask(self, request, doing):
        try:
            self._requests.write(json.dumps(request) + "\n")
            self._requests.flush()
            line = self._replies.readline()
        except OSError:
            line = ""
        if not line:
            code = self.process.wait()
            how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
            raise SolutionFailed(f"the solution process {how} while {doing}")
        reply = json.loads(line)
        if "error" in reply:
            raise SolutionFailed(
                f"the solution raised an exception while {doing}:\n{reply['error']}"
            )
        return reply["value"]

    def printed(self):
        """The end of what the solution process wrote to stdout and stderr."""
        self.output.seek(0, os.SEEK_END)
        self.output.seek(max(self.output.tell() - 4 * _MAX_PRINTED, 0))
        return self.output.read().decode(errors="replace")[-_MAX_PRINTED:]

    def kill(self):
        self.process.kill()
        self.process.wait()


def _own_source():
    argv = sys.orig_argv
    if "-c" in argv:
        return argv[argv.index("-c") + 1]
    with open(__file__) as handle:
        return handle.read()


def _make_undumpable():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def judge():
    try:
        _make_undumpable()
        request = json.loads(sys.stdin.buffer.read())
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # the request pipe is gone, and fd 0 stays taken (pipes must not get it)
        os.close(null)
        nonce, entry_point = request["nonce"], request["entry_point"]
        prompt = _register(request["prompt"], PROMPT_FILE)
        test = _register(request["test"], TEST_FILE)
    except Exception as exc:
        print(f"harness error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return HARNESS_FAILED
    solution = None
    try:
        solution = SolutionProcess(entry_point)
        solution.load(request["program"])
        namespace = {"__name__": "humaneval"}
        exec(prompt, namespace)
        namespace[entry_point] = solution
        exec(test, namespace)
        namespace["check"](solution)
    except BaseException as exc:
        text = f"The tests failed:\n{report(exc, (PROMPT_FILE, TEST_FILE))}"
        if isinstance(exc, AssertionError) and solution is not None and solution.last_call:
            call, result = solution.last_call
            text += f"The last call was {call}, which returned {_short(result)}.\n"
        printed = solution.printed() if solution is not None else ""
        if printed:
            text = f"The solution printed:\n{printed.rstrip()}\n{text}"
        print(_clip(text, _MAX_REPORT), end="", file=sys.stderr)
        return 1
    finally:
        if solution is not None:
            solution.kill()
    print(nonce)
    return 0


def serve(request_fd, reply_fd):
    """The solution process: load the program, then answer one call per request line."""
    requests = os.fdopen(request_fd, "r")
    replies = os.fdopen(reply_fd, "w")
    os.set_inheritable(request_fd, False)
    os.set_inheritable(reply_fd, False)

    def reply(**message):
        replies.write(json.dumps(message) + "\n")
        replies.flush()

    load = json.loads(requests.readline())
    namespace = {"__name__": "solution"}
    try:
        exec(_register(load["program"], SOLUTION_FILE), namespace)
        function = namespace.get(load["entry_point"])
        if not callable(function):
            raise NameError(f"the solution does not define the function {load['entry_point']}()")
    except BaseException as exc:
        reply(error=report(exc, (SOLUTION_FILE,)))
        return
    reply(value=None)
    for line in requests:
        call = json.loads(line)
        try:
            value = function(*decode(call["args"]), **decode(call["kwargs"]))
            line = json.dumps({"value": encode(value)})
        except BaseException as exc:
            line = json.dumps({"error": report(exc, (SOLUTION_FILE,))})
        replies.write(line + "\n")
        replies.flush()


def main(argv):
    if argv[:1] == ["judge"]:
        return judge()
    if argv[:1] == ["solution"] and len(argv) == 3:
        serve(int(argv[1]), int(argv[2]))
        return 0
    print("usage: harness.py judge | solution REQUEST_FD REPLY_FD", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
