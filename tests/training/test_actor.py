"""Actor: FSDP2 training of a tiny Llama, in this process (a one-process gloo group) and under torchrun.

Reference gradients come from the same model without FSDP, on the same global batch, with the
loss summed over every scored token and divided by their count. Tolerances allow float32 rounding
only (the sharded step sums the same terms in another order), and are derived on this CPU from
float64: the reference computed in float64 is the exact value, and the float32 reference's
distance from it is the rounding a float32 evaluation has (tests/float_tolerance.py). For the
two-process job, the same job runs in this process in float32 and in float64 (the log-softmax stays
float32: `token_logprobs` computes it so): after 3 AdamW steps at lr 1e-2 the float32 parameters
are up to 5e-5 from the float64 ones (AdamW divides each update by the gradient's own size, so an
entry whose gradient is near 0 carries rounding far into the weights; 2e-6 between two float32
runs that only accumulate the micro-batches in the other order), and the two-process job must be
as close to float64 as that, within ``FACTOR``.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from float_tolerance import (
    assert_within,
    float32_tolerance,
    logprob_error_with,
    tolerance,
)
from fsdp_worker import (
    MicroBatch,
    actor_config,
    global_batch,
    nll_loss,
    one_process_group,
    probe_logprobs,
    tiny_llama,
)
from torch import nn
from torchrun_jobs import run_torchrun

from agentrl.config import ConfigError
from agentrl.training.actor import Actor, ActorConfig, decoder_layers, mixed_precision_policy
from agentrl.training.distributed import (
    DistInfo,
    distributed,
    group_backends,
    init_distributed,
    parse_backends,
)
from agentrl.training.optim import lr_factor

WORKER = Path(__file__).parents[1] / "fsdp_worker.py"
VOCAB = 64
TOKENS = 32  # tokens scored by global_batch(): 11 + 9 + 7 + 5


@pytest.fixture(scope="module")
def dist_info() -> Iterator[DistInfo]:
    with one_process_group() as info:
        yield info


def test_one_process_group_is_reused_not_torn_down_by_nested_use(dist_info: DistInfo) -> None:
    assert (dist_info.rank, dist_info.world_size, dist_info.backend) == (0, 1, "gloo")
    assert dist_info.device == torch.device("cpu") and dist_info.is_main
    with distributed() as inner:  # a group exists: joined, and left alone on exit
        assert inner == dist_info == init_distributed("nccl")  # backend ignored once it exists
    assert dist.is_initialized()


@functools.cache
def reference_grads(
    denominator: float, dtype: torch.dtype = torch.float32
) -> tuple[float, dict[str, torch.Tensor]]:
    """Summed loss of the global batch and gradients of (that sum / denominator), without FSDP,
    with the model in ``dtype`` (float64: the exact values, but for the log-softmax)."""
    model = tiny_llama().to(dtype).train()
    total = sum(nll_loss(model, micro_batch)[0] for micro_batch in global_batch(VOCAB))
    (total / denominator).backward()
    return float(total.detach()), {name: p.grad for name, p in model.named_parameters()}


def assert_grads_as_exact_as_float32(seen: dict[str, torch.Tensor], denominator: float) -> None:
    """Each gradient is as close to the float64 reference as the float32 reference is, within
    ``FACTOR``."""
    _, grads32 = reference_grads(denominator)
    _, grads64 = reference_grads(denominator, torch.float64)
    for name, exact in grads64.items():
        assert_within(seen[name], exact, float32_tolerance(grads32[name], exact), name)


def norm_tolerance(denominator: float) -> tuple[float, float]:
    """The exact gradient norm and the tolerance for a float32 one (from the float32 reference)."""
    exact = global_norm(reference_grads(denominator, torch.float64)[1])
    return exact, tolerance(abs(global_norm(reference_grads(denominator)[1]) - exact), exact)


def capture_step_grads(actor: Actor) -> dict[str, torch.Tensor]:
    """Filled with the full gradients the optimizer sees (after clipping) at each step."""
    grads: dict[str, torch.Tensor] = {}

    def hook(*_: Any) -> None:
        for name, param in actor.model.named_parameters():
            grads[name] = param.grad.full_tensor().clone()

    actor.optimizer.register_step_pre_hook(hook)
    return grads


def global_norm(grads: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float(g.pow(2).sum()) for g in grads.values()))


@pytest.mark.parametrize("denominator", [None, float(TOKENS), 2.0 * TOKENS])
def test_gradient_is_the_global_loss_sum_over_the_denominator(
    dist_info: DistInfo, denominator: float | None
) -> None:
    actor = Actor(tiny_llama(), ActorConfig(lr=1e-3, max_grad_norm=None))
    seen = capture_step_grads(actor)
    metrics = actor.train_step(global_batch(VOCAB), nll_loss, global_denominator=denominator)
    denominator = denominator or TOKENS
    assert_grads_as_exact_as_float32(seen, denominator)
    norm, norm_atol = norm_tolerance(denominator)
    assert metrics["grad_norm"] == pytest.approx(norm, abs=norm_atol)
    loss = reference_grads(denominator, torch.float64)[0] / denominator
    loss_atol = tolerance(abs(reference_grads(denominator)[0] / denominator - loss), loss)
    assert metrics["loss"] == pytest.approx(loss, abs=loss_atol)
    assert metrics["denominator"] == TOKENS and metrics["micro_batches"] == 4


def test_clipping_rescales_gradients_to_max_norm_and_reports_the_norm_before(
    dist_info: DistInfo,
) -> None:
    actor = Actor(tiny_llama(), ActorConfig(lr=1e-3, max_grad_norm=0.5))
    seen = capture_step_grads(actor)
    metrics = actor.train_step(global_batch(VOCAB), nll_loss)
    norm, norm_atol = norm_tolerance(TOKENS)
    assert metrics["grad_norm"] == pytest.approx(norm, abs=norm_atol)
    assert metrics["grad_norm"] > 1.0  # so clipping to 0.5 does something
    # the clipped norm is 0.5 times the float32 norm's relative error, and torch's 1e-6
    clipped = 0.5 * metrics["grad_norm"] / (metrics["grad_norm"] + 1e-6)
    assert global_norm(seen) == pytest.approx(clipped, abs=0.5 * norm_atol / norm)
    scale = 0.5 / (metrics["grad_norm"] + 1e-6)
    _, grads32 = reference_grads(TOKENS)
    for name, exact in reference_grads(TOKENS, torch.float64)[1].items():
        atol = float32_tolerance(grads32[name] * scale, exact * scale)
        assert_within(seen[name], exact * scale, atol, name)


def test_loss_decreases_on_a_fixed_batch(dist_info: DistInfo) -> None:
    actor = Actor(tiny_llama(), actor_config("tiny"))
    losses = [actor.train_step(global_batch(VOCAB), nll_loss)["loss"] for _ in range(5)]
    assert all(after < before for before, after in itertools.pairwise(losses)), losses
    assert actor.step == 5


def test_decoder_layers_are_found_before_and_after_sharding(dist_info: DistInfo) -> None:
    # fully_shard swaps each layer's class for an FSDP<name> subclass (bench_fp8_training compiles
    # the layers of a sharded model)
    model = tiny_llama()
    before = decoder_layers(model)
    actor = Actor(model, actor_config("tiny"))
    after = decoder_layers(actor.model)
    assert type(after[0]).__name__.startswith("FSDP")
    assert [id(layer) for layer in after] == [id(layer) for layer in before]
    assert len(after) == model.config.num_hidden_layers


def test_lr_schedule_values_are_exact(dist_info: DistInfo) -> None:
    cosine = {"warmup_steps": 3, "schedule": "cosine", "total_steps": 7, "min_lr_ratio": 0.1}
    expected = {0: 1 / 3, 1: 2 / 3, 2: 1.0, 3: 1.0, 5: 0.55, 7: 0.1, 50: 0.1}
    for step, factor in expected.items():
        assert lr_factor(step, **cosine) == pytest.approx(factor, abs=1e-15), step
    linear = {**cosine, "schedule": "linear"}
    assert [lr_factor(s, **linear) for s in (4, 5, 6)] == pytest.approx([0.775, 0.55, 0.325])
    assert lr_factor(10**6, warmup_steps=0, schedule="constant") == 1.0

    config = ActorConfig(
        lr=0.01, warmup_steps=3, lr_schedule="cosine", total_steps=7, min_lr_ratio=0.1
    )
    actor = Actor(tiny_llama(), config)
    used = [actor.train_step(global_batch(VOCAB)[:1], nll_loss)["lr"] for _ in range(6)]
    assert used == pytest.approx([0.01 * lr_factor(s, **cosine) for s in range(6)], abs=1e-15)


def one_step_with_layer_calls(
    checkpointing: bool,
) -> tuple[int, float, dict[str, torch.Tensor], list[str]]:
    """Calls of layer 0's MLP, loss, gradients and parameter names of one step on the batch."""
    actor = Actor(tiny_llama(), actor_config("tiny", activation_checkpointing=checkpointing))
    calls: list[int] = []
    actor.model.model.layers[0].mlp.register_forward_pre_hook(lambda *_: calls.append(1))
    seen = capture_step_grads(actor)
    loss = actor.train_step(global_batch(VOCAB), nll_loss)["loss"]
    return len(calls), loss, seen, [name for name, _ in actor.model.named_parameters()]


