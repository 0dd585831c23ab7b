"""Checkpoints of the FSDP2 actor that resume training exactly, and export as a Hugging Face model.

A checkpoint is one directory per optimizer step, ``<directory>/step_00000040/``::

    .metadata, __0_0.distcp, __1_0.distcp, ...  model and optimizer state (torch.distributed.checkpoint)
    rng/rank_00000.json, rng/rank_00001.json ...  each rank's RNG states
    trainer_state.json                          format, step, world size, LR scheduler state, ``extra``

With a critic (``algorithm.advantage=gae``) its model and optimizer state are in the same DCP files
(``critic_model``, ``critic_optim``) and its scheduler in ``trainer_state.json``.

Model and optimizer state (AdamW's ``step``, ``exp_avg``, ``exp_avg_sq`` and param groups) come
from ``get_state_dict`` under the Hugging Face parameter names, and every rank writes its own
shards with ``dcp.save``; ``dcp.load`` reads them back into any world size (resharding), after a
check that the checkpoint's parameter names and full shapes are those of the model. The small,
rank-identical rest is JSON that rank 0 writes: it needs no process group and no torch to read
(``jq .extra trainer_state.json`` shows the data position or the run's config), where inside the
DCP state dict it would be pickled into the metadata. ``extra`` must therefore be JSON-able.

Atomicity: a save writes into ``.tmp-step_00000040/``, and rank 0 renames it to
``step_00000040/`` only after every rank has written its files, so a crash mid-save leaves only a
hidden directory, which the next save deletes. :meth:`CheckpointManager.latest` also requires
``trainer_state.json`` (written last), so a directory copied in half is not complete either.
Saving a step that already has a checkpoint replaces it. Every rank writes into the same
directory: a multi-node job needs a shared filesystem. A failure in rank 0's file operations
raises on every rank rather than leaving the others waiting. Save, load and export may run in a
worker thread (``asyncio.to_thread``): each first makes the rank's CUDA device current there.

Guaranteed after :meth:`CheckpointManager.load` into a freshly built actor of the same model
class: bit-identical weights and optimizer moments, the same optimizer step count and learning
rate schedule position (so the next ``train_step`` gives the same metrics and weights as it would
have without the restart, tested), and each rank's python ``random``, numpy (the global legacy
generator), torch CPU and, on CUDA, its device's RNG state. Not covered: numpy ``Generator`` or
``torch.Generator`` objects the caller creates (put their state in ``extra``), the data loader's
position (``extra`` too), and RNG states of ranks beyond the saving world size (a job that grows
keeps those ranks' own states, with a warning). Optimizer hyperparameters (lr, betas, weight
decay) and the scheduler's base learning rates come from the checkpoint; the schedule's shape
comes from the loading actor's config. Tied weights are stored under each of their names.

:func:`export_hf` writes the current weights as a Hugging Face model directory (config, generation
config, safetensors, tokenizer with its chat template) that ``from_pretrained`` loads; it is not
atomic, and holds the full model in rank 0's CPU memory.

Outside a run (``agentrl eval`` of a checkpoint): :func:`checkpoint_at` finds the complete step a
step or checkpoint directory names, and :func:`load_model_weights` loads its policy weights into
a plain model in one process, with no process group.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
    set_state_dict,
)
from transformers import PreTrainedTokenizerBase

from agentrl.fp8_weights import fp8_weight_names, quantize_named_tensors, sglang_quantization_config
from agentrl.models import save_hf, tied_aliases
from agentrl.training.actor import Actor
from agentrl.training.fp8_training import after_optimizer_step, plain_tensor
from agentrl.training.full_state import engine_parameter_name

FORMAT = 1
STATE_FILE = "trainer_state.json"
RNG_DIR = "rng"
STEP_DIR = re.compile(r"step_(\d{8,})")
TMP_PREFIX = ".tmp-"
OLD_PREFIX = ".old-"
ANY_STEP_DIR = re.compile(
    rf"(?:{re.escape(TMP_PREFIX)}|{re.escape(OLD_PREFIX)})?{STEP_DIR.pattern}"
)
"""A step directory, published or in the middle of a save."""


def resume_from(
    resume: str | Path, checkpoints: CheckpointManager, output_dir: Path
) -> Path | None:
    """The checkpoint ``trainer.resume`` names (``auto``, ``never`` or a directory); refuse to start
    a new run over an old one's metrics in ``output_dir``."""
    from agentrl.config import ConfigError

    if resume == "never":
        path = None
    elif resume == "auto":
        path = checkpoints.latest()
    else:
        path = Path(resume)
        if not path.is_dir():
            raise ConfigError(f"trainer.resume: no checkpoint directory {path}")
    metrics = output_dir / "metrics.jsonl"
    if path is None and metrics.is_file() and metrics.stat().st_size > 0:
        why = "has no checkpoint to resume" if resume == "auto" else "trainer.resume=never"
        raise ConfigError(
            f"trainer.output_dir {output_dir} holds another run's metrics and {why}: "
            f"delete it or choose another output_dir"
        )
    return path


