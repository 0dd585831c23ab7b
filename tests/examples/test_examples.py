"""Every CPU example config trains for one step through the launcher, as a user runs it (smaller
batches than the file's so that the four fit in the test budget); math_agent_grpo_cpu.yaml trains
examples/math_agent.py, a plain openai-SDK agent, through the OpenAI-compatible endpoint;
search_long_context_cpu.yaml trains as written, its episodes past 16k tokens, on the SmolLM2 copy it
names (made here with agentrl extend-context) cut to its first two decoder layers: the 30-layer step
takes about 19 minutes on 2 cores (measured in docs/performance.md), the 2-layer one 2-3; its peak
is held to the example's stated budget less what the 28 layers left out would hold."""

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from model_cuts import first_layers

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
LONG_CONTEXT_LAYERS = 2
"""Decoder layers of SmolLM2 the test trains the long-context example with."""


@dataclass(frozen=True)
class LeftOut:
    """The decoder layers a cut model (:func:`write_first_layers`) does not have."""

    layers: int
    parameters: int
    hidden_size: int

    def budget_gb(self, tokens: int) -> float:
        """The example's budget less what these layers would hold at the peak: their float32
        weights, gradients and AdamW moments (16 bytes a parameter) and the engine's float32 copy
        (4 more), and the float32 layer inputs that activation checkpointing keeps for an episode
        of ``tokens`` (one episode a micro-batch)."""
        state = self.parameters * (16 + 4)
        checkpoints = self.layers * tokens * self.hidden_size * 4
        return LONG_CONTEXT_BUDGET_GB - (state + checkpoints) / 1e9


def write_first_layers(model_dir: Path, out: Path, layers: int) -> LeftOut:
    """Write ``model_dir`` with its first ``layers`` decoder layers only to ``out``; what it
    leaves out."""
    from agentrl.models import load_model, load_tokenizer, save_hf, tied_aliases

    model = load_model(model_dir)
    cut = model.model.layers[layers:]
    left_out = LeftOut(len(cut), sum(p.numel() for p in cut.parameters()), model.config.hidden_size)
    first_layers(model, layers)
    aliases = tied_aliases(model)
    weights = {name: t for name, t in model.state_dict().items() if name not in aliases}
    save_hf(model, weights, out, tokenizer=load_tokenizer(model_dir))
    return left_out


@pytest.mark.timeout(600)
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_trains_one_step(example, tmp_path):
    long_context = "long_context" in example.stem
    command = [
        sys.executable,
        "-m",
        "agentrl.cli",
        "train",
        str(example),
        f"trainer.output_dir={tmp_path}",
        "trainer.steps=1",
        "trainer.export_hf=false",
    ]
    if not long_context:  # which trains its own batch: one group of two 16k-token episodes
        command += [
            "rollout.groups_per_step=2",
            "rollout.group_size=2",
            "rollout.max_new_tokens=48",
        ]
    if "swe" in example.stem:  # one graded turn: four turns of long prompts cost minutes on 2 cores
        command.append("env.kwargs.max_turns=1")
    if long_context:  # the model it names, cut to its first layers
        from agentrl.context_extension import extend_context

        extended = extend_context("smollm2", tmp_path / "smollm2-32k", 4)
        model = tmp_path / "smollm2-32k-short"
        left_out = write_first_layers(extended, model, LONG_CONTEXT_LAYERS)
        command.append(f"model.path={model}")
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=580)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1]
    assert rows[0]["episodes/count"] == (2 if long_context else 4)
    assert rows[0]["episodes/errors"] == 0
    if "agent" in example.stem:  # the agent's episodes, not the environment's own turns
        assert rows[0]["agent/episodes"] >= 4 and rows[0]["agent/segments_dropped"] == 0
    if long_context:
        tokens = rows[0]["batch/tokens"] / rows[0]["batch/sequences"]  # an episode's, mean
        assert rows[0]["batch/sequences"] == 2 and tokens > 16_000  # its passages: 16k tokens
        budget = left_out.budget_gb(int(tokens))
        assert rows[0]["memory/peak_rss_gb"] <= budget, budget
    if "mix" in example.stem:
        assert any(key.startswith("env/math/") or key.startswith("env/code/") for key in rows[0])
