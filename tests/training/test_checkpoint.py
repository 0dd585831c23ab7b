"""Checkpoints and Hugging Face export of the FSDP2 actor, in this process and under torchrun.

Resuming is asserted bit-exact (``torch.equal``, ``==`` on metrics): a checkpoint stores the
float32 shards as they are, so nothing may differ. Across world sizes the comparison is with the
full state the saving job itself gathered, also exactly. An export holds the actor's weights bit
for bit; its logits are compared with the actor's within float32 rounding, derived from the plain
model's float32 error against float64 on this CPU (tests/float_tolerance.py; measured: identical,
the sharded and the plain forward run the same ops).
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoint_worker import STEPS, full_state, other_llama, rng_draws, seed_everything
from float_tolerance import assert_within, float32_tolerance
from fsdp_worker import actor_config, global_batch, nll_loss, one_process_group, tiny_llama
from safetensors.torch import load_file
from torchrun_jobs import run_torchrun
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    FineGrainedFP8Config,
    LlamaConfig,
    LlamaForCausalLM,
)

from agentrl.fp8_weights import fp8_weight_names, round_trip
from agentrl.training.actor import Actor, ActorConfig
from agentrl.training.checkpoint import CheckpointManager, export_hf
from agentrl.training.distributed import DistInfo

WORKER = Path(__file__).with_name("checkpoint_worker.py")
VOCAB = 64
# Warmup then cosine decay: a resume that lost the schedule position would use another lr.
CONFIG = ActorConfig(lr=1e-2, warmup_steps=2, lr_schedule="cosine", total_steps=6)


@pytest.fixture(scope="module")
def dist_info() -> Iterator[DistInfo]:
    with one_process_group() as info:
        yield info


def trained_actor(steps: int, model: torch.nn.Module | None = None) -> Actor:
    actor = Actor(model or tiny_llama(), CONFIG)
    for _ in range(steps):
        actor.train_step(global_batch(VOCAB), nll_loss)
    return actor


def assert_same(actual: Any, expected: Any, where: str = "state") -> None:
    """Recursive equality: tensors bit-exact (``torch.equal``), everything else with ``==``."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor) and torch.equal(actual, expected), where
    elif isinstance(expected, dict):
        assert actual.keys() == expected.keys(), where
        for key, value in expected.items():
            assert_same(actual[key], value, f"{where}.{key}")
    elif isinstance(expected, list | tuple):
        assert len(actual) == len(expected), where
        for i, (mine, theirs) in enumerate(zip(actual, expected, strict=True)):
            assert_same(mine, theirs, f"{where}[{i}]")
    else:
        assert actual == expected, where


def test_resume_is_exact(dist_info: DistInfo, tmp_path: Path) -> None:
    actor = trained_actor(2)
    seed_everything(7)
    manager = CheckpointManager(tmp_path)
    path = manager.save(actor, {"data_position": 8})
    saved, draws = full_state(actor), rng_draws()
    continued = actor.train_step(global_batch(VOCAB), nll_loss)
    after = full_state(actor)["params"]

    fresh = Actor(other_llama(), CONFIG)
    assert not torch.equal(
        next(fresh.model.parameters()).full_tensor(), saved["params"]["model.embed_tokens.weight"]
    )
    seed_everything(8)
    assert manager.load(path, fresh) == {"data_position": 8}
    assert rng_draws() == draws
    assert_same(full_state(fresh), saved)  # weights, exp_avg, exp_avg_sq, step, lr, param groups
    assert fresh.step == 2 and fresh.scheduler.last_epoch == 2
    assert fresh.train_step(global_batch(VOCAB), nll_loss) == continued
    assert_same(full_state(fresh)["params"], after)


def test_extra_round_trips_and_latest_skips_incomplete_saves(
    dist_info: DistInfo, tmp_path: Path
) -> None:
    manager = CheckpointManager(tmp_path, keep_last=None)
    assert manager.latest() is None
    actor = trained_actor(1)
    first = {"data": {"epoch": 0, "index": 16}, "policy_version": 1, "config": {"lr": 0.01}}
    assert manager.save(actor, first) == tmp_path / "step_00000001"
    actor.train_step(global_batch(VOCAB), nll_loss)
    manager.save(actor, {"policy_version": 2})
    # What interrupted saves leave: an unpublished temporary directory, and a step directory
    # without trainer_state.json (e.g. half-copied by hand).
    (tmp_path / ".tmp-step_00000003" / "rng").mkdir(parents=True)
    (tmp_path / "step_00000003").mkdir()
    (tmp_path / "step_00000003" / ".metadata").write_bytes(b"partial")
    assert manager.latest() == tmp_path / "step_00000002"
    assert manager.load(tmp_path / "step_00000001", trained_actor(0)) == first

    actor.train_step(global_batch(VOCAB), nll_loss)
    path = manager.save(actor, {"policy_version": 3})  # replaces the incomplete step 3
    assert manager.latest() == path == tmp_path / "step_00000003"
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"step_0000000{i}" for i in (1, 2, 3)]
    assert manager.load(path, trained_actor(0)) == {"policy_version": 3}


