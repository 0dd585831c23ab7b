"""What the gateway tests share: a calculator tool, few-shot conversations SmolLM2 answers with a
tool call under greedy decoding, and server processes on loopback."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentrl.engine_pool.sglang_engine import free_port

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
SYSTEM = {"role": "system", "content": "You are a calculator. Always call the add tool."}


def few_shot(question: str = "What is 2 plus 3?") -> list[dict[str, Any]]:
    """Three solved examples in OpenAI's format (tool calls, tool results), then ``question``:
    SmolLM2 answers it with an ``add`` call when decoding greedily."""
    messages: list[dict[str, Any]] = [SYSTEM]
    for i, (a, b) in enumerate([(1, 2), (4, 5), (7, 1)]):
        call = {
            "id": f"call_example_{i}",
            "type": "function",
            "function": {"name": "add", "arguments": json.dumps({"a": a, "b": b})},
        }
        messages += [
            {"role": "user", "content": f"What is {a} plus {b}?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": str(a + b)},
            {"role": "assistant", "content": f"The answer is {a + b}."},
        ]
    return [*messages, {"role": "user", "content": question}]


def get_json(url: str) -> tuple[int, Any]:
    """GET ``url``: (status, parsed body), also for error statuses."""
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def post_json(url: str, body: Any) -> Any:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)


@contextlib.contextmanager
def agentrl_process(args: list[str], log: Path, port: int | None = None) -> Iterator[str]:
    """``python -m agentrl.cli ARGS --port P`` until exit (``port``, else a free one); yields its
    URL once /v1/models answers."""
    port = port or free_port()
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "agentrl.cli", *args, "--port", str(port)],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"{args[0]} did not start:\n{log.read_text()}"
            with contextlib.suppress(OSError):
                if get_json(f"{url}/v1/models")[0] == 200:
                    break
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        process.wait(30)
