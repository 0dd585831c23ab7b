"""`agentrl eval` of a run's checkpoint (`agentrl.evaluation.policy`): a step, a checkpoint
directory or a run's output directory, resolved to a step and loaded into the run's base model,
and served by the engine bit for bit; and the refusals of what it cannot load.

Runs are laid out as `agentrl train` writes them (``config.yaml`` from a real `TrainConfig`,
``checkpoints/step_*`` from `CheckpointManager`, ``hf/`` from `export_hf`), with checkpoints of an
FSDP2 actor in a one-process group that is gone before any test reads them: SmolLM2 after one
training step for the engine and the command, the tiny Llama for the rest."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import yaml
from fsdp_worker import global_batch, nll_loss, one_process_group, tiny_llama
from model_ref import MODEL
from transformers import LlamaConfig, LlamaForCausalLM

from agentrl.cli import main
from agentrl.engine_pool import LocalEngine
from agentrl.evaluation.config import EvalModelConfig
from agentrl.evaluation.policy import Policy, load_policy, resolve_policy
from agentrl.rl.config import TrainConfig
from agentrl.training.actor import Actor, ActorConfig
from agentrl.training.checkpoint import CheckpointManager, export_hf

Weights = dict[str, torch.Tensor]


def train_run(run: Path, model: torch.nn.Module, base: str, steps: list[int]) -> list[Weights]:
    """Write ``run`` as `agentrl train` does: its config, a checkpoint after each step in
    ``steps`` (an ``hf/`` export before the last one when there are several, as a run resumed
    after finishing leaves), and return the actor's full weights at each checkpoint."""
    config = TrainConfig.build(
        "test", {"model": {"path": base}, "trainer": {"output_dir": str(run)}}
    )
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(config.to_yaml())
    saved = []
    with one_process_group():
        actor = Actor(model, ActorConfig(lr=1e-3))
        manager = CheckpointManager(run / "checkpoints")
        for step in steps:
            if step == steps[-1] and len(steps) > 1:
                export_hf(actor, None, run / "hf")
            while actor.step < step:
                actor.train_step(global_batch(64), nll_loss)
            manager.save(actor, {})
            saved.append({k: v.full_tensor().clone() for k, v in actor.model.state_dict().items()})
    return saved


def printed(text: str, capsys: pytest.CaptureFixture[str]) -> bool:
    """Whether ``text`` was printed, wherever the console wrapped it."""
    return "".join(text.split()) in "".join(capsys.readouterr().out.split())


def assert_weights(model: torch.nn.Module, expected: Weights) -> None:
    state = model.state_dict()
    assert state.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(state[name], tensor), name


@pytest.fixture(scope="module")
def smollm2_run(tmp_path_factory: pytest.TempPathFactory, smollm2) -> tuple[Path, Weights]:
    """A SmolLM2 run with one checkpoint, after one step; the weights it holds."""
    import copy

    run = tmp_path_factory.mktemp("smollm2") / "run"
    (saved,) = train_run(run, copy.deepcopy(smollm2), MODEL, [1])
    return run, saved


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Weights]]:
    """A tiny Llama run (base: a Hugging Face directory) with steps 1 and 3, and ``hf/`` from 1."""
    root = tmp_path_factory.mktemp("tiny")
    tiny_llama().save_pretrained(root / "base")
    saved = train_run(root / "run", tiny_llama(), str(root / "base"), [1, 3])
    return root / "run", saved


@pytest.mark.slow
async def test_the_engine_serves_the_checkpoint_bit_for_bit(
    smollm2_run, smollm2, tokenizer
) -> None:
    run, saved = smollm2_run
    assert not dist.is_initialized()
    step = run / "checkpoints" / "step_00000001"
    policy = resolve_policy(EvalModelConfig(path=str(step)))
    assert policy == Policy(str(step), MODEL, step)  # the base from the run's config.yaml
    model = load_policy(policy)
    assert_weights(model, saved)
    query = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(smollm2.state_dict()[query], saved[query])  # the step changed it
    async with LocalEngine(model, tokenizer=tokenizer) as engine:
        for name in (query, "lm_head.weight", "model.norm.weight"):
            held = await engine.get_weights_by_name(name, truncate_size=10**6)
            assert torch.equal(held, saved[name]), name


