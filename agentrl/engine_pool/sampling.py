"""Turning next-token logits into sampled tokens and their log-probs, one row per request.

Which distribution a log-prob refers to (the trainer uses the same function, so both sides agree):

* The policy at temperature ``T`` is ``softmax(logits / T)`` over the full vocabulary, computed in
  float32. :func:`temperature_logprobs` returns ``log_softmax(logits / T)`` of given tokens; the
  engine reports it for every sampled token and the trainer's
  :func:`agentrl.training.logprobs.token_logprobs` recomputes it from a full forward pass.
* Greedy decoding (``T == 0``) has no softmax of its own; its log-probs are taken at ``T = 1``
  (:func:`logprob_temperature`), and the trainer must score such tokens at ``T = 1`` as well.
* top-k, top-p and min-p only restrict which tokens may be *sampled*, as SGLang's sampler does:
  without min-p, top-k and top-p jointly (a token is kept when it is among the ``top_k`` most likely
  and the tokens more likely than it hold less than ``top_p`` of the whole distribution: SGLang's
  ``filter_apply_order="joint"`` on a GPU, and its PyTorch sampler); with min-p, top-k, then top-p
  on the renormalised remainder, then min-p (SGLang's ``min_p_sampling_from_probs`` path). The
  reported log-prob stays that of the untruncated distribution, as in verl and slime, because that
  is what the trainer can recompute from logits alone.

Each request samples with its own ``torch.Generator``; a row's token depends only on its own
logits, parameters and generator state, never on the other rows of the batch. Sampling is an
exponential race (as vLLM's sampler does it): row ``i`` draws ``E ~ Exp(1)`` per token from its
generator, and the batch picks ``argmax(p / E)`` in one operation, which samples token ``j`` with
probability ``p_j``. A ``torch.multinomial`` per row, synchronised per row, took 175 of every 190 ms
of a 128-row decode step on the CPU and capped the engine at ~600 tokens/s on an H200.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agentrl.engine_pool.engine import SamplingParams


def logprob_temperature(temperature: float) -> float:
    """The temperature log-probs are computed at: ``temperature``, or 1 for greedy (0)."""
    return temperature if temperature > 0 else 1.0


def temperature_logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, temperature: float
) -> torch.Tensor:
    """``log_softmax(logits / T)`` at ``token_ids``, in float32, with ``T = logprob_temperature``.

    ``logits`` is ``(..., V)`` and ``token_ids`` is ``(...)`` int64; the result is ``(...)``.
    Differentiable: the trainer calls it on logits that require grad.
    """
    scaled = logits.float() / logprob_temperature(temperature)  # (..., V)
    picked = scaled.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)  # (...)
    return picked - torch.logsumexp(scaled, dim=-1)


def filtered_probs(
    scaled_logits: torch.Tensor, top_k: int, top_p: float, min_p: float = 0.0
) -> torch.Tensor:
    """Probabilities ``(V,)`` of one row after top-k, top-p and min-p filtering (sums to 1).

    ``scaled_logits`` are already divided by the temperature. ``top_k == 0``, ``top_p == 1`` and
    ``min_p == 0`` disable their filter; at least the most likely token always survives. Without
    min-p, top-k and top-p filter jointly, both measured on the whole distribution (SGLang's
    sampler without min-p); with it, SGLang's min-p order: top-k and top-p renormalise one after
    the other, then min-p keeps the tokens at least ``min_p`` times as likely as the most likely one
    (a ratio renormalising does not change).
    """
    probs = torch.softmax(scaled_logits.float(), dim=-1)  # (V,)
    if min_p == 0:
        return _joint_top_k_top_p(probs, top_k, top_p)
    if 0 < top_k < probs.numel():
        keep = torch.zeros_like(probs, dtype=torch.bool)
        keep[torch.topk(probs, top_k).indices] = True
        probs = torch.where(keep, probs, 0.0)
        probs = probs / probs.sum()
    if top_p < 1.0:  # on the renormalised remainder
        probs = _joint_top_k_top_p(probs, 0, top_p)
    if min_p > 0:
        probs = torch.where(probs >= min_p * probs.max(), probs, 0.0)
        probs = probs / probs.sum()
    return probs


def _joint_top_k_top_p(probs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """``probs`` ``(V,)`` keeping the tokens among the ``top_k`` most likely whose more likely
    tokens hold less than ``top_p`` of the mass, renormalised."""
    sorted_probs, order = torch.sort(probs, descending=True)
    keep = torch.ones_like(sorted_probs, dtype=torch.bool)  # (V,) in sorted order
    if top_p < 1.0:  # at 1, float32's cumulative sum may reach 1 before the last tokens
        keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < top_p
    if 0 < top_k < probs.numel():
        keep[top_k:] = False
    sorted_probs = torch.where(keep, sorted_probs, 0.0)
    probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    return probs / probs.sum()


def request_generator(
    sampling: SamplingParams, device: torch.device | str = "cpu"
) -> torch.Generator | None:
    """A request's own generator on ``device`` (where its logits are), seeded from
    ``sampling.seed`` (or randomly); None if greedy. A seed gives the same tokens on the same
    kind of device only: CUDA's random streams differ from the CPU's."""
    if sampling.greedy:
        return None
    generator = torch.Generator(device=device)
    if sampling.seed is None:
        generator.seed()
    else:
        generator.manual_seed(sampling.seed)
    return generator


def sample_next_tokens(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> tuple[list[int], list[float]]:
    """Sample one token per row of ``logits`` ``(B, V)``; return the tokens and their log-probs.

    Row ``i`` uses ``params[i]`` and draws from ``generators[i]`` (which may be ``None`` only for
    greedy rows). Log-probs follow :func:`temperature_logprobs` (see the module docstring).
    """
    if not len(params) == len(generators) == logits.shape[0]:
        raise ValueError(
            f"{logits.shape[0]} logit rows, {len(params)} params, {len(generators)} generators"
        )
    temperatures = torch.tensor(
        [logprob_temperature(p.temperature) for p in params], device=logits.device
    )
    scaled = logits.float() / temperatures.unsqueeze(1)  # (B, V): one pass for every row
    log_norm = torch.logsumexp(scaled, dim=-1)  # (B,)
    greedy = [p.greedy for p in params]
    if all(greedy):
        index = logits.argmax(-1)  # (B,)
    else:
        index = _exponential_race(scaled, log_norm, params, generators)
        if any(greedy):
            is_greedy = torch.tensor(greedy, device=logits.device)
            index = torch.where(is_greedy, logits.argmax(-1), index)
    index = index.unsqueeze(1)  # (B, 1)
    picked = scaled.gather(1, index).squeeze(1)  # (B,)
    logprobs = picked - log_norm  # temperature_logprobs, batched
    return index.squeeze(1).tolist(), logprobs.tolist()


def _exponential_race(
    scaled: torch.Tensor,
    log_norm: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> torch.Tensor:
    """Each sampled row's token ``(B,)``: ``argmax(p / E)`` over its filtered probabilities
    ``p`` (``softmax(scaled)``, ``log_norm`` its log-sum-exp), with ``E = -log U`` and ``U``
    drawn from the row's generator; a greedy row's entry is meaningless (the caller takes its
    argmax)."""
    probs = (scaled - log_norm.unsqueeze(1)).exp_()  # (B, V): softmax(scaled)
    uniform = torch.full_like(probs, 0.5)  # (B, V): each row's U(0, 1) draws; greedy rows keep 0.5
    for row, (sampling, generator) in enumerate(zip(params, generators, strict=True)):
        if sampling.greedy:
            continue
        if generator is None:
            raise ValueError("a sampled (temperature > 0) row needs a torch.Generator")
        if 0 < sampling.top_k < probs.shape[1] or sampling.top_p < 1.0 or sampling.min_p > 0:
            probs[row] = filtered_probs(scaled[row], sampling.top_k, sampling.top_p, sampling.min_p)
        uniform[row].uniform_(generator=generator)  # no sync: a fill on the row's device
    # Exp(1) = -log U, batched (torch's exponential_ is six times slower per row on the CPU);
    # U is kept above 0 so that no token's wait is infinite
    waits = uniform.clamp_(min=torch.finfo(uniform.dtype).tiny).log_().neg_()
    return (probs / waits).argmax(-1)
