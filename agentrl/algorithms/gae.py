"""Generalised advantage estimation (GAE) for critic-based PPO, as a chunked parallel scan.

Semantics ("High-Dimensional Continuous Control Using Generalized Advantage Estimation", Schulman
et al. 2016), for one trajectory whose *steps* are its loss tokens (mask 1) in order:

    delta_k = r_k + gamma * V_{k+1} - V_k        A_k = delta_k + gamma * lam * A_{k+1}

where ``k + 1`` is the next loss token. Positions with mask 0 (the prompt, tool results and other
environment tokens of a multi-turn trajectory, and padding) are not steps: the chain passes over
them undiscounted, and their advantage and return are 0; rewards and values there are ignored, so
put each reward on a loss token (usually the last one of the turn or trajectory). After the last
loss token the episode is terminal (``V = 0``) unless ``last_values`` bootstraps a truncated one.
Returns are ``A + V``, the critic's regression target.

`gae_reference` is the plain backward loop, in Python floats. `gae` computes the same thing as a
linear reverse scan with constant coefficient ``c = gamma * lam``, in chunks of ``C`` steps: within
a chunk ``A = delta @ M.T`` with ``M[i, j] = c^(j - i)`` for ``j >= i`` (one small matmul for the
whole batch), and the chunks' first entries obey the same kind of recurrence with coefficient
``c^C``, solved by the same method recursively; each chunk then adds ``c^(C - i) * A`` of the next
chunk's head. Cost: ``O(B * T * C)`` flops in ``log_C(T)`` levels, instead of ``T`` sequential
steps. Mask-0 positions are first compacted away (each row's loss tokens moved to its front, in
order), which is what makes the coefficient constant.

Precision: float64 in, float64 out; anything else is computed and returned in float32. The
matmul sums up to ``C`` terms per level, so float32 results differ from the float64 reference by a
few ulps of the largest partial sum; with ``c = 1`` and tens of thousands of tokens that is the
magnitude of the sum of all deltas times ~1e-6.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch


def gae_reference(
    rewards: Sequence[float],
    values: Sequence[float],
    *,
    gamma: float,
    lam: float,
    mask: Sequence[int] | None = None,
    last_value: float = 0.0,
) -> tuple[list[float], list[float]]:
    """Advantages and returns of one trajectory ``(T,)`` by the plain backward recursion.

    ``rewards``, ``values`` and ``mask`` (default: all 1) are per position; see the module
    docstring for what mask 0 means. ``last_value`` is ``V`` after the last loss token (0:
    terminal).
    """
    n = len(rewards)
    mask = [1] * n if mask is None else list(mask)
    if not len(values) == len(mask) == n:
        raise ValueError(f"{n} rewards, {len(values)} values, {len(mask)} mask entries")
    advantages, returns = [0.0] * n, [0.0] * n
    next_value, next_advantage = float(last_value), 0.0
    for t in reversed(range(n)):
        if not mask[t]:
            continue
        delta = float(rewards[t]) + gamma * next_value - float(values[t])
        next_advantage = delta + gamma * lam * next_advantage
        next_value = float(values[t])
        advantages[t] = next_advantage
        returns[t] = next_advantage + next_value
    return advantages, returns


@functools.lru_cache(maxsize=64)
def _discount_matrix(size: int, c: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``M.T`` ``(C, C)``: ``M[i, j] = c^(j - i)`` for ``j >= i``, else 0."""
    idx = torch.arange(size, device=device)
    power = idx[None, :] - idx[:, None]  # (C, C): j - i
    m = torch.where(
        power >= 0,
        torch.pow(torch.tensor(c, dtype=torch.float64, device=device), power.clamp(min=0)),
        0.0,
    )
    return m.T.to(dtype).contiguous()


