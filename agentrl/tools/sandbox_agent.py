"""The program that runs inside every sandbox and answers the host's requests (stdlib, Python 3.10+).

It is started as the sandbox's first process (``python3 -I -u -c <this source> MAX_FILE_BYTES``;
it lowers ``RLIMIT_FSIZE`` to that for itself and all it runs) and speaks one
JSON object per line: requests on its stdin, replies on its stdout. Keeping one process alive for
the whole episode is what makes a tool call cost milliseconds instead of a new ``exec``.

Request: ``{"id": int, "op": str, ...}``. Reply: ``{"id": int, "ok": true, "result": {...}}`` or
``{"id": int, "ok": false, "error": str}``. Requests run concurrently, one thread each.

* ``exec`` ``{cmd: str | [str], timeout, stdin: str | null, max_output}``: runs ``cmd`` (a string
  goes to ``/bin/sh -c``) in its own session; at exit or timeout its whole process group is killed.
  Result: ``exit_code`` (negative: killed by that signal; null on timeout), ``stdout``,
  ``stderr`` (each cut at ``max_output`` bytes), ``timed_out``, ``truncated``, ``duration_s``.
* ``python`` ``{code, timeout, max_output}``: runs ``code`` in one persistent interpreter (a child
  process, so a timeout can kill it without killing the agent); globals persist across calls. The
  value of a trailing expression is printed, as in a REPL. Same result, plus ``restarted`` when the
  interpreter died or was killed (its state is then gone).
* ``write_file`` ``{path, data (base64)}`` creates parent directories; ``read_file`` ``{path,
  max_bytes}`` returns ``data`` (base64), ``size`` and ``truncated``; ``ping`` returns ``pid``.

On EOF on stdin every child process group is killed and the agent exits.
"""

import base64
import contextlib
import ctypes
import json
import os
import resource
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time

WORKDIR = os.getcwd()
_PR_SET_DUMPABLE = 4
_write_lock = threading.Lock()
_python_lock = threading.Lock()
_children: set[int] = set()  # pids of live process-group leaders
_children_lock = threading.Lock()

# The persistent interpreter. Requests arrive on fd argv[1], replies leave on fd argv[2]; its own
# stdin is /dev/null and fds 1/2 point at per-call output files, so nothing user code prints or
# reads can touch the control channel.
_WORKER = r"""
import ast, json, os, sys, traceback
requests = os.fdopen(int(sys.argv[1]), "r")
replies = os.fdopen(int(sys.argv[2]), "w")
os.set_inheritable(requests.fileno(), False)
os.set_inheritable(replies.fileno(), False)
sys.path.insert(0, os.getcwd())  # modules in the work directory import, as in a REPL
namespace = {"__name__": "__main__", "__builtins__": __builtins__}
for line in requests:
    request = json.loads(line)
    for fd, path in ((1, request["out"]), (2, request["err"])):
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(handle, fd)
        os.close(handle)
    exit_code = 0
    try:
        tree = ast.parse(request["code"], "<python>")
        tail = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, "<python>", "exec"), namespace)
        if tail is not None:
            value = eval(compile(ast.Expression(tail.value), "<python>", "eval"), namespace)
            if value is not None:
                print(repr(value))
    except SystemExit as exc:
        exit_code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        exit_code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    replies.write(json.dumps({"exit_code": exit_code}) + "\n")
    replies.flush()
"""


def _reply(message):
    data = (json.dumps(message) + "\n").encode()
    with _write_lock:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()


def _kill_group(pid):
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _drain(stream, limit, sink):
    """Read ``stream`` to EOF, keeping the first ``limit`` bytes in ``sink[0]``; flag the rest."""
    while True:
        chunk = stream.read(65536)
        if not chunk:
            break
        room = limit - len(sink[0])
        if len(chunk) > room:
            sink[1] = True
        if room > 0:
            sink[0] += chunk[:room]


def _text(data):
    return bytes(data).decode("utf-8", errors="replace")


def op_exec(request):
    started = time.monotonic()
    cmd = request["cmd"]
    argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
    stdin = request.get("stdin")
    limit = int(request["max_output"])
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=WORKDIR,
        start_new_session=True,
    )
    with _children_lock:
        _children.add(process.pid)
    sinks = ([bytearray(), False], [bytearray(), False])
    threads = [
        threading.Thread(target=_drain, args=(pipe, limit, sink), daemon=True)
        for pipe, sink in zip((process.stdout, process.stderr), sinks, strict=True)
    ]
    if stdin is not None:
        threads.append(threading.Thread(target=_feed, args=(process.stdin, stdin), daemon=True))
    for thread in threads:
        thread.start()
    timed_out = False
    try:
        process.wait(timeout=float(request["timeout"]))
    except subprocess.TimeoutExpired:
        timed_out = True
    _kill_group(process.pid)  # the command's leftovers die with it
    process.wait()
    with _children_lock:
        _children.discard(process.pid)
    deadline = time.monotonic() + 1.0  # escaped processes may still hold the pipes
    for thread in threads:
        thread.join(max(deadline - time.monotonic(), 0))
    return {
        "exit_code": None if timed_out else process.returncode,
        "stdout": _text(sinks[0][0]),
        "stderr": _text(sinks[1][0]),
        "timed_out": timed_out,
        "truncated": sinks[0][1] or sinks[1][1],
        "duration_s": time.monotonic() - started,
    }