def test_keep_last_deletes_the_oldest_complete_checkpoints(
    dist_info: DistInfo, tmp_path: Path
) -> None:
    manager = CheckpointManager(tmp_path, keep_last=2)
    actor = trained_actor(0)
    for _ in range(4):
        actor.train_step(global_batch(VOCAB)[:1], nll_loss)
        manager.save(actor, {})
    assert manager.checkpoints() == [tmp_path / "step_00000003", tmp_path / "step_00000004"]
    behind = manager.save(trained_actor(1), {})  # a resume from step 1: kept, though oldest
    assert manager.checkpoints() == [behind, tmp_path / "step_00000003", tmp_path / "step_00000004"]
    with pytest.raises(ValueError, match="keep_last"):
        CheckpointManager(tmp_path, keep_last=0)


def test_save_rejects_extra_that_is_not_json_before_writing(
    dist_info: DistInfo, tmp_path: Path
) -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        CheckpointManager(tmp_path).save(trained_actor(0), {"tokenizer": object()})
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_loading_a_missing_or_incomplete_path_names_it(dist_info: DistInfo, tmp_path: Path) -> None:
    actor = trained_actor(0)
    manager = CheckpointManager(tmp_path)
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "step_00000009")):
        manager.load(tmp_path / "step_00000009", actor)
    (tmp_path / "step_00000009").mkdir()
    with pytest.raises(ValueError, match=f"{tmp_path / 'step_00000009'} is not a complete"):
        manager.load(tmp_path / "step_00000009", actor)


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"num_hidden_layers": 3}, r"missing from the checkpoint: \['model.layers.2."),
        # DCP alone would load this one silently: it ignores checkpoint keys the model lacks.
        (
            {"num_hidden_layers": 1, "tie_word_embeddings": True},
            r"not in the model: \['model.layers.1.",
        ),
        (
            {"intermediate_size": 48},
            r"mlp.down_proj.weight \[32, 64\] in the checkpoint, \[32, 48\]",
        ),
    ],
)
def test_loading_into_another_architecture_raises_and_changes_nothing(
    dist_info: DistInfo, tmp_path: Path, make_tiny_llama, overrides: dict, problem: str
) -> None:
    path = CheckpointManager(tmp_path).save(trained_actor(1), {})
    other = Actor(make_tiny_llama(**overrides), CONFIG)
    before = {n: p.full_tensor().clone() for n, p in other.model.named_parameters()}
    with pytest.raises(ValueError, match=f"checkpoint {path} does not fit this model") as error:
        CheckpointManager(tmp_path).load(path, other)
    assert error.match(problem)
    assert_same({n: p.full_tensor() for n, p in other.model.named_parameters()}, before)
    assert not other.optimizer.state and other.step == 0


def test_export_loads_back_with_the_same_logits_and_tokenizer(
    dist_info: DistInfo, tmp_path: Path, tokenizer
) -> None:
    actor = trained_actor(2)
    out = export_hf(actor, tokenizer, tmp_path / "hf")
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched weights
    assert model.config.architectures == ["LlamaForCausalLM"]
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied again
    assert "lm_head.weight" not in load_file(out / "model.safetensors")
    exported = model.state_dict()
    for name, param in actor.model.named_parameters():
        assert torch.equal(exported[name], param.full_tensor()), name
    probe = torch.arange(16).remainder(VOCAB).unsqueeze(0)
    with torch.no_grad():
        expected = actor.model(probe).logits
        plain = model(probe).logits
        exact = copy.deepcopy(model).double()(probe).logits
    assert_within(plain, expected, float32_tolerance(plain, exact), "exported against the actor")

    loaded = AutoTokenizer.from_pretrained(out)
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    for template in (tokenizer, loaded):
        assert template.chat_template
    assert loaded.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    ) == tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert loaded("Hello, world!").input_ids == tokenizer("Hello, world!").input_ids


def test_export_casts_to_dtype(dist_info: DistInfo, tmp_path: Path) -> None:
    actor = trained_actor(1)
    params = full_state(actor)["params"]
    out = export_hf(actor.model, None, tmp_path / "bf16", dtype=torch.bfloat16)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert not (out / "tokenizer_config.json").exists()
    weights = load_file(out / "model.safetensors")
    assert weights.keys() == params.keys() - {"lm_head.weight"}
    for name, tensor in weights.items():
        assert torch.equal(tensor, params[name].to(torch.bfloat16)), name


