"""FP8 training of the policy's linear layers with torchao's float8 (the switch ``actor.fp8``).

Before FSDP2 shards the model, :func:`convert_to_fp8_training` swaps the chosen ``nn.Linear``
modules for torchao's ``Float8Linear``: each forward and backward matmul casts its operands to
float8 (e4m3) with dynamic scales and multiplies them with FP8 kernels (``torch._scaled_mm``);
weights, gradients and optimizer state stay in the master dtype, so checkpoints, weight sync and
parameter names do not change. Two recipes, torchao's own:

* ``tensorwise``: one scale per tensor. The weights are all-gathered in float8 by FSDP2
  (``enable_fsdp_float8_all_gather``), which halves the all-gather traffic of bf16; after every
  optimizer step :func:`after_optimizer_step` computes the next scales of all weights in one
  all-reduce (``precompute_float8_dynamic_scale_for_fsdp``).
* ``rowwise``: one scale per row (power-of-two scales); more accurate with outliers, slower.
  torchao all-gathers float8 only for tensorwise scaling, so these weights travel in bf16.

Which layers (a rule the user can change, :func:`fp8_layer_filter`): every ``nn.Linear`` whose name
matches none of ``actor.fp8_exclude`` (regular expressions; default the LM head, whose logits
feed the log-probs the loss is made of) and whose input and output features are both at least
``actor.fp8_min_features`` and multiples of 16 (``_scaled_mm`` needs that). Embeddings and norms
are not linear layers and stay as they are.

Hardware: FP8 kernels need CUDA with compute capability 8.9 or newer (H100, H200, L4, L40, RTX 40xx);
elsewhere :func:`check_fp8_hardware` refuses with what the machine has. ``actor.fp8_emulate``
selects torchao's emulation (the same casts and scales, matmuls in high precision), which runs on any
device with no speed-up: it is how the CPU tests run this path.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Literal

import torch
from torch import nn

FP8Recipe = Literal["off", "tensorwise", "rowwise"]
MIN_CAPABILITY = (8, 9)
TOKEN_MULTIPLE = 16
"""With FP8 training, a micro-batch's token count is padded to a multiple of this: the weight
gradient's matmul (``grad_output.T @ input``) runs over the tokens, and ``torch._scaled_mm`` takes
only inner dimensions that are multiples of 16 (found on an H200: 3,032 tokens failed)."""


class FP8Unavailable(RuntimeError):
    """FP8 training was asked for where it cannot run (no torchao, no FP8-capable GPU)."""


def check_fp8_hardware(device: torch.device) -> None:
    """Raise :class:`FP8Unavailable` unless ``device`` is a CUDA GPU with FP8 matmuls."""
    if device.type != "cuda":
        found = f"{device.type}; torch.cuda.is_available() is {torch.cuda.is_available()}"
    else:
        capability = torch.cuda.get_device_capability(device)
        if capability >= MIN_CAPABILITY:
            return
        name = torch.cuda.get_device_name(device)
        found = f"{name}, compute capability {capability[0]}.{capability[1]}"
    raise FP8Unavailable(
        "actor.fp8 needs a CUDA GPU of compute capability 8.9 or newer (H100, H200, L4, L40, "
        f"RTX 40xx) for FP8 matmuls; the trainer runs on {found}. Set actor.fp8=off, or "
        "actor.fp8_emulate=true for torchao's emulation (same numerics of the casts, no speed-up)"
    )


def fp8_layer_filter(exclude: Sequence[str], min_features: int) -> Callable[[nn.Module, str], bool]:
    """The rule of the module docstring, as torchao's ``module_filter_fn(module, name)``."""
    patterns = [re.compile(pattern) for pattern in exclude]

    def convert(module: nn.Module, name: str) -> bool:
        if not isinstance(module, nn.Linear):
            return False
        features = (module.in_features, module.out_features)
        if any(f < min_features or f % 16 for f in features):
            return False
        return not any(pattern.search(name) for pattern in patterns)

    return convert


def fp8_layer_names(model: nn.Module, exclude: Sequence[str], min_features: int) -> list[str]:
    """The modules :func:`convert_to_fp8_training` converts, in ``named_modules`` order."""
    convert = fp8_layer_filter(exclude, min_features)
    return [name for name, module in model.named_modules() if convert(module, name)]


def convert_to_fp8_training(
    model: nn.Module,
    recipe: FP8Recipe,
    device: torch.device,
    *,
    emulate: bool = False,
    exclude: Sequence[str] = (),
    min_features: int = 0,
) -> list[str]:
    """Swap the chosen linear layers for ``Float8Linear`` in place; return their names.

    ``recipe``, ``emulate``, ``exclude`` and ``min_features`` are the actor's ``fp8*`` settings
    (:class:`~agentrl.training.actor.ActorConfig`). Call before sharding. Raises
    :class:`FP8Unavailable` without torchao or (unless ``emulate``) an FP8-capable GPU, and
    ``ValueError`` when no layer qualifies.
    """
    if recipe == "off":
        return []
    if not emulate:
        check_fp8_hardware(device)
    names = fp8_layer_names(model, exclude, min_features)
    if not names:
        linear = [m for m in model.modules() if isinstance(m, nn.Linear)]
        sizes = sorted({(m.in_features, m.out_features) for m in linear})
        raise ValueError(
            f"actor.fp8={recipe} converts no layer: none of the linear layers (in, out "
            f"features {sizes}) has both sizes >= actor.fp8_min_features="
            f"{min_features} and multiples of 16 outside actor.fp8_exclude"
        )
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as exc:
        raise FP8Unavailable(
            f"actor.fp8={recipe} needs torchao: pip install 'agentrl[gpu]' ({exc})"
        ) from exc
    if recipe == "tensorwise":
        float8 = Float8LinearConfig(enable_fsdp_float8_all_gather=True, emulate=emulate)
    else:
        float8 = dataclasses.replace(
            Float8LinearConfig.from_recipe_name("rowwise"), emulate=emulate
        )
    convert_to_float8_training(
        model, config=float8, module_filter_fn=fp8_layer_filter(exclude, min_features)
    )
    return names


def after_optimizer_step(model: nn.Module, recipe: FP8Recipe) -> None:
    """Precompute the float8 scales of all-gathered weights (tensorwise) in one all-reduce: after
    every optimizer step, and after a checkpoint load changed the weights under the scales."""
    if recipe == "tensorwise":
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

        precompute_float8_dynamic_scale_for_fsdp(model)


def plain_tensor(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``tensor`` in ``dtype`` as a plain ``torch.Tensor``: torchao's float8 training wraps weights
    in a tensor subclass, which a full state dict keeps and which engines and serialisers
    (safetensors, pickling for an engine) cannot take; it is copied out."""
    if type(tensor) is torch.Tensor:
        return tensor.to(dtype)
    plain = torch.empty(tensor.shape, dtype=dtype, device=tensor.device)
    return plain.copy_(tensor)