class CheckpointManager:
    """Saves actor checkpoints under ``directory`` and finds the newest complete one.

    After each save the ``keep_last`` highest steps are kept (``None`` keeps all), and the one just
    saved. "Newest" means the highest step: a run resumed from an older checkpoint into the same
    directory leaves the newer ones there, and :meth:`latest` prefers them.
    """

    def __init__(self, directory: str | Path, *, keep_last: int | None = 3) -> None:
        if keep_last is not None and keep_last < 1:
            raise ValueError(f"keep_last must be >= 1 or None, got {keep_last}")
        self.directory = Path(directory)
        self.keep_last = keep_last

    def checkpoints(self) -> list[Path]:
        """Complete checkpoint directories, oldest step first."""
        if not self.directory.is_dir():
            return []
        found = []
        for path in self.directory.iterdir():
            match = STEP_DIR.fullmatch(path.name)
            if match and (path / STATE_FILE).is_file():
                found.append((int(match.group(1)), path))
        return [path for _, path in sorted(found)]

    def latest(self) -> Path | None:
        """The newest complete checkpoint directory, or ``None``."""
        complete = self.checkpoints()
        return complete[-1] if complete else None

    def save(self, actor: Actor, extra: Mapping[str, Any], *, critic: Actor | None = None) -> Path:
        """Collective: every rank calls it. Saves to ``directory/step_{actor.step:08d}/``.

        ``extra`` (JSON-able, rank 0's copy is kept) comes back from :meth:`load`. A ``critic``
        (the value model's actor) is saved beside the policy, in the same files, under
        ``critic_model`` / ``critic_optim``, and its scheduler in ``trainer_state.json``. Returns
        the checkpoint's path; older checkpoints beyond ``keep_last`` are gone when it returns.
        """
        use_device(actor.device)
        rng = rng_state(actor.device)  # first: nothing below may advance a generator unseen
        state = {
            "format": FORMAT,
            "step": actor.step,
            "world_size": actor.dist.world_size,
            "scheduler": actor.scheduler.state_dict(),
            "extra": dict(extra),
        }
        if critic is not None:
            state["critic_scheduler"] = critic.scheduler.state_dict()
        text = json.dumps(state, indent=1)  # raises TypeError on every rank, before any writing
        final = self.directory / f"step_{actor.step:08d}"
        tmp = self.directory / f"{TMP_PREFIX}{final.name}"
        run_on_rank0(self._remove_leftovers)
        write_text(tmp / RNG_DIR / f"rank_{actor.dist.rank:05d}.json", json.dumps(rng))
        model_state, optim_state = get_state_dict(actor.model, actor.optimizer)
        states = {"model": model_state, "optim": optim_state}
        if critic is not None:
            states["critic_model"], states["critic_optim"] = get_state_dict(
                critic.model, critic.optimizer
            )
        dcp.save(states, checkpoint_id=tmp)
        dist.barrier()

        def publish() -> None:
            write_text(tmp / STATE_FILE, text)
            if final.exists():  # a re-save of this step: swap, then drop the old one
                old = self.directory / f"{OLD_PREFIX}{final.name}"
                final.rename(old)
                tmp.rename(final)
                shutil.rmtree(old)
            else:
                tmp.rename(final)
            fsync_directory(self.directory)
            if self.keep_last is not None:
                for path in self.checkpoints()[: -self.keep_last]:
                    if path != final:
                        shutil.rmtree(path)

        run_on_rank0(publish)
        return final

    def load(
        self, path: str | Path, actor: Actor, *, critic: Actor | None = None
    ) -> dict[str, Any]:
        """Collective. Restore model, optimizer, scheduler, ``actor.step`` and this rank's RNG,
        and those of ``critic`` (which the checkpoint must hold: saved with a critic).

        Returns the ``extra`` given to :meth:`save`. Raises ``FileNotFoundError`` if ``path`` is
        not a directory, ``ValueError`` if it is not a complete checkpoint, does not fit the
        actor's model or the critic's, or has no critic for ``critic`` (all before anything
        changes). A checkpoint with a critic loads into a run without one (the critic is left).
        """
        use_device(actor.device)
        path = Path(path)
        state = read_trainer_state(path)
        models = {"": actor} if critic is None else {"": actor, "critic_": critic}
        if critic is not None and "critic_scheduler" not in state:
            raise ValueError(
                f"{path} holds no critic (it was saved by a run without "
                "algorithm.advantage=gae); start this run elsewhere or with trainer.resume=never"
            )
        states: dict[str, Any] = {}
        for prefix, owner in models.items():
            model_state = get_model_state_dict(owner.model)  # this rank's shards, not copies
            check_fits(path, model_state, prefix=f"{prefix}model")
            # An optimizer that has not stepped gets zero moments first (a step at lr 0) to
            # load into.
            states[f"{prefix}model"] = model_state
            states[f"{prefix}optim"] = get_optimizer_state_dict(owner.model, owner.optimizer)
        dcp.load(states, checkpoint_id=path)
        for prefix, owner in models.items():
            set_state_dict(
                owner.model,
                owner.optimizer,
                model_state_dict=states[f"{prefix}model"],
                optim_state_dict=states[f"{prefix}optim"],
            )
            owner.scheduler.load_state_dict(state[f"{prefix}scheduler"])
            owner.step = state["step"]
            after_optimizer_step(owner.model, owner.config.fp8)  # scales of the loaded weights
        rng_file = path / RNG_DIR / f"rank_{actor.dist.rank:05d}.json"
        if rng_file.is_file():
            set_rng_state(json.loads(rng_file.read_text()), actor.device)
        else:
            warnings.warn(
                f"{path} was saved by {state['world_size']} ranks: rank {actor.dist.rank} keeps "
                "its own RNG state",
                stacklevel=2,
            )
        return state["extra"]

    def _remove_leftovers(self) -> None:
        """Delete the hidden directories of interrupted saves (a save is never concurrent)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for path in self.directory.iterdir():
            if path.is_dir() and path.name.startswith((TMP_PREFIX, OLD_PREFIX)):
                shutil.rmtree(path)


def read_trainer_state(path: Path) -> dict[str, Any]:
    """``trainer_state.json`` of the complete checkpoint ``path``. Raises ``FileNotFoundError``
    if ``path`` is not a directory, ``ValueError`` if it is not a complete checkpoint of this
    format."""
    if not path.is_dir():
        raise FileNotFoundError(f"no checkpoint directory at {path}")
    if not (path / STATE_FILE).is_file() or not (path / ".metadata").is_file():
        raise ValueError(
            f"{path} is not a complete checkpoint (no {STATE_FILE} or .metadata): an "
            "interrupted save, or not a step_* directory; CheckpointManager.latest() "
            "returns complete ones only"
        )
    state: dict[str, Any] = json.loads((path / STATE_FILE).read_text())
    if state.get("format") != FORMAT:
        raise ValueError(f"{path}: checkpoint format {state.get('format')}, expected {FORMAT}")
    return state


def checkpoint_at(path: Path) -> Path | None:
    """The complete checkpoint ``path`` names, for reading one outside its run (``agentrl eval``).

    ``path`` itself if it is a step directory (named ``step_*``, or holding ``.metadata`` or
    ``trainer_state.json``); the newest complete step if it is a checkpoint directory (holding
    ``step_*`` directories or interrupted saves), as :meth:`CheckpointManager.latest` chooses;
    ``None`` if it is neither (or not a directory). Raises ``ValueError`` naming the path if what
    it names is not complete: an interrupted save (``.tmp-step_*``), a step without
    ``trainer_state.json``, a checkpoint directory with no complete step.
    """
    if not path.is_dir():
        return None
    if ANY_STEP_DIR.fullmatch(path.name) or any(
        (path / name).exists() for name in (STATE_FILE, ".metadata")
    ):
        if path.name.startswith((TMP_PREFIX, OLD_PREFIX)):
            raise ValueError(
                f"{path} is an interrupted save, not a checkpoint: a save is published as "
                f"step_* once every rank has written; use a complete step_* beside it"
            )
        read_trainer_state(path)
        return path
    steps = sorted(p.name for p in path.iterdir() if ANY_STEP_DIR.fullmatch(p.name))
    if not steps:
        return None
    latest = CheckpointManager(path, keep_last=None).latest()
    if latest is None:
        raise ValueError(
            f"checkpoint directory {path} holds no complete checkpoint (a step_* directory with "
            f"{STATE_FILE}, written last): only {steps}, interrupted saves or partial copies"
        )
    return latest


def load_model_weights(path: Path, model: nn.Module) -> None:
    """Copy the policy weights of the checkpoint ``path`` into ``model``, in this process.

    ``model`` is a plain, unsharded model of the architecture the run trained (e.g. the run's
    ``model.path`` loaded afresh); the checkpoint may come from any number of ranks. No process
    group is needed (``dcp.load(no_dist=True)`` reads every rank's shards), and only the policy's
    weights are read: critic and optimizer state stay on disk. Weights arrive bit for bit in the
    saved dtype (float32) and are rounded by a cast into another. Raises as
    :func:`read_trainer_state`, and ``ValueError`` naming the path and the differences if the
    checkpoint's parameter names or shapes are not the model's, before anything changes.
    """
    read_trainer_state(path)
    state = model.state_dict()  # tensors sharing the parameters' storage: loaded in place
    check_fits(path, state)
    with warnings.catch_warnings():  # that it reads in one process, as asked
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load({"model": state}, checkpoint_id=path, no_dist=True)


def check_fits(path: Path, model_state: Mapping[str, Any], *, prefix: str = "model") -> None:
    """Raise ``ValueError`` unless the checkpoint has exactly the model's names and full shapes
    (under ``prefix``: ``model``, or ``critic_model`` for a critic)."""
    stored = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    head = f"{prefix}."
    saved = {
        k.removeprefix(head): v.size
        for k, v in stored.items()
        if k.startswith(head) and isinstance(v, TensorStorageMetadata)
    }
    wanted = {name: tensor.shape for name, tensor in model_state.items()}  # DTensor: full shape
    missing = sorted(wanted.keys() - saved.keys())
    unexpected = sorted(saved.keys() - wanted.keys())
    shapes = [
        f"{name} {list(saved[name])} in the checkpoint, {list(shape)} in the model"
        for name, shape in wanted.items()
        if name in saved and saved[name] != shape
    ]
    if missing or unexpected or shapes:
        problems = [
            f"missing from the checkpoint: {missing[:5]}{' ...' if len(missing) > 5 else ''}",
            f"not in the model: {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}",
            f"shapes differ: {shapes[:5]}{' ...' if len(shapes) > 5 else ''}",
        ]
        what = "the critic's model" if prefix != "model" else "this model"
        raise ValueError(f"checkpoint {path} does not fit {what}; " + "; ".join(problems))


def rng_state(device: torch.device) -> dict[str, Any]:
    """This process's RNG states as JSON-able values (CUDA: ``device``'s generator only)."""
    _, numpy_keys, numpy_pos, has_gauss, cached = np.random.get_state(legacy=True)
    version, python_state, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "python": [version, list(python_state), gauss_next],
        "numpy": [np.asarray(numpy_keys).tolist(), numpy_pos, has_gauss, cached],
        "torch": torch.get_rng_state().tolist(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device).tolist()
    return state


def set_rng_state(state: Mapping[str, Any], device: torch.device) -> None:
    """Restore what :func:`rng_state` captured (CUDA only when both sides use it)."""
    version, python_state, gauss_next = state["python"]
    random.setstate((version, tuple(python_state), gauss_next))
    keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state(("MT19937", np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(torch.tensor(state["cuda"], dtype=torch.uint8), device)


def export_hf(
    actor_or_model: Actor | nn.Module,
    tokenizer: PreTrainedTokenizerBase | None,
    out_dir: str | Path,
    *,
    dtype: torch.dtype | None = None,
    fp8: bool = False,
    fp8_ignored: Sequence[str] = (),
) -> Path:
    """Collective. Write the current weights as a Hugging Face model directory; returns ``out_dir``.

    Without an initialized process group (one process, an unsharded model, e.g. a model loaded
    from the GGUF that ``save_pretrained`` refuses to write) the weights are written directly.
    Otherwise every rank takes part in gathering the full weights; rank 0 writes ``config.json`` (with the
    original architecture name and ``dtype``), ``generation_config.json``, safetensors and, unless
    ``tokenizer`` is ``None``, the tokenizer files with its chat template. Floating-point weights
    are cast to ``dtype`` if given. Tied weights are written once, under the first name
    ``named_parameters`` yields (``from_pretrained`` ties them again). With ``fp8`` the linear
    weights (but the LM head's and those of ``fp8_ignored``) are written as blockwise FP8 with their
    ``weight_scale_inv``, and ``config.json`` gets the ``quantization_config`` of SGLang's FP8
    checkpoints (`agentrl.fp8_weights`): a checkpoint an SGLang server starts from, to then take
    ``engines.fp8_weights`` updates.
    """
    model = actor_or_model.model if isinstance(actor_or_model, Actor) else actor_or_model
    out_dir = Path(out_dir)
    use_device(next(model.parameters()).device)
    if dist.is_initialized():
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        # rank 0 only; {} on the others
        full = cast("dict[str, torch.Tensor]", get_model_state_dict(model, options=options))
    else:
        full = model.state_dict()

    def write() -> None:
        aliases = tied_aliases(model)
        weights = {
            engine_parameter_name(name): plain_tensor(
                tensor, dtype if dtype and tensor.is_floating_point() else tensor.dtype
            )
            for name, tensor in full.items()
            if name not in aliases
        }
        quantization = None
        if fp8:
            names = {engine_parameter_name(n) for n in fp8_weight_names(model, fp8_ignored)}
            weights = dict(quantize_named_tensors(weights.items(), frozenset(names)))
            quantization = sglang_quantization_config(fp8_ignored)
        save_hf(
            model, weights, out_dir, dtype=dtype, tokenizer=tokenizer, quantization=quantization
        )

    if dist.is_initialized():
        run_on_rank0(write)
    else:
        write()
    return out_dir


def use_device(device: torch.device) -> None:
    """Make ``device`` current for this thread: NCCL collectives run on the current device."""
    if device.type == "cuda":
        torch.cuda.set_device(device)


def run_on_rank0(fn: Callable[[], None]) -> None:
    """Collective: rank 0 runs ``fn``; if it raises, every rank raises (nobody waits forever)."""
    error = None
    if dist.get_rank() == 0:
        try:
            fn()
        except Exception as exc:
            error = exc
    message = [f"{type(error).__name__}: {error}" if error else None]
    dist.broadcast_object_list(message, src=0)
    if error is not None:
        raise error
    if message[0] is not None:
        raise RuntimeError(f"rank 0 failed: {message[0]}")


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (creating its directory) and flush it to disk."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())


def fsync_directory(path: Path) -> None:
    """Make renames inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
