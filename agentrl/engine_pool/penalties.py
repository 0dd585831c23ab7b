"""SGLang's sampling penalties: the logits a request samples from, given the tokens it generated.

Four ``SamplingParams`` keys reshape the next-token logits before the temperature, top-k and
top-p; each reads only the tokens this request has *generated* (the prompt never counts), as
SGLang 0.5.23's ``sglang/srt/sampling/penaltylib`` does:

* ``frequency_penalty`` ``f``: ``f`` times the number of times a token was generated is subtracted
  from its logit (``BatchedFrequencyPenalizer``);
* ``presence_penalty`` ``p``: ``p`` is subtracted from the logit of every token generated at least
  once (``BatchedPresencePenalizer``);
* ``min_new_tokens`` ``m``: while fewer than ``m`` tokens were generated, the stop ids (the
  request's ``stop_token_ids`` and the engine's end-of-sequence ids) get ``-inf``
  (``BatchedMinNewTokensPenalizer``);
* ``repetition_penalty`` ``r``: the logit ``l`` of a token generated before becomes ``l / r`` when
  positive, ``l * r`` when negative (``BatchedRepetitionPenalizer``).

The additive three are summed into one term and added first, the scaling one applied after: the
order of SGLang's default (overlap) scheduler, ``SamplingBatchInfo.update_penalties`` then
``_apply_pre_grammar_logits_transforms``. The sums are taken in SGLang's order (one addition per
generated token), so the penalized logits equal SGLang's bit for bit
(``tests/engine_pool/test_penalties.py`` runs SGLang's own penalizers on the same inputs).

The sampler then draws from, and reports the log-probs of, the penalized logits, as SGLang does.
The trainer recomputes log-probs from the model's logits alone, so RL rollouts do not offer these
keys; they serve other frameworks' SGLang clients (``agentrl serve``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from agentrl.engine_pool.engine import SamplingParams


def penalized_logits(
    logits: torch.Tensor,
    rows: Sequence[tuple[SamplingParams, Sequence[int]]],
    eos_token_ids: Collection[int],
) -> torch.Tensor:
    """The logits ``(B, V)`` each row samples from: ``logits`` itself when no row is penalized,
    else a float32 copy with each penalized row reshaped (see the module docstring).

    ``rows[i]`` is row ``i``'s sampling parameters and the token ids it generated so far;
    ``eos_token_ids`` are the engine's end-of-sequence ids (blocked by ``min_new_tokens`` with the
    row's ``stop_token_ids``, whether or not the row ignores end-of-sequence).
    """
    if len(rows) != logits.shape[0]:
        raise ValueError(f"{logits.shape[0]} logit rows, {len(rows)} rows of sampling parameters")
    if not any(sampling.penalized for sampling, _ in rows):
        return logits
    out = logits.float().clone()
    vocab = out.shape[1]
    for row, (sampling, generated) in enumerate(rows):
        if sampling.penalized:
            out[row] = _penalize_row(out[row], sampling, generated, eos_token_ids, vocab)
    return out


def _penalize_row(
    logits: torch.Tensor,
    sampling: SamplingParams,
    generated: Sequence[int],
    eos_token_ids: Collection[int],
    vocab: int,
) -> torch.Tensor:
    device = logits.device
    ids = torch.tensor(list(generated), dtype=torch.int64, device=device)
    additive = torch.zeros(vocab, dtype=torch.float32, device=device)
    if sampling.frequency_penalty != 0.0 and ids.numel():
        # float32 additions in generation order, as SGLang's one scatter_add_ per decode step
        each = torch.full(ids.shape, sampling.frequency_penalty, dtype=torch.float32, device=device)
        additive.sub_(torch.zeros_like(additive).scatter_add_(0, ids, each))
    if sampling.presence_penalty != 0.0 and ids.numel():
        presence = torch.zeros_like(additive)
        presence[ids] = torch.tensor(sampling.presence_penalty, dtype=torch.float32)
        additive.sub_(presence)
    if len(generated) < sampling.min_new_tokens:
        stop = {*sampling.stop_token_ids, *eos_token_ids}
        blocked = torch.tensor(sorted(t for t in stop if 0 <= t < vocab), dtype=torch.int64)
        additive[blocked.to(device)] = float("-inf")
    logits = logits + additive
    if sampling.repetition_penalty != 1.0 and ids.numel():
        scale = torch.ones(vocab, dtype=torch.float32, device=device)
        scale[ids] = sampling.repetition_penalty
        logits = torch.where(logits < 0, logits * scale, logits / scale)
    return logits