def discounted_reverse_cumsum(x: torch.Tensor, c: float, chunk: int = 128) -> torch.Tensor:
    """``y[..., t] = sum_{k >= t} c^(k - t) x[..., k]`` over the last dim, by chunked scan.

    ``x`` ``(B, T)`` float; ``c`` in ``[0, 1]``; ``chunk`` >= 2. Same shape and dtype out.
    """
    if chunk < 2:
        raise ValueError(f"chunk must be >= 2, got {chunk}")
    batch, length = x.shape
    if length <= chunk:  # M depends on j - i only: its top-left corner serves shorter inputs
        return x @ _discount_matrix(chunk, c, x.dtype, x.device)[:length, :length]
    n_chunks = -(-length // chunk)
    padded = torch.nn.functional.pad(x, (0, n_chunks * chunk - length))  # zeros change nothing
    local = padded.view(batch, n_chunks, chunk) @ _discount_matrix(chunk, c, x.dtype, x.device)
    # True value at each chunk's head: heads[k] = local[k, 0] + c^C heads[k + 1].
    heads = discounted_reverse_cumsum(local[:, :, 0], c**chunk, chunk)  # (B, n_chunks)
    next_heads = torch.nn.functional.pad(heads[:, 1:], (0, 1))  # (B, n_chunks): 0 after the end
    carry = torch.pow(
        torch.tensor(c, dtype=torch.float64, device=x.device),
        torch.arange(chunk, 0, -1, device=x.device),
    ).to(x.dtype)  # (C,): c^(C - i)
    out = local + next_heads[:, :, None] * carry
    return out.reshape(batch, -1)[:, :length]


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float,
    lam: float,
    last_values: torch.Tensor | None = None,
    chunk: int = 128,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns ``(B, T)`` for a padded batch; see the module docstring.

    ``rewards``, ``values`` ``(B, T)`` float; ``mask`` ``(B, T)`` (bool, int or float, nonzero on
    loss tokens; rows may differ in length and have holes); ``last_values`` ``(B,)``: ``V`` after
    each row's last loss token (default 0, terminal). ``gamma`` and ``lam`` in ``[0, 1]``. No
    gradient flows (values are the critic's, detached). Both outputs are 0 where mask is 0.
    """
    if not 0 <= gamma <= 1 or not 0 <= lam <= 1:
        raise ValueError(f"gamma and lam must lie in [0, 1], got {gamma}, {lam}")
    if rewards.dim() != 2 or values.shape != rewards.shape or mask.shape != rewards.shape:
        raise ValueError(
            f"expected (B, T) rewards, values and mask, got {tuple(rewards.shape)}, "
            f"{tuple(values.shape)}, {tuple(mask.shape)}"
        )
    dtype = torch.float64 if rewards.dtype == torch.float64 else torch.float32
    batch, length = rewards.shape
    on = mask != 0  # (B, T)
    # Compact each row: loss tokens first, in order, then the rest. dest[b, t] = where position t
    # goes; a cumsum, not a sort.
    lengths = on.sum(1, keepdim=True)  # (B, 1)
    step_index = on.cumsum(1) - 1  # (B, T)
    dest = torch.where(
        on, step_index, lengths + torch.arange(length, device=on.device) - step_index - 1
    )
    steps = torch.arange(length, device=on.device) < lengths  # (B, T) compacted: a step
    rv = torch.stack([rewards.detach(), values.detach()]).to(dtype)  # (2, B, T)
    rv = torch.zeros_like(rv).scatter_(2, dest.expand_as(rv), rv)
    r, v = torch.where(steps, rv, 0.0).unbind(0)  # (B, T) each, compacted
    bootstrap = torch.zeros(batch, 1, dtype=dtype, device=rewards.device)
    if last_values is not None:
        if last_values.shape != (batch,):
            raise ValueError(f"last_values must be ({batch},), got {tuple(last_values.shape)}")
        bootstrap = last_values.detach().to(dtype)[:, None]
    # V of the next step; at each row's last step, the bootstrap value.
    next_v = torch.nn.functional.pad(v[:, 1:], (0, 1))  # (B, T)
    next_v = next_v.scatter(1, (lengths - 1).clamp(min=0), bootstrap)
    delta = torch.where(steps, r + gamma * next_v - v, 0.0)  # (B, T)
    adv = discounted_reverse_cumsum(delta, gamma * lam, chunk)  # (B, T) compacted
    out = torch.stack([adv, adv + v]).gather(2, dest.expand(2, -1, -1))  # (2, B, T)
    advantages, returns = torch.where(on, out, 0.0).unbind(0)
    return advantages, returns