def test_activation_checkpointing_recomputes_layers_with_the_same_result(
    dist_info: DistInfo,
) -> None:
    plain_calls, plain_loss, plain_grads, plain_names = one_step_with_layer_calls(False)
    ac_calls, ac_loss, ac_grads, ac_names = one_step_with_layer_calls(True)
    assert (plain_calls, ac_calls) == (4, 8)  # one forward per micro-batch, plus the recompute
    assert ac_names == plain_names == [n for n, _ in tiny_llama().named_parameters()]
    exact_sum = reference_grads(TOKENS, torch.float64)[0]
    loss_atol = tolerance(abs(reference_grads(TOKENS)[0] - exact_sum) / TOKENS, exact_sum / TOKENS)
    assert ac_loss == pytest.approx(plain_loss, abs=loss_atol)
    # two float32 evaluations of the same gradients, both clipped to norm 1.0 (from about 2)
    scale = 1.0 / (norm_tolerance(TOKENS)[0] + 1e-6)
    _, grads32 = reference_grads(TOKENS)
    for name, exact in reference_grads(TOKENS, torch.float64)[1].items():
        atol = float32_tolerance(grads32[name] * scale, exact * scale)
        assert_within(ac_grads[name], plain_grads[name], atol, name)


def test_bf16_mixed_precision_computes_in_bf16_and_keeps_fp32_weights(
    dist_info: DistInfo,
) -> None:
    actor = Actor(tiny_llama(), ActorConfig(lr=1e-3, mixed_precision="bf16"))
    seen = capture_step_grads(actor)
    logit_dtypes = []

    def loss_fn(model: nn.Module, micro_batch: MicroBatch):
        logit_dtypes.append(model(micro_batch["input_ids"]).logits.dtype)
        return nll_loss(model, micro_batch)

    metrics = actor.train_step(global_batch(VOCAB)[:2], loss_fn)
    assert set(logit_dtypes) == {torch.bfloat16}
    assert {p.dtype for p in actor.model.parameters()} == {torch.float32}
    assert {g.dtype for g in seen.values()} == {torch.float32}
    assert math.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0

    auto = ActorConfig(mixed_precision="auto")
    gpu = mixed_precision_policy(auto, torch.device("cuda"))
    assert (gpu.param_dtype, gpu.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert mixed_precision_policy(auto, torch.device("cpu")).param_dtype is None


def test_invalid_steps_raise_and_change_nothing(dist_info: DistInfo) -> None:
    actor = Actor(tiny_llama(), ActorConfig())
    batch = global_batch(VOCAB)[:1]
    before = {n: p.full_tensor().clone() for n, p in actor.model.named_parameters()}
    with pytest.raises(ValueError, match="no micro-batches"):
        actor.train_step([], nll_loss)
    with pytest.raises(ValueError, match="global_denominator must be > 0"):
        actor.train_step(batch, nll_loss, global_denominator=0.0)
    nothing = MicroBatch(input_ids=batch[0]["input_ids"], mask=batch[0]["mask"] * 0, weight=1.0)
    with pytest.raises(ValueError, match="sum to 0"):
        actor.train_step([nothing], nll_loss)
    with pytest.raises(ValueError, match="reserved"):
        actor.train_step(batch, lambda m, b: (*nll_loss(m, b)[:2], {"lr": 1.0}))
    with pytest.raises(FloatingPointError, match="gradient norm is nan"):
        actor.train_step(batch, lambda m, b: (nll_loss(m, b)[0] * math.nan, 1.0, {}))
    for name, param in actor.model.named_parameters():
        assert torch.equal(param.full_tensor(), before[name]), name
    assert all(p.grad is None for p in actor.model.parameters())
    assert actor.step == 0


def test_config_rejects_unknown_keys_and_schedules_without_an_end() -> None:
    with pytest.raises(ConfigError, match="lr_shedule: unknown key"):
        ActorConfig.build("actor", {"lr": 1e-5, "lr_shedule": "cosine"})
    with pytest.raises(ConfigError, match="needs total_steps"):
        ActorConfig.build("actor", {"lr_schedule": "cosine", "warmup_steps": 10})


def test_cpu_offload_is_refused_on_the_cpu_where_there_is_nothing_to_offload(
    dist_info: DistInfo,
) -> None:
    """``actor.offload`` itself runs on a GPU only (tests/gpu); here: its clear refusals."""
    with pytest.raises(ValueError, match="runs on the CPU, where they are in CPU memory already"):
        Actor(tiny_llama(), ActorConfig(offload="cpu"))
    with pytest.raises(ConfigError, match="offload"):
        ActorConfig.build("actor", {"offload": "gpu"})


def test_a_group_with_cpu_collectives_is_read_per_device(dist_info: DistInfo) -> None:
    assert group_backends() == {"cpu": "gloo"}
    assert parse_backends("cuda:nccl,cpu:gloo") == {"cuda": "nccl", "cpu": "gloo"}
    assert parse_backends("nccl") == {"cuda": "nccl"} and parse_backends("gloo") == {"cpu": "gloo"}


# -- two processes under torchrun --------------------------------------------------------------

STEPS = 3


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fsdp2")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc_per_node", "2", str(WORKER), "--out", str(out), "--steps", str(STEPS)]
    done = run_torchrun(command, timeout=300)
    assert done.returncode == 0, done.stderr[-8000:]
    return out


