"""Helpers shared by the LocalEngine test modules (imported as ``engine_helpers``, like
tests/tokenization/template_cases.py)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable

import torch
from float_tolerance import assert_within, float32_tolerance
from transformers import PreTrainedModel

ZEROED = "model.layers.3.mlp.down_proj.weight"  # zeroing it removes layer 3's MLP


async def wait_until(condition: Callable[[], bool]) -> None:
    """Poll the event loop until ``condition()`` holds (bounded so a bug fails instead of hanging)."""
    async with asyncio.timeout(120):
        while not condition():
            await asyncio.sleep(0.005)


def reference_logits(model: PreTrainedModel, sequences: list[list[int]]) -> torch.Tensor:
    """``(B, V)`` next-token logits of each sequence from its own full forward pass."""
    with torch.inference_mode():
        return torch.stack([model(torch.tensor([s])).logits[0, -1] for s in sequences])


def assert_logits_as_if_alone(
    model: PreTrainedModel, logits: torch.Tensor, sequences: list[list[int]]
) -> None:
    """``logits`` ``(B, V)`` are each sequence's next-token logits from its own full forward pass,
    float32 rounding aside: within ``float32_tolerance`` of a float64 forward, the tolerance the
    float32 full forward's own error there gives (tests/float_tolerance.py). For small models (it
    makes a float64 copy)."""
    exact = reference_logits(copy.deepcopy(model).double(), sequences)
    atol = float32_tolerance(reference_logits(model, sequences), exact)
    assert_within(logits, exact, atol, "logits against a float64 full forward")


def argmax_loop(model: PreTrainedModel, prompt: list[int], n: int) -> list[int]:
    """Independent greedy reference: a full forward pass per token, no cache, no batching."""
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]
