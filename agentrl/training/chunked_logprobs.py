"""Per-token log-probs and entropy from the final hidden states, a chunk of tokens at a time.

The unchunked path runs the LM head over every scored token and keeps the ``(K, V)`` logits, their
float32 copy, the log-softmax and, in the backward, a gradient of each: several ``K x V`` float32
tensors (a 4,096-token micro-batch on a 49,152 vocabulary is 0.8 GB per copy; 32k tokens on
Qwen3's 151,936 is 19.9 GB). :func:`chunked_token_scores` gives the same numbers from the hidden
states ``(N, H)`` and the head ``(V, H)``, ``chunk_tokens`` rows at a time:

* forward, per chunk: ``z = head(h)``, ``s = z / T`` in (at least) float32, ``lse = logsumexp(s)``,
  the log-prob ``s[y] - lse``, optionally the entropy ``-sum p log p`` and the argmax; the chunk's
  logits are freed before the next chunk. Saved for the backward: the hidden states, the head's
  weight and bias (references, no copies), the targets and ``lse`` (and the entropy): ``O(N)``.
* backward, per chunk: the logits are *recomputed* (one more ``chunk x H x V`` matmul, the LM
  head's forward once more: about 7% of SmolLM2's step), then the gradient of the logits in
  closed form, ``(onehot(y) - p) / T`` for the log-prob and ``-p (log p + H) / T`` for the
  entropy, times the incoming gradients, and from it the hidden states' and the head's gradients.

Peak memory beyond the model is ``O(chunk_tokens x V)`` (two or three chunk-sized buffers) plus
``O(N)``, in forward and backward alike, and one ``(V, H)`` buffer for the head's gradient (float32
when the head computes in a narrower dtype, so that chunks accumulate without bfloat16 rounding).

Why a custom :class:`torch.autograd.Function` and not ``torch.utils.checkpoint`` per chunk: the
checkpointed chunk would replay autograd's generic graph (the float32 copy, the division, the
log-softmax, the gather, the entropy's products), each with its own ``chunk x V`` saved tensor and
gradient, and would accumulate the head's gradient chunk by chunk in the parameter's own dtype
(bfloat16 under mixed precision). The closed-form backward holds fewer chunk-sized buffers,
accumulates in float32, and is checked against autograd of the unchunked formulas
(tests/training/test_chunked_logprobs.py: values and gradients to 1e-6 in float64).

Guaranteed: the same values as :func:`~agentrl.engine_pool.sampling.temperature_logprobs` and
:func:`~agentrl.algorithms.losses.entropy_from_logits` of ``head(hidden)`` (``T = 1`` for greedy,
``T == 0``), to rounding; gradients with respect to the hidden states, the head's weight and bias.
Not guaranteed: bit-equality with the unchunked path (sums run in another order), nor anything
for models whose logits are not ``lm_head(last_hidden_state)`` (:data:`LOGIT_TRANSFORMS` are
refused).

FSDP2. The LM head is not an FSDP unit of its own here: it belongs to the root's parameter group
(:func:`~agentrl.training.actor.shard_model`), which the root's forward all-gathers and, with
``reshard_after_forward=False``, keeps unsharded until the root's post-backward reduce-scatter.
So :func:`final_hidden_states` runs the *root* forward (its hooks fire), and the head's weight
read after it is the plain unsharded parameter; the gradient this function returns for it is
accumulated into that parameter's ``.grad``, which FSDP2's post-backward reduce-scatters as it
would the unchunked path's. A weight that is still a ``DTensor`` (a head sharded as its own unit,
or read outside the root's forward) is refused rather than silently all-gathered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from agentrl.engine_pool.sampling import logprob_temperature

LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")
"""Config attributes of models whose logits are not ``lm_head(last_hidden_state)`` (Gemma 2's
soft-capping, Cohere's and Granite's scaling): the chunked path refuses them."""


class TokenScores(NamedTuple):
    """Per-token results of :func:`chunked_token_scores`, each ``(N,)``."""

    logprobs: torch.Tensor
    """``log_softmax(head(h) / T)[y]``, float32 (float64 for float64 inputs); differentiable."""
    entropy: torch.Tensor | None
    """``-sum p log p`` of ``softmax(head(h) / T)``, when asked; differentiable."""
    argmax: torch.Tensor | None
    """The most likely token (int64, first of ties, as ``torch.argmax``), when asked."""


def chunked_token_scores(
    hidden: torch.Tensor,
    head: nn.Module,
    targets: torch.Tensor,
    temperature: float,
    chunk_tokens: int,
    *,
    entropy: bool = False,
    argmax: bool = False,
) -> TokenScores:
    """Log-probs of ``targets`` (and the entropy, the argmax) under ``softmax(head(hidden) / T)``,
    ``chunk_tokens`` tokens at a time, recomputing each chunk's logits in the backward (see the
    module docstring). ``hidden`` is ``(N, H)``, ``targets`` ``(N,)`` int64, ``head`` an
    ``nn.Linear(H, V)`` (the model's output embeddings; tied or not); ``T = 1`` when
    ``temperature == 0``. Raises ``ValueError`` for bad shapes, ``chunk_tokens < 1``, a head that is
    no linear layer, or a sharded (``DTensor``) head weight."""
    if not isinstance(head, nn.Linear):
        raise ValueError(f"the LM head must be an nn.Linear, got {type(head).__name__}")
    if isinstance(head.weight, DTensor):
        raise ValueError(
            "the LM head's weight is a sharded DTensor: read it inside the FSDP root's forward "
            "and backward (final_hidden_states), where the root keeps it unsharded"
        )
    if hidden.dim() != 2 or hidden.shape[1] != head.in_features:
        raise ValueError(f"hidden must be (N, {head.in_features}), got shape {tuple(hidden.shape)}")
    if targets.shape != hidden.shape[:1]:
        raise ValueError(
            f"targets must be ({hidden.shape[0]},) like hidden's rows, got {tuple(targets.shape)}"
        )
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be at least 1, got {chunk_tokens}")
    logprobs, ent, top = _ChunkedHeadScores.apply(
        hidden,
        head.weight,
        head.bias,
        targets,
        logprob_temperature(temperature),
        chunk_tokens,
        entropy,
        argmax,
    )
    return TokenScores(logprobs, ent if entropy else None, top if argmax else None)


class _ChunkedHeadScores(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,  # (N, H)
        weight: torch.Tensor,  # (V, H)
        bias: torch.Tensor | None,  # (V,)
        targets: torch.Tensor,  # (N,) int64
        temperature: float,
        chunk: int,
        want_entropy: bool,
        want_argmax: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = hidden.shape[0]
        score_dtype = torch.promote_types(hidden.dtype, torch.float32)
        logprobs = hidden.new_empty(n, dtype=score_dtype)
        lse = hidden.new_empty(n, dtype=score_dtype)
        entropy = hidden.new_empty(n if want_entropy else 0, dtype=score_dtype)
        top = targets.new_empty(n if want_argmax else 0)
        for part in _chunks(n, chunk):
            logits = F.linear(hidden[part], weight, bias)  # (C, V)
            if want_argmax:
                top[part] = logits.argmax(-1)
            scaled = logits.to(score_dtype).div_(temperature)  # (C, V), in place when float32
            del logits
            lse[part] = torch.logsumexp(scaled, -1)
            picked = scaled.gather(-1, targets[part, None])[:, 0]
            logprobs[part] = picked - lse[part]
            if want_entropy:
                log_p = scaled.sub_(lse[part, None])  # (C, V) in place
                entropy[part] = -(log_p.exp() * log_p).sum(-1)
        ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.mark_non_differentiable(top)
        ctx.set_materialize_grads(False)
        return logprobs, entropy, top

    @staticmethod
    def backward(
        ctx: Any, grad_logprobs: torch.Tensor | None, grad_entropy: torch.Tensor | None, _: Any
    ) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
        if entropy.numel() == 0:
            grad_entropy = None
        wants_hidden, wants_weight, wants_bias = ctx.needs_input_grad[:3]
        accumulate = torch.promote_types(weight.dtype, torch.float32)
        grad_hidden = torch.zeros_like(hidden) if wants_hidden else None
        grad_weight = torch.zeros_like(weight, dtype=accumulate) if wants_weight else None
        grad_bias = None
        if wants_bias and bias is not None:
            grad_bias = torch.zeros_like(bias, dtype=accumulate)
        if grad_logprobs is None and grad_entropy is None:
            return _grads(grad_hidden, grad_weight, grad_bias, weight, bias)
        temperature = ctx.temperature
        for part in _chunks(hidden.shape[0], ctx.chunk):
            h = hidden[part]  # (C, H)
            logits = F.linear(h, weight, bias)  # (C, V), recomputed
            log_p = logits.to(lse.dtype).div_(temperature).sub_(lse[part, None])
            del logits
            probs = log_p.exp()  # (C, V)
            # grad: d loss / d (logits / T), (C, V), built in the buffers already held
            if grad_entropy is not None:  # dH/ds = -p (log p + H)
                grad = log_p.add_(entropy[part, None]).mul_(probs)
                grad.mul_(-grad_entropy[part, None])
                if grad_logprobs is not None:
                    grad.sub_(probs.mul_(grad_logprobs[part, None]))
            else:  # d log p_y / ds = onehot(y) - p
                assert grad_logprobs is not None  # not both None: returned above
                del log_p
                grad = probs.mul_(-grad_logprobs[part, None])
            if grad_logprobs is not None:
                grad.scatter_add_(-1, targets[part, None], grad_logprobs[part, None])
            del probs
            grad_logits = grad.div_(temperature).to(weight.dtype)  # (C, V)
            if grad_hidden is not None:
                grad_hidden[part] = grad_logits @ weight
            if grad_weight is not None:
                _accumulate(grad_weight, grad_logits.t(), h)
            if grad_bias is not None:
                grad_bias += grad_logits.sum(0)
        return _grads(grad_hidden, grad_weight, grad_bias, weight, bias)


def _chunks(n: int, most: int) -> list[slice]:
    """``ceil(n / most)`` slices of ``[0, n)`` of near-equal sizes (at most ``most``), so no chunk
    is a small remainder: CPU BLAS reduces a product of fewer than 8 rows over ``V`` in a less
    accurate order (15x the rounding of the hidden states' gradient on SmolLM2's head)."""
    if n == 0:
        return []
    count = -(-n // most)
    size = -(-n // count)
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]


def _accumulate(total: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``total += a @ b``, in ``total``'s dtype when the operands have it (no copy)."""
    if a.dtype == total.dtype:
        total.addmm_(a, b)
    else:  # a bfloat16 product per chunk, summed in float32
        total += a @ b


def _grads(
    grad_hidden: torch.Tensor | None,
    grad_weight: torch.Tensor | None,
    grad_bias: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
) -> tuple[torch.Tensor | None, ...]:
    if grad_weight is not None:
        grad_weight = grad_weight.to(weight.dtype)
    if grad_bias is not None and bias is not None:
        grad_bias = grad_bias.to(bias.dtype)
    return grad_hidden, grad_weight, grad_bias, None, None, None, None, None


def output_head(model: nn.Module) -> nn.Linear:
    """The model's LM head (``get_output_embeddings()``), checked to be all its logits are: an
    ``nn.Linear`` and no :data:`LOGIT_TRANSFORMS` in the model's config."""
    config = getattr(model, "config", None)
    for name in LOGIT_TRANSFORMS:
        value = getattr(config, name, None)
        if value not in (None, 1, 1.0):
            raise ValueError(
                f"{type(model).__name__} sets config.{name}={value!r}: its logits are not "
                "lm_head(hidden states); set actor.logprob_chunk_tokens=0 (the unchunked path)"
            )
    get_head: Callable[[], Any] | None = getattr(model, "get_output_embeddings", None)
    head = get_head() if get_head is not None else None
    if not isinstance(head, nn.Linear):
        raise ValueError(
            f"{type(model).__name__} has no linear output embeddings (LM head) to chunk"
        )
    return head


def final_hidden_states(model: nn.Module, **inputs: Any) -> torch.Tensor:
    """The decoder's last hidden states ``(B, T, H)`` (after the final norm: what the LM head
    reads), from the model's own forward with ``inputs`` and an empty ``logits_to_keep``, so the LM
    head runs on no position. Running the root forward (not the decoder alone) is what lets FSDP2
    gather the root's parameters and reduce their gradients (the module docstring)."""
    get_decoder: Callable[[], Any] | None = getattr(model, "get_decoder", None)
    decoder = get_decoder() if get_decoder is not None else None
    if not isinstance(decoder, nn.Module):
        raise ValueError(f"{type(model).__name__} has no decoder (get_decoder) to read")
    seen: list[torch.Tensor] = []

    def keep(_module: nn.Module, _args: Any, output: Any) -> None:
        state = getattr(output, "last_hidden_state", None)
        seen.append(state if state is not None else output[0])

    handle = decoder.register_forward_hook(keep)
    try:
        nothing = torch.zeros(0, dtype=torch.long, device=inputs["input_ids"].device)
        model(**inputs, logits_to_keep=nothing)
    finally:
        handle.remove()
    if len(seen) != 1:
        raise ValueError(f"the decoder ran {len(seen)} times in one forward; expected once")
    return seen[0]
