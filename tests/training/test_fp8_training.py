"""actor.fp8: the hardware check, the layer rule, and FP8 training emulated on the CPU under torchrun.

The training jobs run `fsdp_worker.py` with the torchao venv's interpreter (``.venv-torchao``,
made by ``scripts/setup-torchao-env``; torchao stays out of the project's venv, see that script),
in one process and in two (FSDP2 over gloo, tensorwise weights all-gathered in float8). torchao's
emulation computes the same float8 casts and scales as on an H100 and multiplies in high precision,
so these tests cover the conversion, sharding, scale precomputation, checkpoint-free weight sync and
the numerics of the casts; not the FP8 kernels' speed, which bench/bench_fp8_training.py measures on
a GPU.

Measured (2-core AMD EPYC, tiny Llama, 3 steps): float32 losses 5.399627, 5.078467, 4.724179;
tensorwise FP8 5.399171, 5.083562, 4.728433, the same to 7 digits in one process and in two;
engine (float32, no casts) against the FP8 actor: max |Δ log-prob| 0.0096. One process and two
are compared within float32 rounding as this CPU gives it, derived from the same job without FP8
in this process in float32 and in float64 (tests/float_tolerance.py); the bounds on what FP8 itself
changes (2e-2 of the loss, 0.1 of a log-prob) are FP8's rounding of the weights and activations,
not the CPU's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from float_tolerance import assert_within, float32_tolerance, tolerance
from fsdp_worker import actor_config, global_batch, nll_loss, one_process_group, tiny_llama
from safetensors.torch import load_file
from torch import nn
from torchrun_jobs import run_torchrun

from agentrl.config import ConfigError
from agentrl.fp8_weights import dequantize_named_tensors, round_trip, scale_name
from agentrl.rl.config import TrainConfig
from agentrl.training.actor import Actor, ActorConfig
from agentrl.training.fp8_training import FP8Unavailable, fp8_layer_names

ROOT = Path(__file__).resolve().parents[2]
TORCHAO_PYTHON = ROOT / ".venv-torchao" / "bin" / "python"
WORKER = Path(__file__).parents[1] / "fsdp_worker.py"
STEPS = 3
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def test_a_trainer_without_an_fp8_gpu_is_told_what_it_has() -> None:
    with one_process_group(), pytest.raises(FP8Unavailable) as caught:
        Actor(tiny_llama(), ActorConfig(fp8="tensorwise"))
    message = str(caught.value)
    assert "compute capability 8.9 or newer" in message
    assert "runs on cpu" in message and "actor.fp8_emulate=true" in message


def test_without_torchao_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchao", None)  # an import of it raises ImportError
    monkeypatch.setitem(sys.modules, "torchao.float8", None)
    config = ActorConfig(fp8="rowwise", fp8_emulate=True, fp8_min_features=16)
    with one_process_group(), pytest.raises(FP8Unavailable, match=r"pip install 'agentrl\[gpu\]'"):
        Actor(tiny_llama(), config)


class _Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(4096, 2048)
        self.attn = nn.ModuleDict({"q_proj": nn.Linear(2048, 2048), "k_proj": nn.Linear(2048, 256)})
        self.mlp = nn.ModuleDict({"up_proj": nn.Linear(2048, 5632), "odd": nn.Linear(2048, 1030)})
        self.lm_head = nn.Linear(2048, 4096)


def test_the_layer_rule_keeps_the_head_small_and_odd_layers_in_bf16() -> None:
    model = _Blocks()
    assert fp8_layer_names(model, ["lm_head"], 1024) == ["attn.q_proj", "mlp.up_proj"]
    assert fp8_layer_names(model, ["lm_head", r"^mlp\."], 16) == ["attn.q_proj", "attn.k_proj"]
    assert fp8_layer_names(model, [], 2048) == ["attn.q_proj", "mlp.up_proj", "lm_head"]


def test_no_layer_to_convert_is_a_clear_error() -> None:
    config = ActorConfig(fp8="tensorwise", fp8_emulate=True)  # tiny layers are below 1024
    with one_process_group(), pytest.raises(ValueError, match=r"converts no layer.*\(32, 32\)"):
        Actor(tiny_llama(), config)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["actor.fp8_emulate=true"], r"actor\.fp8_emulate set with actor\.fp8=off"),
        (["actor.fp8_min_features=64"], r"actor\.fp8_min_features set with actor\.fp8=off"),
        (["actor.fp8=tensorwise", "actor.fp8_exclude=['(']"], "is no regular expression"),
        (["actor.fp8=fp4"], r"actor\.fp8"),
    ],
)
def test_fp8_options_are_checked(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig.load(None, overrides)


# -- emulated FP8 training under torchrun, in the torchao venv ---------------------------------


def run_job(out: Path, recipe: str, processes: int) -> dict:
    if not TORCHAO_PYTHON.exists():
        pytest.fail(
            f"{TORCHAO_PYTHON} is missing: run scripts/setup-torchao-env (make test does)",
            pytrace=False,
        )
    command = [str(TORCHAO_PYTHON), "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc_per_node", str(processes), str(WORKER), "--out", str(out)]
    command += ["--steps", str(STEPS), "--fp8", recipe, "--export"]
    done = run_torchrun(command, timeout=400)
    noise = ("register_constant", "Failed to load")  # torchao's warnings, its CUDA-only libraries
    log = "\n".join(line for line in done.stderr.splitlines() if not any(n in line for n in noise))
    assert done.returncode == 0, log[-8000:]
    result = json.loads((out / "result.json").read_text())
    result["params"] = torch.load(out / "params.pt")
    result["logprobs"] = torch.load(out / "logprobs.pt")
    result["out"] = out
    return result


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], dict]:
    runs = [("tensorwise", 1), ("tensorwise", 2), ("rowwise", 2)]
    return {
        (recipe, n): run_job(tmp_path_factory.mktemp(f"fp8-{recipe}-{n}"), recipe, n)
        for recipe, n in runs
    }


@pytest.fixture(scope="module")
def full_precision() -> dict[torch.dtype, dict]:
    """The same job without FP8, in this process (one rank), in float32 and in float64 (the
    exact values, but for the log-softmax `token_logprobs` computes in float32): per dtype the
    metrics of each step and the trained parameters."""
    runs = {}
    with one_process_group():
        for dtype in (torch.float32, torch.float64):
            actor = Actor(tiny_llama().to(dtype), actor_config("tiny"))
            metrics = [actor.train_step(global_batch(64), nll_loss) for _ in range(STEPS)]
            params = {name: p.full_tensor() for name, p in actor.model.named_parameters()}
            runs[dtype] = {"metrics": metrics, "params": params}
    return runs


def loss_rounding(full_precision: dict[torch.dtype, dict]) -> list[float]:
    """Per step, how far two float32 evaluations of the job's loss may differ on this CPU."""
    pairs = zip(
        *(full_precision[d]["metrics"] for d in (torch.float32, torch.float64)), strict=True
    )
    return [tolerance(abs(mine["loss"] - exact["loss"]), exact["loss"]) for mine, exact in pairs]


