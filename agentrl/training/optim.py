"""AdamW with decoupled weight decay on matrices only, and the warmup + decay learning-rate schedule.

The schedule is a pure function of the optimizer step, so its values are exact and testable:
step ``s`` (0-based: the first ``optimizer.step()`` is step 0) uses ``lr * lr_factor(s, ...)``.

* warmup: ``(s + 1) / warmup_steps`` for ``s < warmup_steps`` (the first step is not at lr 0);
* then ``"constant"``: 1; ``"cosine"``: from 1 down to ``min_lr_ratio`` at ``total_steps``, by
  ``min_lr_ratio + (1 - min_lr_ratio) * (1 + cos(pi * p)) / 2`` with
  ``p = (s - warmup_steps) / (total_steps - warmup_steps)`` clamped to ``[0, 1]``; ``"linear"``:
  ``min_lr_ratio + (1 - min_lr_ratio) * (1 - p)``.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Literal

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

LRSchedule = Literal["constant", "cosine", "linear"]


def lr_factor(
    step: int,
    *,
    warmup_steps: int,
    schedule: LRSchedule,
    total_steps: int | None = None,
    min_lr_ratio: float = 0.0,
) -> float:
    """Multiplier of the base learning rate at optimizer step ``step`` (see the module docstring)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if total_steps is None or total_steps <= warmup_steps:
        raise ValueError(f"schedule {schedule!r} needs total_steps > warmup_steps ({warmup_steps})")
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    if schedule == "cosine":
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    elif schedule == "linear":
        decay = 1.0 - progress
    else:
        raise ValueError(f"unknown lr schedule {schedule!r}")
    return min_lr_ratio + (1.0 - min_lr_ratio) * decay


def build_adamw(
    model: nn.Module,
    *,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
) -> torch.optim.AdamW:
    """AdamW over ``model``'s trainable parameters; weight decay only on tensors with ``ndim >= 2``.

    Norm scales and biases (``ndim < 2``) are not decayed, as in GPT-style training. The fused
    implementation is used: it takes FSDP2's DTensor parameters on CPU and GPU, and on the CPU it
    steps several times faster than the foreach one (docs/performance.md).
    """
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for param in (p for p in model.parameters() if p.requires_grad):
        (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        [g for g in groups if g["params"]], lr=lr, betas=betas, eps=eps, fused=True
    )


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    warmup_steps: int,
    schedule: LRSchedule,
    total_steps: int | None,
    min_lr_ratio: float,
) -> LambdaLR:
    """A ``LambdaLR`` applying :func:`lr_factor`; call ``scheduler.step()`` after each update."""
    factor = partial(
        lr_factor,
        warmup_steps=warmup_steps,
        schedule=schedule,
        total_steps=total_steps,
        min_lr_ratio=min_lr_ratio,
    )
    return LambdaLR(optimizer, factor)
