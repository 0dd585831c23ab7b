"""Reading a checkpoint outside its run (`checkpoint_at`, `load_model_weights`): which step a path
names, the policy weights loaded in one process with no process group, bit for bit, and the
refusals of incomplete checkpoints and of a model they do not fit.

The checkpoints are the tiny Llama's, saved by `CheckpointManager` from an FSDP2 actor in a
one-process group that is gone before any test reads them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from checkpoint_worker import other_llama
from fsdp_worker import global_batch, nll_loss, one_process_group, tiny_llama
from transformers import LlamaConfig, LlamaForCausalLM

from agentrl.training.actor import Actor, ActorConfig
from agentrl.training.checkpoint import CheckpointManager, checkpoint_at, load_model_weights

StepWeights = dict[int, dict[str, torch.Tensor]]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, StepWeights]:
    """A checkpoint directory with steps 1 and 2, and the actor's full weights at each."""
    directory = tmp_path_factory.mktemp("run") / "checkpoints"
    weights: StepWeights = {}
    with one_process_group():
        actor = Actor(tiny_llama(), ActorConfig(lr=1e-2))
        manager = CheckpointManager(directory)
        for step in (1, 2):
            actor.train_step(global_batch(64), nll_loss)
            manager.save(actor, {})
            weights[step] = {
                k: v.full_tensor().clone() for k, v in actor.model.state_dict().items()
            }
    return directory, weights


def test_weights_load_bit_for_bit_without_a_process_group(
    checkpoints: tuple[Path, StepWeights],
) -> None:
    directory, weights = checkpoints
    assert not dist.is_initialized()
    for step in (1, 2):
        model = other_llama()
        load_model_weights(directory / f"step_{step:08d}", model)
        state = model.state_dict()
        assert state.keys() == weights[step].keys()
        for name, tensor in weights[step].items():
            assert torch.equal(state[name], tensor), name
        assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied
    assert not torch.equal(weights[1]["lm_head.weight"], weights[2]["lm_head.weight"])

    half = other_llama().to(torch.bfloat16)  # another dtype: the saved float32, rounded
    load_model_weights(directory / "step_00000002", half)
    assert torch.equal(half.lm_head.weight, weights[2]["lm_head.weight"].to(torch.bfloat16))


def test_a_step_or_the_newest_complete_step_of_a_directory(
    checkpoints: tuple[Path, StepWeights], tmp_path: Path
) -> None:
    directory, _ = checkpoints
    assert checkpoint_at(directory / "step_00000001") == directory / "step_00000001"
    assert checkpoint_at(directory) == directory / "step_00000002"
    assert checkpoint_at(tmp_path) is None  # neither a step nor a checkpoint directory
    assert checkpoint_at(tmp_path / "absent") is None

    # Beside complete steps, interrupted saves are passed over, as CheckpointManager.latest does.
    copy = tmp_path / "copy"
    shutil.copytree(directory / "step_00000001", copy / "step_00000001")
    (copy / ".tmp-step_00000003").mkdir()
    (copy / "step_00000004").mkdir()
    shutil.copy(directory / "step_00000002" / ".metadata", copy / "step_00000004")
    assert checkpoint_at(copy) == copy / "step_00000001"


def test_incomplete_checkpoints_are_refused_with_their_path(
    checkpoints: tuple[Path, StepWeights], tmp_path: Path
) -> None:
    directory, _ = checkpoints
    interrupted = tmp_path / "interrupted"
    (interrupted / ".tmp-step_00000003").mkdir(parents=True)
    with pytest.raises(ValueError, match=rf"{interrupted} holds no complete checkpoint"):
        checkpoint_at(interrupted)
    with pytest.raises(ValueError, match=r"\.tmp-step_00000003 is an interrupted save"):
        checkpoint_at(interrupted / ".tmp-step_00000003")

    copied_in_half = tmp_path / "half" / "step_00000002"
    shutil.copytree(directory / "step_00000002", copied_in_half)
    (copied_in_half / "trainer_state.json").unlink()
    with pytest.raises(ValueError, match=rf"{copied_in_half} is not a complete checkpoint"):
        checkpoint_at(copied_in_half)
    with pytest.raises(ValueError, match="holds no complete checkpoint"):
        checkpoint_at(copied_in_half.parent)
    with pytest.raises(ValueError, match="is not a complete checkpoint"):
        load_model_weights(copied_in_half, other_llama())


def test_a_checkpoint_that_does_not_fit_the_model_is_refused_before_loading(
    checkpoints: tuple[Path, StepWeights],
) -> None:
    directory, _ = checkpoints
    step = directory / "step_00000002"
    config = tiny_llama().config.to_dict()
    wider = LlamaForCausalLM(LlamaConfig(**{**config, "intermediate_size": 96}))
    before = {k: v.clone() for k, v in wider.state_dict().items()}
    with pytest.raises(ValueError, match=rf"checkpoint {step} does not fit.*shapes differ: .*mlp"):
        load_model_weights(step, wider)
    assert all(torch.equal(v, before[k]) for k, v in wider.state_dict().items())
    deeper = LlamaForCausalLM(LlamaConfig(**{**config, "num_hidden_layers": 3}))
    with pytest.raises(ValueError, match=r"missing from the checkpoint: \['model\.layers\.2\."):
        load_model_weights(step, deeper)