@pytest.mark.slow
@pytest.mark.parametrize("job", [("tensorwise", 1), ("tensorwise", 2), ("rowwise", 2)])
def test_fp8_micro_batches_are_padded_to_a_multiple_of_16_tokens(
    jobs: dict, job: tuple[str, int]
) -> None:
    """torch._scaled_mm's weight-gradient matmul runs over the tokens and takes multiples of 16
    only (an H200 refused 3,032 tokens): sequences of 5, 13 and 30 tokens, split over the ranks."""
    tokens = jobs[job]["micro_batch_tokens"]
    assert tokens and all(n % 16 == 0 for n in tokens), tokens
    assert sum(tokens) >= (48 if job[1] == 1 else 18)


@pytest.mark.slow
@pytest.mark.parametrize("job", [("tensorwise", 2), ("rowwise", 2)])
def test_every_projection_but_the_head_trains_in_fp8_close_to_float32(
    jobs: dict, full_precision: dict[torch.dtype, dict], job: tuple[str, int]
) -> None:
    result = jobs[job]
    expected = [f"model.layers.{i}.{kind}.{p}" for i in range(2) for kind, p in _projections()]
    assert sorted(result["fp8_layers"]) == sorted(expected)
    losses = [m["loss"] for m in result["metrics"]]
    reference = [m["loss"] for m in full_precision[torch.float32]["metrics"]]
    assert losses == pytest.approx(reference, rel=2e-2)  # the float8 casts, nothing more
    # and they do happen: a loss beyond what float32 rounding explains
    gaps = [abs(fp8 - fp32) for fp8, fp32 in zip(losses, reference, strict=True)]
    assert any(gap > bound for gap, bound in zip(gaps, loss_rounding(full_precision), strict=True))
    assert losses[-1] < losses[0]


@pytest.mark.slow
def test_two_ranks_with_float8_all_gather_match_one_rank(
    jobs: dict, full_precision: dict[torch.dtype, dict]
) -> None:
    """Within the float32 rounding of the same job without FP8 (float32 against float64), which
    AdamW carries into the weights; a float8 cast that rounds the other way on one side would be
    a larger step (2^-3 of that value), not seen so far."""
    one, two = jobs[("tensorwise", 1)], jobs[("tensorwise", 2)]
    rounding = zip(
        *(full_precision[d]["metrics"] for d in (torch.float32, torch.float64)), strict=True
    )
    for mine, theirs, (float32, exact) in zip(
        one["metrics"], two["metrics"], rounding, strict=True
    ):
        assert set(theirs) == set(mine)
        for key, value in mine.items():
            atol = tolerance(abs(float32[key] - exact[key]), value)
            assert theirs[key] == pytest.approx(value, abs=atol), key
    float32, exact = (full_precision[d]["params"] for d in (torch.float32, torch.float64))
    for name, tensor in one["params"].items():
        atol = float32_tolerance(float32[name], exact[name])
        assert_within(two["params"][name], tensor, atol, name)


