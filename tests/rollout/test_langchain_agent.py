"""A real agent framework, run unchanged: a LangChain agent (ChatOpenAI with bind_tools, in
``.venv-langchain``: scripts/setup-langchain-env) against the endpoint a training run serves, its
tool call and tool result recorded token-exactly, and trained for a step by ``agentrl train``."""

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium
import pytest

import agentrl  # noqa: F401  (registers environments)
from agentrl.rollout.agent import AgentRunner
from agentrl.rollout.runner import RolloutTask
from agentrl.tokenization import SegmentKind

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT / "tests" / "engine_pool" / "gateway"))

from gateway_helpers import few_shot  # noqa: E402
from langchain_bridge import SIDE_PYTHON, run_langchain  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def side_venv():
    """LangChain's interpreter; missing, the tests fail (CI must not skip them)."""
    if not (SIDE_PYTHON.parents[1] / ".langchain-env-installed").exists():
        pytest.fail("the LangChain venv is missing: run scripts/setup-langchain-env")


async def test_a_langchain_tool_loop_is_recorded_token_exactly(engine, tokenizer):
    reports = []

    async def langchain_agent(task, client):  # few-shot: greedy SmolLM2 then calls `add`
        reports.append(await run_langchain(str(client.base_url), task.model, few_shot()))
        return 1.0

    make_env = lambda: gymnasium.make("agentrl/Math-v0")  # noqa: E731
    async with AgentRunner(
        langchain_agent, make_env, engine, tokenizer, temperature=0.0, max_new_tokens=48
    ) as agents:
        trajectory = await agents.run(RolloutTask(0, 0, 0))
    (report,) = reports
    assert trajectory.judged and trajectory.reward == 1.0, trajectory.error
    assert report["tool_calls"] >= 1 and report["tool_results"][0] == "5", report
    # every LangChain call extended one segment: its tool result went in as a delta, mask 0
    assert agents.segments_dropped == 0 and len(trajectory.turns) == report["calls"]
    tokens = trajectory.tokens
    completions = [s for s in tokens.segments if s.kind is SegmentKind.COMPLETION]
    assert len(completions) == report["calls"]
    assert sum(tokens.loss_mask) == trajectory.completion_tokens
    tool_turns = [m for m in trajectory.messages if m["role"] == "tool"]
    assert [m["content"] for m in tool_turns][-len(report["tool_results"]) :] == report[
        "tool_results"
    ]


@pytest.mark.timeout(600)
def test_a_langchain_agent_trains_for_a_step(tmp_path):
    command = [
        sys.executable,
        "-m",
        "agentrl.cli",
        "train",
        str(ROOT / "examples" / "math_agent_grpo_cpu.yaml"),
        "agent.entry=tests/rollout/langchain_bridge.py:solve",
        f"trainer.output_dir={tmp_path}",
        "trainer.steps=1",
        "trainer.export_hf=false",
        "rollout.groups_per_step=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=48",
    ]
    log = tmp_path / "langchain.jsonl"
    env = {**os.environ, "LANGCHAIN_AGENT_LOG": str(log)}
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=580, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1]
    assert rows[0]["episodes/count"] == 4 and rows[0]["episodes/errors"] == 0, rows[0]
    assert rows[0]["episodes/infra_errors"] == 0 and rows[0]["batch/sequences"] == 4, rows[0]
    reports = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(reports) == 4 and all(report["calls"] >= 1 for report in reports)  # LangChain ran
    assert rows[0]["agent/episodes"] == 4
