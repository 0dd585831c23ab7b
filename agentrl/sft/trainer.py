"""The SFT loop: packed conversations through the RL trainer's FSDP2 actor, NLL on the loss tokens.

One :class:`SFTTrainer` per process (``torchrun`` starts one per rank; a plain run is a one-process
group). Every rank loads and tokenizes the whole dataset (deterministic, so all ranks agree), and
each step:

1. takes the step's ``trainer.batch_size`` conversations: epoch ``e`` visits the training rows in
   the order ``numpy.random.default_rng([seed, e]).permutation``, so the batch of step ``s`` is a
   function of ``s`` and the data, and a resumed run continues where the checkpoint left off;
2. packs this rank's share (:meth:`~agentrl.training.actor.Actor.micro_batches`, the same equal
   micro-batch counts as RL batches; with ``actor.sequence_parallel`` above 1 a group of ranks
   shares each micro-batch) and takes one :meth:`~agentrl.training.actor.Actor.train_step`
   with :func:`nll_loss`: the loss is the mean negative log-likelihood over the loss tokens of the
   whole batch (all ranks), at temperature 1;
3. logs ``train/loss``, ``train/token_accuracy`` (greedy next-token accuracy on the loss tokens),
   ``train/grad_norm``, ``train/lr``, ``train/epoch`` and throughput to ``metrics.jsonl`` and
   TensorBoard (rank 0), with ``val/loss`` and ``val/token_accuracy`` every
   ``trainer.eval_every`` steps and at the end.

Checkpoints are :class:`~agentrl.training.checkpoint.CheckpointManager`'s (model, optimizer, LR
schedule, RNG; the data position is the step itself), and the run ends with a Hugging Face export
(``output_dir/hf``, chat template included) that ``agentrl train`` takes as ``model.path``.
:meth:`SFTTrainer.request_stop` (Ctrl-C) stops after the step in progress and saves a checkpoint.
"""

from __future__ import annotations

import contextlib
import functools
import math
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import torch
from rich.console import Console
from torch import nn

from agentrl.models import load_model, load_tokenizer
from agentrl.sft.config import SFTConfig
from agentrl.sft.data import TokenizedConversations, load_conversations, tokenize_dataset
from agentrl.tokenization import ChatFormat
from agentrl.training.actor import Actor
from agentrl.training.checkpoint import CheckpointManager, export_hf, resume_from
from agentrl.training.distributed import all_reduce_sum, distributed
from agentrl.training.memory import peak_memory_metrics
from agentrl.training.metrics import MetricsLogger
from agentrl.training.packing import PackedMicroBatch, packed_scores
from agentrl.training.plots import plot_curves
from agentrl.training.progress import TrainProgress

PROGRESS_KEYS = ("train/loss", "val/loss", "train/token_accuracy", "train/grad_norm")
CURVE_KEYS = ("train/loss", "val/loss", "train/token_accuracy", "val/token_accuracy")


def nll_loss(
    model: nn.Module, batch: PackedMicroBatch, *, chunk_tokens: int | None = None
) -> tuple[torch.Tensor, int, dict[str, torch.Tensor]]:
    """``(sum of -log p over the loss tokens, their count, {"token_accuracy": hits})``, the
    :data:`~agentrl.training.actor.LossFn` contract. The LM head runs on the loss tokens only,
    ``chunk_tokens`` of them at a time when set (``actor.logprob_chunk_tokens``:
    :func:`~agentrl.training.packing.packed_scores`)."""
    scores = packed_scores(
        model, batch, 1.0, loss_tokens_only=True, chunk_tokens=chunk_tokens, argmax=True
    )
    assert scores.argmax is not None  # asked for
    hits = (scores.argmax == batch.input_ids[0, scores.scored]).sum()  # (K,) greedy == target
    return -scores.logprobs.sum(), batch.n_loss_tokens, {"token_accuracy": hits}


def batch_indices(seed: int, step: int, rows: int, batch_size: int) -> list[int]:
    """Indices of the rows of optimizer step ``step`` (0-based): epoch ``e`` (of
    ``ceil(rows / batch_size)`` steps) visits every row once, in the order
    ``numpy.random.default_rng([seed, e]).permutation(rows)``; its last batch may be smaller."""
    epoch, position = divmod(step, math.ceil(rows / batch_size))
    order = np.random.default_rng([seed, epoch]).permutation(rows)
    return [int(i) for i in order[position * batch_size : (position + 1) * batch_size]]


@dataclass
class SFTSummary:
    """What :meth:`SFTTrainer.run` did."""

    steps: int
    """Optimizer steps taken in this run."""
    final_step: int
    """The actor's step count at the end (resumed steps included)."""
    interrupted: bool
    checkpoint: Path | None
    exported: Path | None
    last_metrics: dict[str, float] = field(default_factory=dict)