@pytest.mark.slow
@pytest.mark.parametrize("job", [("tensorwise", 2), ("rowwise", 2)])
def test_weight_sync_sends_plain_float32_master_weights(jobs: dict, job: tuple[str, int]) -> None:
    result = jobs[job]
    assert result["engine_version"] == 7
    assert {type(t) for t in result["params"].values()} == {torch.Tensor}
    assert {t.dtype for t in result["params"].values()} == {torch.float32}
    assert set(result["params"]) == {n for n, _ in tiny_llama().named_parameters()}
    # the engine computes in float32 without FP8 casts: the FP8 train/inference mismatch, beyond
    # float32 rounding (the engine's log-probs computed at about log(64), the vocabulary's)
    gap = float((result["logprobs"]["engine"] - result["logprobs"]["actor"]).abs().max())
    magnitude = float(result["logprobs"]["engine"].abs().max())
    assert tolerance(0.0, magnitude) < gap < 0.1


@pytest.mark.slow
@pytest.mark.parametrize("job", [("tensorwise", 2), ("rowwise", 2)])
def test_export_hf_writes_the_trained_weights_plain_and_as_blockwise_fp8(
    jobs: dict, job: tuple[str, int]
) -> None:
    """The end-of-run export of an FP8-trained actor: torchao's weight subclass must not reach the
    safetensors, in full precision or as the FP8 checkpoint an SGLang server starts from."""
    result, out = jobs[job], jobs[job]["out"]
    trained = result["params"]  # the tied head is written once, as the embedding
    plain = load_file(out / "hf" / "model.safetensors")
    assert set(plain) == set(trained)
    for name, tensor in trained.items():
        assert torch.equal(plain[name], tensor), name
    blockwise = load_file(out / "hf-fp8" / "model.safetensors")
    loaded = dict(dequantize_named_tensors(blockwise.items()))
    assert set(loaded) == set(trained)
    for name, tensor in trained.items():
        expected = round_trip(tensor) if scale_name(name) in blockwise else tensor
        torch.testing.assert_close(loaded[name], expected, rtol=0, atol=0)
    fp8 = {n for n, t in blockwise.items() if t.dtype == torch.float8_e4m3fn}
    assert len(fp8) == 2 * len(PROJECTIONS)
    config = json.loads((out / "hf-fp8" / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "fp8"


@pytest.mark.slow
@pytest.mark.parametrize("job", [("tensorwise", 2), ("rowwise", 2)])
def test_a_checkpoint_of_an_fp8_actor_restores_its_weights_and_float8_scales(
    jobs: dict, job: tuple[str, int]
) -> None:
    """Save, step, load, the same step again: identical metrics only if the load also recomputed
    the tensorwise scales precomputed for the weights it replaced."""
    result, out = jobs[job], jobs[job]["out"]
    assert result["resumed"]["again"] == result["resumed"]["moved"]
    restored = torch.load(out / "restored.pt")
    for name, tensor in result["params"].items():
        assert torch.equal(restored[name], tensor), name


def _projections() -> list[tuple[str, str]]:
    return [("self_attn" if p[0] in "qkvo" else "mlp", p) for p in PROJECTIONS]


@pytest.mark.slow
def test_the_gpu_benchmark_runs_its_three_modes_on_a_cpu() -> None:
    """bench/bench_fp8_training.py, shrunk (tiny model, emulated FP8): the script works end to end;
    its numbers mean something on an H100/H200 only."""
    command = [str(TORCHAO_PYTHON), "-m", "bench.bench_fp8_training", "--config", "tiny"]
    command += ["--emulate", "--steps", "2", "--warmup", "1", "--seq-len", "32", "--batch", "2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines[1:4]] == ["bf16", "tensorwise", "rowwise"]
    assert lines[-2].startswith("tensorwise / bf16 = ") and lines[-1].startswith("rowwise / bf16")


def test_the_benchmark_forward_builds_no_kv_cache() -> None:
    """A KV cache in the training forward made torch.compile recompile each decoder layer (its
    cache index) until its limit of 8, so 14 of the 1B model's 22 layers ran eager (H200)."""
    from bench.bench_fp8_training import build_model, loss_fn

    model = build_model("tiny", 16)
    caches = []
    model.register_forward_hook(lambda module, args, output: caches.append(output.past_key_values))
    loss, tokens, _ = loss_fn(model, torch.randint(0, model.config.vocab_size, (2, 16)))
    assert caches == [None] and tokens == 30 and torch.isfinite(loss)
