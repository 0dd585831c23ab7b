"""Which weights ``agentrl eval`` serves: what ``model.path`` names, resolved and loaded.

``model.path`` is, checked in this order:

1. ``"smollm2"``, a ``.gguf`` file or a Hugging Face model directory (``config.json`` inside, e.g.
   a run's exported ``hf/``): loaded as training loads it (:mod:`agentrl.models`).
2. A checkpoint step, ``<output_dir>/checkpoints/step_00000040/``
   (:mod:`agentrl.training.checkpoint`), or a checkpoint directory, meaning its newest complete
   step (``CheckpointManager.latest``).
3. A run's ``trainer.output_dir`` (what ``agentrl train`` and ``agentrl sft`` write:
   ``config.yaml``, ``checkpoints/``, ``hf/``): its newest complete checkpoint, else its ``hf/``.
   A finished run saves its last checkpoint and then exports ``hf/`` from the same weights, so
   the two agree; a run interrupted or resumed after an export has a newer checkpoint than
   ``hf/``, and the newest weights are what is evaluated (as verl's checkpoint loading takes the
   latest step).

A checkpoint's policy weights are loaded into its base model: ``model.base`` if given, else the
``model.path`` of the run's ``config.yaml`` (``<output_dir>/config.yaml`` beside ``checkpoints/``),
which also gives the tokenizer and chat template. The critic and optimizer state are not read.

Guaranteed: the weights served are the checkpoint's, bit for bit in float32 (cast to
``engines.dtype`` otherwise), and a directory that is none of the above, an incomplete checkpoint,
an unknown base model or one whose parameter names or shapes differ from the checkpoint's is a
``ValueError`` naming the path and what was expected, raised before the engine starts. Not
guaranteed: that a base model given by hand is the one the run started from (only names and
shapes are checked); a relative ``model.path`` in ``config.yaml`` is read from the current
directory, as the run did.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from agentrl.models import SMOLLM2, load_model
from agentrl.training.checkpoint import checkpoint_at, load_model_weights

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from agentrl.evaluation.config import EvalModelConfig

RUN_CONFIG = "config.yaml"
"""The resolved config a run writes into its output directory."""
RUN_CHECKPOINTS = "checkpoints"
RUN_EXPORT = "hf"


@dataclass(frozen=True)
class Policy:
    """What ``model.path`` resolved to."""

    path: str
    """What is evaluated: ``model.path`` as given, or the checkpoint step or ``hf/`` it named."""
    model: str
    """The model reference loaded (with its tokenizer): the base model of a checkpoint."""
    checkpoint: Path | None = None
    """The checkpoint step whose policy weights replace ``model``'s, if any."""


def resolve_policy(config: EvalModelConfig) -> Policy:
    """Resolve ``config.path`` (see the module docstring); ``ValueError`` if it names nothing
    loadable, an incomplete checkpoint, or a checkpoint whose base model cannot be found."""
    given = config.path
    path = Path(given).expanduser()
    if given == SMOLLM2 or (path.suffix == ".gguf" and path.is_file()) or _is_hf(path):
        return Policy(given, given)
    if not path.is_dir():
        raise ValueError(f"model.path: {given} is neither 'smollm2', a .gguf file nor a directory")
    checkpoint = checkpoint_at(path)
    if checkpoint is None and _is_run(path):
        checkpoint = checkpoint_at(path / RUN_CHECKPOINTS)
        if checkpoint is None:
            if _is_hf(path / RUN_EXPORT):
                return Policy(str(path / RUN_EXPORT), str(path / RUN_EXPORT))
            raise ValueError(
                f"model.path: run directory {given} has no complete checkpoint in "
                f"{RUN_CHECKPOINTS}/ and no exported {RUN_EXPORT}/ model"
            )
    if checkpoint is None:
        raise ValueError(
            f"model.path: {given} is neither a Hugging Face model directory (config.json), a "
            "checkpoint step (step_NNNNNNNN with trainer_state.json), a checkpoint directory "
            f"(step_* inside) nor a run's output directory ({RUN_CHECKPOINTS}/ or {RUN_EXPORT}/ "
            "inside)"
        )
    return Policy(str(checkpoint), config.base or _base_model(checkpoint), checkpoint)


def load_policy(policy: Policy, dtype: str = "float32") -> PreTrainedModel:
    """The model to serve, in ``dtype``: ``policy.model``, with the checkpoint's weights if any.
    ``ValueError`` naming both if the checkpoint does not fit the base model."""
    model = load_model(policy.model, dtype=dtype)
    if policy.checkpoint is not None:
        try:
            load_model_weights(policy.checkpoint, model)
        except ValueError as exc:
            raise ValueError(
                f"{exc} (base model {policy.model}: give the model the run trained as model.base)"
            ) from exc
    return model


def _is_hf(path: Path) -> bool:
    return (path / "config.json").is_file()


def _is_run(path: Path) -> bool:
    return (path / RUN_CHECKPOINTS).is_dir() or (path / RUN_EXPORT).is_dir()


def _base_model(checkpoint: Path) -> str:
    """The ``model.path`` of the run that saved ``checkpoint`` (``<run>/checkpoints/step_*``)."""
    config = checkpoint.parent.parent / RUN_CONFIG
    ask = "pass model.base=<the model the run trained: its model.path>"
    if not config.is_file():
        raise ValueError(
            f"cannot tell which model checkpoint {checkpoint} was trained from: there is no run "
            f"config at {config} (agentrl train and agentrl sft write it); {ask}"
        )
    values = yaml.safe_load(config.read_text())
    base = values.get("model", {}).get("path") if isinstance(values, dict) else None
    if not isinstance(base, str):
        raise ValueError(
            f"{config} has no model.path, so checkpoint {checkpoint}'s base is unknown; {ask}"
        )
    path = Path(base).expanduser()
    if base != SMOLLM2 and not path.exists():
        raise ValueError(
            f"checkpoint {checkpoint} was trained from model.path {base!r} ({config}), which is "
            f"not found from {Path.cwd()}; {ask}"
        )
    return base
