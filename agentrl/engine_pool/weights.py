"""Loading named tensors into a live model: the receiving end of weight sync.

Names are the model's ``state_dict`` keys (``model.layers.0.mlp.down_proj.weight``), which is what
a trainer's ``named_parameters()`` / FSDP2 full state dict yields for the same architecture. Tied
weights answer to every name they are reachable under (``lm_head.weight`` and
``model.embed_tokens.weight`` are one tensor in SmolLM2), so sending either, or both, is fine.

Guarantees: one call is all-or-nothing. Every name and shape is checked before any value is copied,
so a bad bucket leaves the model untouched. A call may cover any subset of the parameters (weights
arrive in buckets); a name may appear once per call. Values are converted to the parameter's dtype
and device by ``Tensor.copy_``. Not covered: checking that the buckets of one update together cover
every parameter; callers that need that compare against :func:`parameter_names`.

Released weights (:func:`release_parameters`): every parameter's storage is resized to 0 bytes
(what FSDP does to unsharded parameters), the parameter keeping its name, shape, dtype and device,
so that names and shapes are checked as before; a released parameter that a call loads gets its
storage back first. :func:`released_parameter_names` says which ones no call has loaded yet: the
model must not compute until it is empty (a released parameter has no memory to read).

Blockwise FP8 (`agentrl.fp8_weights`, SGLang's layout): a call may carry an FP8 ``X.weight`` with
its ``X.weight_scale_inv`` (both in the same call); the pair is dequantised into ``X.weight``. A
weight named in ``fp8_names`` that arrives in full precision is rounded through FP8 on load, so an
engine serving FP8 weights computes with the same values whichever way the sender sent them.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

import torch
from torch import nn

from agentrl.fp8_weights import FP8_DTYPE, dequantize_named_tensors, round_trip


def parameter_names(model: nn.Module) -> list[str]:
    """Every name ``apply_named_tensors`` accepts for ``model`` (its ``state_dict`` keys)."""
    return list(model.state_dict(keep_vars=True))


def apply_named_tensors(
    model: nn.Module,
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    *,
    fp8_names: frozenset[str] = frozenset(),
) -> int:
    """Copy ``named_tensors`` into ``model`` in place; return how many weights were loaded (an
    FP8 weight and its scale count once); a released parameter is allocated again first.

    Raises ``ValueError`` naming the offending entries, before anything is copied, when a name is
    not in the model, appears twice, or a shape differs from the parameter's, or an FP8 weight and
    its scale are not both there.
    """
    targets = model.state_dict(keep_vars=True)  # name -> the live Parameter/buffer
    received = list(named_tensors)
    arrived_fp8 = {name for name, tensor in received if tensor.dtype == FP8_DTYPE}
    try:
        updates = dequantize_named_tensors(received)
    except ValueError as exc:
        raise ValueError(f"cannot load weights, nothing was changed: {exc}") from None
    problems: list[str] = []
    seen: set[str] = set()
    for name, tensor in updates:
        if name in seen:
            problems.append(f"{name!r} appears more than once")
        seen.add(name)
        target = targets.get(name)
        if target is None:
            close = difflib.get_close_matches(name, list(targets), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"unknown name {name!r}{hint}")
        elif tuple(tensor.shape) != tuple(target.shape):
            problems.append(
                f"{name!r} has shape {tuple(tensor.shape)}, the model expects {tuple(target.shape)}"
            )
    if problems:
        shown = "; ".join(problems[:5])
        more = f"; and {len(problems) - 5} more" if len(problems) > 5 else ""
        raise ValueError(f"cannot load weights, nothing was changed: {shown}{more}")
    try:  # before any copy: rounding refuses a non-finite weight, and nothing may change then
        updates = [
            (name, round_trip(t.to(targets[name].dtype)))
            if name in fp8_names and name not in arrived_fp8
            else (name, t)
            for name, t in updates
        ]
    except ValueError as exc:
        raise ValueError(f"cannot load weights, nothing was changed: {exc}") from None
    with torch.no_grad():
        for name, tensor in updates:
            target = targets[name]
            if _released(target):  # its storage comes back with its values
                target.untyped_storage().resize_(target.numel() * target.element_size())
            target.copy_(tensor)
    return len(updates)


def release_parameters(model: nn.Module) -> int:
    """Free the storage of every parameter of ``model`` (buffers stay) for
    :func:`apply_named_tensors` to fill again; return the bytes freed."""
    freed = 0
    with torch.no_grad():
        for parameter in model.parameters():  # a tied parameter once
            if _released(parameter):
                continue
            storage = parameter.untyped_storage()
            size = parameter.numel() * parameter.element_size()
            if (
                not storage.resizable()  # a memory-mapped checkpoint's tensor
                or storage.nbytes() != size  # a view of a larger storage
                or not parameter.is_contiguous()
            ):
                parameter.data = torch.empty_like(parameter, memory_format=torch.contiguous_format)
                storage = parameter.untyped_storage()
            freed += storage.nbytes()
            storage.resize_(0)
    return freed


def released_parameter_names(model: nn.Module) -> list[str]:
    """The parameters released and not loaded since, by every name they answer to."""
    return [n for n, p in model.named_parameters(remove_duplicate=False) if _released(p)]


def _released(tensor: torch.Tensor) -> bool:
    return tensor.numel() > 0 and tensor.untyped_storage().nbytes() == 0


def round_weights_through_fp8(model: nn.Module, names: frozenset[str]) -> None:
    """Replace each parameter in ``names`` by its blockwise-FP8 round trip, in place."""
    targets = model.state_dict(keep_vars=True)
    with torch.no_grad():
        for name in sorted(names):
            targets[name].copy_(round_trip(targets[name].detach()))