@pytest.fixture(scope="module")
def one_process(dist_info: DistInfo) -> dict[torch.dtype, dict[str, Any]]:
    """The two-process job's training in this process, in float32 and in float64: per dtype its
    metrics, full parameters, the actor and the probe log-probs."""
    runs = {}
    for dtype in (torch.float32, torch.float64):
        actor = Actor(tiny_llama().to(dtype), actor_config("tiny"))
        metrics = [actor.train_step(global_batch(VOCAB), nll_loss) for _ in range(STEPS)]
        params = {name: p.full_tensor() for name, p in actor.model.named_parameters()}
        probe = probe_logprobs(actor.model, VOCAB)
        runs[dtype] = {"metrics": metrics, "params": params, "actor": actor, "probe": probe}
    return runs


@pytest.mark.slow
def test_two_processes_match_one_process(
    one_process: dict[torch.dtype, dict[str, Any]], two_process_run: Path
) -> None:
    """As close to the float64 job as the float32 one-process job is, within ``FACTOR``."""
    result = json.loads((two_process_run / "result.json").read_text())
    one, exact = one_process[torch.float32], one_process[torch.float64]
    for mine, reference, theirs in zip(
        one["metrics"], exact["metrics"], result["metrics"], strict=True
    ):
        assert set(theirs) == set(reference)
        for key, value in reference.items():
            atol = tolerance(abs(mine[key] - value), value)
            assert theirs[key] == pytest.approx(value, abs=atol), key
    params = torch.load(two_process_run / "params.pt")
    for name, value in exact["params"].items():
        atol = float32_tolerance(one["params"][name], value)
        assert_within(params[name], value, atol, name)
    logprobs = torch.load(two_process_run / "logprobs.pt")
    assert_within(
        logprobs["actor"], exact["probe"], float32_tolerance(one["probe"], exact["probe"])
    )