def test_an_fp8_export_is_what_transformers_loads_as_block_fp8(
    dist_info: DistInfo, tmp_path: Path
) -> None:
    """The FP8 export (SGLang's layout) read by transformers' own block-FP8 loader, dequantising:
    an independent reader of the format gets exactly the weights the FP8 engine computes with."""
    torch.manual_seed(0)
    shape = dict(hidden_size=256, intermediate_size=512, num_attention_heads=2)
    model = LlamaForCausalLM(
        LlamaConfig(vocab_size=64, num_hidden_layers=2, num_key_value_heads=1, **shape)
    )  # every projection in whole 128x128 blocks: transformers' loader requires them
    actor = Actor(model, ActorConfig())
    params = {n: t.full_tensor() for n, t in actor.model.state_dict().items()}
    out = export_hf(actor.model, None, tmp_path / "fp8", fp8=True, fp8_ignored=["model.layers.1"])
    quantization = json.loads((out / "config.json").read_text())["quantization_config"]
    assert quantization == {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
        "ignored_layers": ["model.layers.1"],
    }
    stored = load_file(out / "model.safetensors")
    assert stored["model.layers.0.self_attn.q_proj.weight"].dtype == torch.float8_e4m3fn
    assert stored["model.layers.0.self_attn.q_proj.weight_scale_inv"].shape == (2, 2)
    assert stored["model.layers.1.self_attn.q_proj.weight"].dtype == torch.float32
    loaded = AutoModelForCausalLM.from_pretrained(
        out, quantization_config=FineGrainedFP8Config(dequantize=True), dtype=torch.float32
    ).state_dict()
    quantised = fp8_weight_names(model, ["model.layers.1"])
    assert len(quantised) == 7
    for name, tensor in params.items():
        expected = round_trip(tensor) if name in quantised else tensor
        assert torch.equal(loaded[name].float(), expected), name


# -- across world sizes, under torchrun ----------------------------------------------------------


@pytest.fixture(scope="module")
def one_process_checkpoint(
    dist_info: DistInfo, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, Any]]:
    """A checkpoint this process saved after ``STEPS`` steps, and its full state and RNG draws."""
    actor = Actor(tiny_llama(), actor_config("tiny"))
    for _ in range(STEPS):
        actor.train_step(global_batch(VOCAB), nll_loss)
    seed_everything(5)
    path = CheckpointManager(tmp_path_factory.mktemp("one")).save(actor, {"world_size": 1})
    return path, {**full_state(actor), "rng": rng_draws()}


@pytest.fixture(scope="module")
def two_process_run(
    tmp_path_factory: pytest.TempPathFactory, one_process_checkpoint: tuple[Path, dict]
) -> Path:
    """The worker's output: 2 ranks saved and exported, then loaded the 1-process checkpoint."""
    out = tmp_path_factory.mktemp("two")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc_per_node", "2", str(WORKER), "--out", str(out)]
    command += ["--load", str(one_process_checkpoint[0])]
    done = run_torchrun(command, timeout=300)
    assert done.returncode == 0, done.stderr[-8000:]
    return out


@pytest.mark.slow
def test_two_process_checkpoint_loads_into_one_process(
    dist_info: DistInfo, two_process_run: Path
) -> None:
    saved = torch.load(two_process_run / "saved.pt")
    manager = CheckpointManager(two_process_run / "ckpts")
    actor = Actor(other_llama(), actor_config("tiny"))
    assert manager.load(manager.latest(), actor) == {"world_size": 2}
    assert rng_draws() == saved.pop("rng")  # rank 0's generators
    assert_same(full_state(actor), saved)


@pytest.mark.slow
def test_one_process_checkpoint_loads_into_two_processes(
    one_process_checkpoint: tuple[Path, dict], two_process_run: Path
) -> None:
    path, expected = one_process_checkpoint
    loaded = torch.load(two_process_run / "loaded.pt")
    assert loaded.pop("extra") == {"world_size": 1}
    assert loaded.pop("rng") == expected["rng"]
    assert loaded.pop("warnings") == [
        [],
        [f"{path} was saved by 1 ranks: rank 1 keeps its own RNG state"],
    ]
    assert_same(loaded, {k: v for k, v in expected.items() if k != "rng"})


@pytest.mark.slow
def test_two_process_export_has_the_gathered_weights(two_process_run: Path) -> None:
    params = torch.load(two_process_run / "saved.pt")["params"]
    weights = load_file(two_process_run / "hf" / "model.safetensors")
    assert weights.keys() == params.keys() - {"lm_head.weight"}
    for name, tensor in weights.items():
        assert torch.equal(tensor, params[name]), name
