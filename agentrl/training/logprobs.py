"""Per-token log-probs as the trainer scores them, and the train/inference consistency check.

Which distribution. A token's log-prob is ``log_softmax(logits / T)`` at that token over the full
vocabulary, in float32, with ``T`` the sampling temperature and ``T = 1`` for greedy (``T == 0``)
tokens; top-k / top-p truncation is not applied. Both sides call the one function that defines it,
`agentrl.engine_pool.sampling.temperature_logprobs`: the engine when it reports the log-prob of a
token it sampled, the trainer here. What remains between the two is forward-pass numerics: the
engine decodes incrementally over a KV cache, possibly batched with left padding, while the trainer
runs one full forward pass (and, on GPUs, different kernels or dtypes). `logprob_mismatch` measures
exactly that gap.

Mode. `token_logprobs` runs the model as the caller left it (a trainer: train mode, grad enabled).
`logprob_mismatch` uses train mode without grad, since that is what training sees; with dropout
active, train mode would add dropout noise to the comparison. Llama-family models such as
SmolLM2-135M have ``attention_dropout = 0`` and no dropout layers, so train mode is deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

import torch
from transformers import PreTrainedModel

from agentrl.engine_pool.sampling import temperature_logprobs
from agentrl.training.chunked_logprobs import (
    chunked_token_scores,
    final_hidden_states,
    output_head,
)


def token_logprobs(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    temperature: float,
    attention_mask: torch.Tensor | None = None,
    *,
    chunk_tokens: int | None = None,
) -> torch.Tensor:
    """Log-probs ``(B, T - 1)`` float32 of ``input_ids[:, 1:]`` given their prefixes.

    ``input_ids`` is ``(B, T)`` int64. Entry ``[b, t]`` is ``log_softmax(logits[b, t] / T)`` at
    ``input_ids[b, t + 1]`` (``T = 1`` when ``temperature == 0``). With ``attention_mask`` (``(B,
    T)``, 0 on padding, left or right), position ids count real tokens only, as in the engine;
    entries whose target is padding are meaningless and must be masked by the caller.
    Differentiable when grad is enabled. ``chunk_tokens`` (positive): the LM head and log-softmax
    run that many tokens at a time and are recomputed in the backward, never holding the
    ``(B, T, V)`` logits (:mod:`agentrl.training.chunked_logprobs`); the same values to rounding.
    """
    position_ids = None
    if attention_mask is not None:
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)
    inputs = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "use_cache": False,
    }
    if chunk_tokens:
        hidden = final_hidden_states(model, **inputs)[:, :-1]  # (B, T - 1, H)
        scores = chunked_token_scores(
            hidden.reshape(-1, hidden.shape[-1]),
            output_head(model),
            input_ids[:, 1:].reshape(-1),
            temperature,
            chunk_tokens,
        )
        return scores.logprobs.float().view(input_ids.shape[0], -1)
    logits = model(**inputs).logits  # (B, T, V)
    return temperature_logprobs(logits[:, :-1], input_ids[:, 1:], temperature)


class LogprobMismatch(TypedDict):
    """``|trainer log-prob - engine log-prob|`` over the compared tokens."""

    max_abs: float
    mean_abs: float
    n_tokens: int


def logprob_mismatch(
    model: PreTrainedModel,
    input_ids: Sequence[int],
    engine_logprobs: Sequence[float],
    loss_mask: Sequence[int],
    temperature: float,
) -> LogprobMismatch:
    """Recompute a trajectory's log-probs with a full train-mode forward; compare to the engine's.

    The three sequences are aligned per token: ``engine_logprobs[i]`` is the engine's log-prob of
    ``input_ids[i]`` given ``input_ids[:i]``, and only positions with ``loss_mask[i] == 1`` (tokens
    the engine produced) are compared; other entries of ``engine_logprobs`` are ignored. The model's
    train/eval mode is restored afterwards. Raises ``ValueError`` on misaligned inputs, a masked
    first token (it has no context) or nothing to compare.
    """
    if not len(input_ids) == len(engine_logprobs) == len(loss_mask):
        raise ValueError(
            f"misaligned trajectory: {len(input_ids)} ids, {len(engine_logprobs)} log-probs, "
            f"{len(loss_mask)} mask entries"
        )
    if loss_mask and loss_mask[0]:
        raise ValueError("loss_mask[0] is 1, but the first token has no context to score it")
    positions = [i for i, m in enumerate(loss_mask) if m]
    if not positions:
        raise ValueError("loss_mask selects no tokens; there is nothing to compare")
    was_training = model.training
    model.train()
    try:
        with torch.no_grad():
            ids = torch.tensor([list(input_ids)], dtype=torch.long)  # (1, T)
            trainer = token_logprobs(model, ids, temperature)[0]  # (T - 1,)
    finally:
        model.train(was_training)
    picked = trainer[torch.tensor(positions) - 1]  # trainer[t] scores input_ids[t + 1]
    engine = torch.tensor([engine_logprobs[i] for i in positions], dtype=torch.float32)
    diff = (picked - engine).abs()
    return LogprobMismatch(
        max_abs=float(diff.max()), mean_abs=float(diff.mean()), n_tokens=len(positions)
    )
