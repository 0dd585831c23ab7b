"""The agent the trainer calls (``agent.entry=tests/rollout/langchain_bridge.py:solve``): it runs
the LangChain agent of ``langchain_side.py`` unchanged in ``.venv-langchain``, its ``ChatOpenAI``
pointed at this episode's session, and returns the agent's final answer for the environment to
grade. With ``LANGCHAIN_AGENT_LOG`` set, each episode's report is appended to that file."""

import asyncio
import json
import os
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SIDE_PYTHON = ROOT / ".venv-langchain" / "bin" / "python"
SIDE = Path(__file__).with_name("langchain_side.py")


async def run_langchain(base_url: str, model: str, messages: list[dict[str, Any]]) -> dict:
    """Run the LangChain agent on ``messages`` against ``base_url``; its JSON report."""
    process = await asyncio.create_subprocess_exec(
        str(SIDE_PYTHON),
        str(SIDE),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    request = {"base_url": base_url, "model": model, "messages": messages}
    out, err = await process.communicate(json.dumps(request).encode())
    if process.returncode:
        raise RuntimeError(f"the LangChain agent failed: {err.decode()[-3000:]}")
    return json.loads(out.decode().strip().splitlines()[-1])


async def solve(task, client) -> str:
    report = await run_langchain(str(client.base_url), task.model, task.messages)
    if log := os.environ.get("LANGCHAIN_AGENT_LOG"):
        with open(log, "a") as file:
            file.write(json.dumps(report) + "\n")
    return report["answer"]