@pytest.mark.slow
def test_two_process_sync_reaches_the_rank0_engine(
    one_process: dict[torch.dtype, dict[str, Any]], two_process_run: Path
) -> None:
    result = json.loads((two_process_run / "result.json").read_text())
    assert result["engine_version"] == 7
    assert result["sync"]["tensors"] == len(list(tiny_llama().parameters()))
    assert result["sync"]["buckets"] > 1
    logprobs = torch.load(two_process_run / "logprobs.pt")
    # two float32 evaluations of the trained weights' probe log-probs (the engine's decode, the
    # actor's forward): within the tolerance the actor's float32 error on them gives
    probe = torch.arange(16).remainder(VOCAB).tolist()
    actors = (one_process[torch.float32]["actor"].model, one_process[torch.float64]["actor"].model)
    error, _, magnitude = logprob_error_with(*actors, probe)
    assert_within(logprobs["engine"], logprobs["actor"], tolerance(error, magnitude))


@pytest.mark.slow
def test_unequal_micro_batch_counts_raise_on_every_rank(two_process_run: Path) -> None:
    errors = json.loads((two_process_run / "result.json").read_text())["errors"]
    assert len(errors) == 2
    assert all("same number on every rank" in error for error in errors), errors


@pytest.mark.parametrize("trim", [True, False])
def test_trim_heap_runs_before_every_micro_batch_and_the_optimizer_step(
    dist_info: DistInfo, monkeypatch: pytest.MonkeyPatch, trim: bool
) -> None:
    """``actor.trim_heap``: glibc's free heap pages handed back between micro-batches
    (tests/test_malloc.py shows the pages come back)."""
    import agentrl.training.actor as actor_module

    calls: list[int] = []
    monkeypatch.setattr(actor_module, "trim_heap", lambda: calls.append(1) or True)
    config = actor_config("tiny").model_copy(update={"trim_heap": trim})
    batch = global_batch(VOCAB)
    Actor(tiny_llama(), config).train_step(batch, nll_loss)
    assert len(calls) == (len(batch) + 1 if trim else 0)
