"""Every CPU example config trains for one step through the launcher, as a user runs it (smaller
batches than the file's so that the four fit in the test budget); math_agent_grpo_cpu.yaml trains
examples/math_agent.py, a plain openai-SDK agent, through the OpenAI-compatible endpoint;
search_long_context_cpu.yaml trains the SmolLM2 copy it names (made here with agentrl
extend-context) on a 3,000-character context instead of its 64,000 (16k tokens take about 19
minutes a step on 2 cores; that step is measured in docs/performance.md), within its stated memory
budget."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*_cpu.yaml") if "_sft_" not in p.name)


def test_the_cpu_examples_are_these():
    assert {p.name for p in EXAMPLES} == {
        "math_grpo_cpu.yaml",
        "math_tool_grpo_cpu.yaml",
        "math_agent_grpo_cpu.yaml",
        "code_grpo_cpu.yaml",
        "mix_math_code_cpu.yaml",
        "math_pool_cpu.yaml",
        "search_grpo_cpu.yaml",
        "swe_grpo_cpu.yaml",
        "search_long_context_cpu.yaml",
    }


def test_the_sft_example_is_a_valid_sft_config():
    from agentrl.sft.config import SFTConfig

    config = SFTConfig.load(ROOT / "examples" / "math_tool_sft_cpu.yaml")
    assert str(config.data.path) == "runs/demo/demos.jsonl" and config.trainer.steps == 16


def test_the_gpu_examples_are_valid_configs():
    from agentrl.rl.config import TrainConfig

    config = TrainConfig.load(ROOT / "examples" / "math_sglang_gpu.yaml")
    assert config.engines.kind == "sglang" and config.engines.weight_sync == "broadcast"
    fp8 = TrainConfig.load(ROOT / "examples" / "math_tool_grpo_gpu.yaml")
    assert fp8.actor.fp8 == "tensorwise" and fp8.engines.fp8_weights


LONG_CONTEXT_BUDGET_GB = 6.0
"""search_long_context_cpu.yaml's stated peak RSS (docs/performance.md#a-long-context-step)."""


@pytest.mark.timeout(600)
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_trains_one_step(example, tmp_path):
    command = [
        sys.executable,
        "-m",
        "agentrl.cli",
        "train",
        str(example),
        f"trainer.output_dir={tmp_path}",
        "trainer.steps=1",
        "trainer.export_hf=false",
        "rollout.groups_per_step=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=48",
    ]
    if "swe" in example.stem:  # one graded turn: four turns of long prompts cost minutes on 2 cores
        command.append("env.kwargs.max_turns=1")
    if "long_context" in example.stem:  # the model it names, and 3,000 characters, not 64,000
        from agentrl.context_extension import extend_context

        model = extend_context("smollm2", tmp_path / "smollm2-32k", 4)
        command += [f"model.path={model}", "env.kwargs.max_context_chars=3000"]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=580)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1]
    assert rows[0]["episodes/count"] == 4 and rows[0]["episodes/errors"] == 0
    if "agent" in example.stem:  # the agent's episodes, not the environment's own turns
        assert rows[0]["agent/episodes"] >= 4 and rows[0]["agent/segments_dropped"] == 0
    if "long_context" in example.stem:
        assert rows[0]["batch/tokens"] > 4 * 700  # each episode opens with its passages
        assert rows[0]["memory/peak_rss_gb"] <= LONG_CONTEXT_BUDGET_GB
    if "mix" in example.stem:
        assert any(key.startswith("env/math/") or key.startswith("env/code/") for key in rows[0])