def _feed(pipe, text):
    try:
        pipe.write(text.encode("utf-8", errors="surrogatepass"))
        pipe.close()
    except OSError:
        pass


class _Interpreter:
    """The persistent Python child process and its two control pipes."""

    def __init__(self):
        request_read, self.request_write = os.pipe()
        self.reply_read, reply_write = os.pipe()
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-u", "-c", _WORKER, str(request_read), str(reply_write)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(request_read, reply_write),
            cwd=WORKDIR,
            start_new_session=True,
        )
        os.close(request_read)
        os.close(reply_write)
        with _children_lock:
            _children.add(self.process.pid)

    def run(self, code, out, err, timeout):
        """Return the worker's reply exit code, or None after ``timeout`` or if the worker died
        (``self.timed_out`` tells which)."""
        line = json.dumps({"code": code, "out": out, "err": err}) + "\n"
        self.timed_out = False
        try:
            os.write(self.request_write, line.encode("utf-8", errors="surrogatepass"))
        except OSError:
            return None
        deadline = time.monotonic() + timeout
        reply = b""
        while not reply.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.reply_read], [], [], remaining)[0]:
                self.timed_out = True
                return None
            chunk = os.read(self.reply_read, 4096)
            if not chunk:
                return None
            reply += chunk
        return json.loads(reply)["exit_code"]

    def kill(self):
        _kill_group(self.process.pid)
        self.process.wait()
        with _children_lock:
            _children.discard(self.process.pid)
        os.close(self.request_write)
        os.close(self.reply_read)


_interpreter = [None]


def op_python(request):
    started = time.monotonic()
    limit = int(request["max_output"])
    with _python_lock, tempfile.TemporaryDirectory(prefix="agentrl-python-") as scratch:
        out, err = os.path.join(scratch, "out"), os.path.join(scratch, "err")
        if _interpreter[0] is None:
            _interpreter[0] = _Interpreter()
        interpreter = _interpreter[0]
        exit_code = interpreter.run(request["code"], out, err, float(request["timeout"]))
        restarted = exit_code is None
        timed_out = interpreter.timed_out
        if restarted:
            interpreter.kill()
            _interpreter[0] = None
            if not timed_out:
                exit_code = interpreter.process.returncode
        outputs = []
        for path in (out, err):
            try:
                with open(path, "rb") as handle:
                    data = handle.read(limit + 1)
            except OSError:
                data = b""
            outputs.append(data)
    return {
        "exit_code": exit_code,
        "stdout": _text(outputs[0][:limit]),
        "stderr": _text(outputs[1][:limit]),
        "timed_out": timed_out,
        "truncated": any(len(data) > limit for data in outputs),
        "duration_s": time.monotonic() - started,
        "restarted": restarted,
    }


def op_write_file(request):
    path = os.path.join(WORKDIR, request["path"])
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    data = base64.b64decode(request["data"])
    with open(path, "wb") as handle:
        handle.write(data)
    return {"bytes": len(data)}


def op_read_file(request):
    path = os.path.join(WORKDIR, request["path"])
    limit = int(request["max_bytes"])
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        data = handle.read(limit + 1)
    return {
        "data": base64.b64encode(data[:limit]).decode(),
        "size": max(size, len(data)),
        "truncated": len(data) > limit,
    }


def op_ping(request):
    return {"pid": os.getpid()}


OPS = {
    "exec": op_exec,
    "python": op_python,
    "write_file": op_write_file,
    "read_file": op_read_file,
    "ping": op_ping,
}


def _handle(request):
    try:
        result = OPS[request["op"]](request)
    except Exception as exc:
        _reply({"id": request.get("id"), "ok": False, "error": f"{type(exc).__name__}: {exc}"})
    else:
        _reply({"id": request["id"], "ok": True, "result": result})


def main():
    # Not dumpable: code in the box runs as the same uid, but can then neither read this
    # process's memory through /proc nor ptrace it (programs it starts are dumpable again: exec
    # resets the flag). The grader relies on this to keep its nonce secret.
    ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, 0)
    if len(sys.argv) > 1:
        max_file_bytes = int(sys.argv[1])
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))
    for line in sys.stdin.buffer:
        try:
            request = json.loads(line)
        except ValueError as exc:
            _reply({"id": None, "ok": False, "error": f"bad request: {exc}"})
            continue
        if not isinstance(request, dict) or request.get("op") not in OPS:
            op = request.get("op") if isinstance(request, dict) else None
            request_id = request.get("id") if isinstance(request, dict) else None
            _reply({"id": request_id, "ok": False, "error": f"unknown op {op!r}"})
            continue
        threading.Thread(target=_handle, args=(request,), daemon=True).start()
    with _children_lock:
        for pid in list(_children):
            _kill_group(pid)


if __name__ == "__main__":
    main()