class SFTTrainer:
    """A supervised fine-tuning run (see the module docstring). Use ``with SFTTrainer(c) as t``."""

    def __init__(
        self, config: SFTConfig, *, console: Console | None = None, show_progress: bool = True
    ) -> None:
        self.config = config
        self.console = console or Console()
        self.show_progress = show_progress
        self.output_dir = Path(config.trainer.output_dir)
        self.metrics: MetricsLogger | None = None
        self.stop_requested = False
        self.last_checkpoint_step: int | None = None
        self._group = contextlib.ExitStack()
        """Holds ``distributed()``: close() destroys the process group if setup() made it."""

    def __enter__(self) -> SFTTrainer:
        try:
            self.setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def setup(self) -> None:
        cfg = self.config
        offload = cfg.actor.offload == "cpu"
        self.dist = self._group.enter_context(distributed(cpu_collectives=offload))
        self.is_main = self.dist.is_main
        _seed_everything(cfg.trainer.seed + self.dist.rank)
        self.checkpoints = CheckpointManager(
            self.output_dir / "checkpoints", keep_last=cfg.trainer.keep_checkpoints
        )
        resume_from = self._check_output_dir()
        self.tokenizer = load_tokenizer(cfg.model.path)
        self.train_data, self.val_data = self._load_data(ChatFormat.of(self.tokenizer))
        self.steps_per_epoch = math.ceil(len(self.train_data.rows) / cfg.trainer.batch_size)
        self.total_steps = cfg.trainer.steps or cfg.trainer.epochs * self.steps_per_epoch
        with self._status(f"loading {cfg.model.path}"):
            model = load_model(cfg.model.path, dtype="float32")
        if getattr(model.config, "_attn_implementation", None) != cfg.model.attn_implementation:
            model.set_attn_implementation(cfg.model.attn_implementation)
        self.actor = Actor(model, cfg.actor, dist_info=self.dist)
        if self.is_main and self.actor.sequence_parallel.size > 1:
            self.console.print(self.actor.sequence_parallel.describe())
        self.loss_fn = functools.partial(nll_loss, chunk_tokens=cfg.actor.logprob_chunk_tokens)
        if resume_from is not None:
            self._resume(resume_from)
        if self.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            (self.output_dir / "config.yaml").write_text(cfg.to_yaml())
            self.metrics = MetricsLogger(
                self.output_dir,
                tensorboard=cfg.trainer.tensorboard,
                resume_from_step=self.actor.step if self.actor.step else None,
            )

    def close(self) -> None:
        """Close the metrics, and destroy the process group if setup() made it (idempotent)."""
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        self._group.close()

    def request_stop(self) -> None:
        """Stop after the step in progress (then checkpoint, as at the end)."""
        self.stop_requested = True

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> SFTSummary:
        """Train to ``total_steps`` or a stop request; then validate, checkpoint and export."""
        cfg = self.config.trainer
        first = self.actor.step
        last: dict[str, float] = {}
        with self._progress(first) as progress:
            while self.actor.step < self.total_steps and not self.stop_requested:
                record = self.step()
                every = cfg.eval_every and self.actor.step % cfg.eval_every == 0
                if self.val_data and (every or self.actor.step == self.total_steps):
                    record.update(self.evaluate())
                record.update(peak_memory_metrics())  # this rank's: the first rank's is logged
                self._log(record, progress)
                last = record
                if cfg.checkpoint_every and self.actor.step % cfg.checkpoint_every == 0:
                    self.save_checkpoint()
        interrupted = self.actor.step < self.total_steps
        checkpoint = None
        if self.last_checkpoint_step != self.actor.step and self.actor.step > 0:
            checkpoint = self.save_checkpoint()
        elif self.last_checkpoint_step:
            checkpoint = self.checkpoints.latest()
        if self.is_main:
            plot_curves(
                self.output_dir / "metrics.jsonl",
                self.output_dir / "curves.png",
                keys=CURVE_KEYS,
                title=f"SFT · {self.config.model.path}",
            )
        exported = None
        if cfg.export_hf and not interrupted:
            exported = export_hf(self.actor, self.tokenizer, self.output_dir / "hf")
        return SFTSummary(
            self.actor.step - first,
            self.actor.step,
            interrupted,
            checkpoint,
            exported if self.is_main else None,
            last,
        )

    def batch_rows(self, step: int) -> list[dict[str, list[int]]]:
        """The training conversations of optimizer step ``step`` (0-based; see the module doc)."""
        cfg = self.config.trainer
        chosen = batch_indices(cfg.seed, step, len(self.train_data.rows), cfg.batch_size)
        return [self.train_data.rows[i] for i in chosen]

    def step(self) -> dict[str, float]:
        """One optimizer step on the next batch; returns its metrics (identical on every rank)."""
        start = time.perf_counter()
        step = self.actor.step
        rows = self.batch_rows(step)
        micro_batches = self.actor.micro_batches(rows, self.config.trainer.micro_batch_tokens)
        report = self.actor.train_step(micro_batches, self.loss_fn)
        seconds = time.perf_counter() - start
        tokens = sum(len(row["input_ids"]) for row in rows)
        return {
            "train/loss": report["loss"],
            "train/token_accuracy": report["token_accuracy"],
            "train/grad_norm": report["grad_norm"],
            "train/lr": report["lr"],
            "train/loss_tokens": report["denominator"],
            "train/sequences": float(len(rows)),
            "train/epoch": (step + 1) / self.steps_per_epoch,
            "time/step_s": seconds,
            "throughput/tokens_per_s": tokens / max(seconds, 1e-9),
        }

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean NLL and token accuracy over the validation loss tokens (a collective)."""
        assert self.val_data is not None
        sums = torch.zeros(3, dtype=torch.float64)
        plan = self.actor.micro_batches(self.val_data.rows, self.config.trainer.micro_batch_tokens)
        for micro_batch in plan:
            loss, count, metrics = self.loss_fn(self.actor.model, micro_batch)
            sums += torch.tensor([float(loss), count, float(metrics["token_accuracy"])])
        loss_sum, count, hits = all_reduce_sum(sums).tolist()
        return {"val/loss": loss_sum / count, "val/token_accuracy": hits / count}

    def save_checkpoint(self) -> Path:
        """Save model, optimizer, schedule and RNG (every rank calls it)."""
        extra = {
            "epoch": self.actor.step / self.steps_per_epoch,
            "train_conversations": len(self.train_data.rows),
            "seed": self.config.trainer.seed,
        }
        path = self.checkpoints.save(self.actor, extra)
        self.last_checkpoint_step = self.actor.step
        return path

    # -- set-up helpers ----------------------------------------------------------------------

    def _load_data(
        self, fmt: ChatFormat
    ) -> tuple[TokenizedConversations, TokenizedConversations | None]:
        data = self.config.data
        assert data.path is not None  # SFTConfig.load requires it
        policy = data.template_policy
        train = load_conversations(data.path)
        val = None
        if data.val_path is not None:
            val = load_conversations(data.val_path)
        elif data.val_fraction:
            split = train.train_test_split(
                test_size=data.val_fraction, seed=self.config.trainer.seed
            )
            train, val = split["train"], split["test"]
        tokenize = tokenize_dataset
        train_tokens = tokenize(
            fmt, train, max_tokens=data.max_tokens, policy=policy, where=str(data.path)
        )
        val_tokens = None
        if val is not None:
            where = str(data.val_path or f"{data.path} (validation split)")
            val_tokens = tokenize(fmt, val, max_tokens=data.max_tokens, policy=policy, where=where)
        if self.is_main:
            dropped = train_tokens.dropped_too_long + (
                val_tokens.dropped_too_long if val_tokens else 0
            )
            self.console.print(
                f"data: {len(train_tokens.rows)} training conversations "
                f"({train_tokens.tokens} tokens, {train_tokens.loss_tokens} with loss)"
                + (f", {len(val_tokens.rows)} validation" if val_tokens else "")
                + (f"; {dropped} longer than data.max_tokens left out" if dropped else "")
            )
        return train_tokens, val_tokens

    def _check_output_dir(self) -> Path | None:
        """The checkpoint to resume from; refuse to start a new run over an old one's metrics."""
        return resume_from(self.config.trainer.resume, self.checkpoints, self.output_dir)

    def _resume(self, path: Path) -> None:
        extra = self.checkpoints.load(path, self.actor)
        self.last_checkpoint_step = self.actor.step
        if self.is_main:
            self.console.print(f"resumed from {path} at step {self.actor.step}")
            if extra.get("train_conversations") != len(self.train_data.rows):
                self.console.print(
                    f"[yellow]the checkpoint was trained on {extra.get('train_conversations')} "
                    f"conversations, this data has {len(self.train_data.rows)}: the data order "
                    "differs from the interrupted run's"
                )

    def _log(self, record: Mapping[str, float], progress: TrainProgress | None) -> None:
        if self.metrics is not None:
            self.metrics.log(self.actor.step, record)
        if progress is not None:
            progress.update(self.actor.step, record)

    def _progress(self, first: int) -> contextlib.AbstractContextManager[Any]:
        if not (self.is_main and self.show_progress):
            return contextlib.nullcontext(None)
        return TrainProgress(
            self.total_steps, start_step=first, keys=PROGRESS_KEYS, console=self.console
        )

    def _status(self, text: str) -> contextlib.AbstractContextManager[Any]:
        if not (self.is_main and self.show_progress):
            return contextlib.nullcontext()
        return self.console.status(text)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