@pytest.mark.slow
def test_agentrl_eval_of_a_checkpoint_step(smollm2_run, tmp_path, capsys) -> None:
    run, _ = smollm2_run
    step = run / "checkpoints" / "step_00000001"
    path = tmp_path / "eval.yaml"
    values = {
        "env": {"id": "agentrl/Math-v0", "kwargs": {"answer_format": "flexible"}},
        "sampling": {"max_new_tokens": 8, "max_total_tokens": 512},
        "eval": {"k": 1, "max_tasks": 2, "concurrency": 2, "output_dir": str(tmp_path / "out")},
    }
    path.write_text(yaml.safe_dump(values))
    assert main(["eval", str(path), f"model.path={step}"]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["Math-v0"]["episodes"] == 2
    recorded = json.loads((tmp_path / "out" / "eval_config.json").read_text())
    assert recorded["model"]["path"] == str(step)  # what was evaluated, kept for resuming

    # A checkpoint is not pushed to servers: refused before anything starts.
    urls = "engines.urls=[http://127.0.0.1:9]"
    assert main(["eval", str(path), f"model.path={run}", urls]) == 2
    assert printed(f"names checkpoint {step}, but engines.urls", capsys)


def test_a_checkpoint_directory_and_a_run_directory_mean_the_newest_step(
    tiny_run, tmp_path
) -> None:
    run, (first, newest) = tiny_run
    step_1, step_3 = (run / "checkpoints" / f"step_{n:08d}" for n in (1, 3))
    for given in (run / "checkpoints", run):  # the run also has hf/, from step 1: older
        policy = resolve_policy(EvalModelConfig(path=str(given)))
        assert policy.checkpoint == step_3 and policy.path == str(step_3)
    assert_weights(load_policy(policy), newest)
    assert_weights(load_policy(resolve_policy(EvalModelConfig(path=str(step_1)))), first)
    assert resolve_policy(EvalModelConfig(path=str(run / "hf"))) == Policy(
        str(run / "hf"), str(run / "hf")
    )
    assert_weights(load_policy(resolve_policy(EvalModelConfig(path=str(run / "hf")))), first)

    exported_only = tmp_path / "exported"  # a run whose checkpoints were deleted
    shutil.copytree(run / "hf", exported_only / "hf")
    (exported_only / "checkpoints").mkdir()
    assert resolve_policy(EvalModelConfig(path=str(exported_only))).path == str(
        exported_only / "hf"
    )


def test_what_is_not_a_model_nor_a_complete_checkpoint_is_named(tiny_run, tmp_path, capsys):
    run, _ = tiny_run

    def refused(path: Path, match: str) -> None:
        with pytest.raises(ValueError, match=match):
            resolve_policy(EvalModelConfig(path=str(path)))

    (tmp_path / "empty").mkdir()
    refused(tmp_path / "empty", rf"{tmp_path / 'empty'} is neither a Hugging Face model directory")
    refused(tmp_path / "absent", r"absent is neither 'smollm2', a \.gguf file nor a directory")
    config = tmp_path / "eval.yaml"
    config.write_text(yaml.safe_dump({"eval": {"output_dir": str(tmp_path / "out")}}))
    assert main(["eval", str(config), f"model.path={tmp_path / 'empty'}"]) == 2
    assert printed("is neither a Hugging Face model directory", capsys)

    interrupted = tmp_path / "interrupted"  # a run killed during its first save
    (interrupted / "checkpoints" / ".tmp-step_00000004").mkdir(parents=True)
    shutil.copy(run / "config.yaml", interrupted / "config.yaml")
    for given in (interrupted, interrupted / "checkpoints"):
        refused(given, rf"{interrupted / 'checkpoints'} holds no complete checkpoint")
    refused(interrupted / "checkpoints" / ".tmp-step_00000004", "is an interrupted save")
    half = interrupted / "checkpoints" / "step_00000003"
    shutil.copytree(run / "checkpoints" / "step_00000003", half)
    (half / "trainer_state.json").unlink()
    refused(half, rf"{half} is not a complete checkpoint \(no trainer_state\.json")


def test_the_base_model_comes_from_the_run_or_model_base(tiny_run, tmp_path) -> None:
    run, (_, newest) = tiny_run
    moved = tmp_path / "copied" / "step_00000003"  # a step taken out of its run
    shutil.copytree(run / "checkpoints" / "step_00000003", moved)
    with pytest.raises(ValueError, match=rf"{moved}.*no run config at .*pass model\.base="):
        resolve_policy(EvalModelConfig(path=str(moved)))
    base = str(run.parent / "base")
    policy = resolve_policy(EvalModelConfig(path=str(moved), base=base))
    assert policy == Policy(str(moved), base, moved)
    assert_weights(load_policy(policy), newest)

    elsewhere = tmp_path / "relative"  # config.yaml names a model.path not found from here
    shutil.copytree(run / "checkpoints", elsewhere / "checkpoints")
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["model"]["path"] = "runs/sft/hf"
    (elsewhere / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match=r"model\.path 'runs/sft/hf' .*not found .*model\.base="):
        resolve_policy(EvalModelConfig(path=str(elsewhere)))

    wider = tmp_path / "wider"  # a base the checkpoint does not fit
    config = tiny_llama().config.to_dict()
    LlamaForCausalLM(LlamaConfig(**{**config, "hidden_size": 48})).save_pretrained(wider)
    policy = resolve_policy(EvalModelConfig(path=str(moved), base=str(wider)))
    with pytest.raises(ValueError, match=rf"checkpoint {moved} does not fit .*base model {wider}"):
        load_policy(policy)
