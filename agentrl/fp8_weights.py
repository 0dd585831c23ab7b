"""Blockwise FP8 weights for rollout engines, in the layout of SGLang's FP8 checkpoints.

The layout (SGLang ``python/sglang/srt/layers/quantization/fp8.py``: ``Fp8Config.from_config`` and
``Fp8LinearMethod.create_fp8_weight_``, for a checkpoint whose ``quantization_config`` has
``quant_method: "fp8"``, ``activation_scheme: "dynamic"`` and ``weight_block_size: [128, 128]``,
the format of DeepSeek-V3 and Qwen3-FP8):

* a linear layer's ``weight`` ``(N, K)`` (out, in) is stored as ``torch.float8_e4m3fn``;
* beside it, ``weight_scale_inv`` ``(ceil(N / 128), ceil(K / 128))`` float32 holds one scale per
  128x128 block, the last row and column of blocks possibly partial;
* the real weight is ``weight[i, j] * weight_scale_inv[i // 128, j // 128]``: despite its name the
  stored scale *multiplies* to dequantise (it is the inverse of the quantisation scale).

Here each block's scale is ``amax(|block|) / 448`` (448 is e4m3fn's largest finite value), so the
block's largest element maps to +-448 and nothing saturates. What is quantised: the weights of
``nn.Linear`` modules (SGLang quantises ``LinearBase`` layers only), never the input embeddings or
the LM head (``ParallelLMHead`` is an embedding there), minus layers the user names in ``ignored``
(SGLang's ``ignored_layers``: a module name or a prefix of it).

Error bound (tested): e4m3fn keeps 3 mantissa bits, so a value in the normal range is rounded to
within ``2**-4`` of itself (relative); values below the smallest normal (``2**-6`` times the
block's scale) are rounded to the nearest multiple of ``2**-9`` times the scale. So for every
element ``|w - dequantize(quantize(w))| <= max(2**-4 * |w|, 2**-10 * scale)``.

:func:`quantize_named_tensors` turns a weight-sync bucket into this layout, and
:func:`dequantize_named_tensors` back (the receiving end of a rollout engine that computes in
bf16/fp32 with FP8-rounded weights, as `agentrl.engine_pool.local_engine.LocalEngine` does with
``fp8_weights=True``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence

import torch
from torch import nn

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448.0
BLOCK = (128, 128)
SCALE_SUFFIX = "weight_scale_inv"
_MIN_AMAX = 1e-12  # an all-zero block gets a tiny scale instead of a division by zero


def quantize_blockwise(
    weight: torch.Tensor, block: tuple[int, int] = BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` ``(N, K)`` -> ``(fp8 (N, K), weight_scale_inv (ceil(N/bn), ceil(K/bk)) float32)``.

    Raises ``ValueError`` for a tensor that is not 2-D or not finite (an inf or nan would poison its
    whole block's scale).
    """
    if weight.dim() != 2:
        raise ValueError(f"blockwise FP8 quantises 2-D weights, got shape {tuple(weight.shape)}")
    if not bool(torch.isfinite(weight).all()):
        raise ValueError("cannot quantise a weight holding inf or nan values")
    rows, cols = weight.shape
    blocked = _to_blocks(weight.float(), block)  # (Nb, Kb, bn, bk)
    amax = blocked.abs().amax(dim=(-2, -1)).clamp(min=_MIN_AMAX)  # (Nb, Kb)
    scale_inv = amax / FP8_MAX
    quantized = (blocked / scale_inv[..., None, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return _from_blocks(quantized, rows, cols), scale_inv


def dequantize_blockwise(
    quantized: torch.Tensor,
    scale_inv: torch.Tensor,
    block: tuple[int, int] = BLOCK,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The weight ``quantized * scale_inv`` (each scale over its block), in ``dtype``.

    Raises ``ValueError`` when ``scale_inv``'s shape is not ``(ceil(N/bn), ceil(K/bk))``.
    """
    rows, cols = quantized.shape
    expected = (math.ceil(rows / block[0]), math.ceil(cols / block[1]))
    if tuple(scale_inv.shape) != expected:
        raise ValueError(
            f"weight_scale_inv has shape {tuple(scale_inv.shape)}; a {rows}x{cols} weight in "
            f"{block[0]}x{block[1]} blocks needs {expected}"
        )
    blocked = _to_blocks(quantized.float(), block)  # (Nb, Kb, bn, bk)
    return _from_blocks(blocked * scale_inv.float()[..., None, None], rows, cols).to(dtype)


def round_trip(weight: torch.Tensor, block: tuple[int, int] = BLOCK) -> torch.Tensor:
    """``weight`` as an FP8 engine computes with it: quantised, then dequantised to its dtype."""
    return dequantize_blockwise(*quantize_blockwise(weight, block), block, dtype=weight.dtype)


def fp8_weight_names(model: nn.Module, ignored: Sequence[str] = ()) -> frozenset[str]:
    """Parameter names the FP8 layout quantises: every ``nn.Linear`` weight but the LM head's.

    A module is left out when its name equals an entry of ``ignored`` or starts with one followed
    by a dot (``"model.layers.0"`` leaves out that whole layer), as SGLang's ``ignored_layers``.
    """
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    names = set()
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or module is head:
            continue
        if any(name == prefix or name.startswith(prefix + ".") for prefix in ignored):
            continue
        names.add(f"{name}.weight")
    return frozenset(names)


def quantize_named_tensors(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    names: frozenset[str],
    block: tuple[int, int] = BLOCK,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Each tensor named in ``names`` as its FP8 ``weight`` followed by its ``weight_scale_inv``;
    the others unchanged."""
    for name, tensor in named_tensors:
        if name not in names:
            yield name, tensor
            continue
        quantized, scale_inv = quantize_blockwise(tensor, block)
        yield name, quantized
        yield scale_name(name), scale_inv


def dequantize_named_tensors(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    block: tuple[int, int] = BLOCK,
    dtype: torch.dtype = torch.float32,
) -> list[tuple[str, torch.Tensor]]:
    """The inverse of :func:`quantize_named_tensors` for one bucket: every FP8 ``weight`` and its
    ``weight_scale_inv`` become one ``dtype`` weight; other tensors pass unchanged.

    Raises ``ValueError`` naming every FP8 weight without its scale and every scale without its
    weight in the same call (a bucket must hold both), before converting anything.
    """
    tensors = list(named_tensors)
    scales = {name: t for name, t in tensors if name.endswith("." + SCALE_SUFFIX)}
    fp8 = {name for name, t in tensors if t.dtype == FP8_DTYPE}
    unpaired = sorted(
        [f"{n!r} has no {SCALE_SUFFIX}" for n in fp8 if scale_name(n) not in scales]
        + [f"{n!r} has no FP8 weight" for n in scales if weight_name(n) not in fp8]
    )
    if unpaired:
        raise ValueError(f"unpaired blockwise FP8 tensors: {'; '.join(unpaired)}")
    return [
        (
            name,
            dequantize_blockwise(t, scales[scale_name(name)], block, dtype) if name in fp8 else t,
        )
        for name, t in tensors
        if name not in scales
    ]


def scale_name(weight: str) -> str:
    """``model.layers.0.mlp.up_proj.weight`` -> ``model.layers.0.mlp.up_proj.weight_scale_inv``."""
    if not weight.endswith(".weight"):
        raise ValueError(f"{weight!r} is not a weight name (ends in .weight)")
    return weight[: -len("weight")] + SCALE_SUFFIX


def weight_name(scale: str) -> str:
    """The weight a ``weight_scale_inv`` belongs to."""
    return scale[: -len(SCALE_SUFFIX)] + "weight"


def sglang_quantization_config(
    ignored: Sequence[str] = (), block: tuple[int, int] = BLOCK
) -> dict[str, object]:
    """The ``quantization_config`` of a ``config.json`` that SGLang loads as this layout."""
    config: dict[str, object] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": list(block),
    }
    if ignored:
        config["ignored_layers"] = list(ignored)
    return config


def _to_blocks(matrix: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """``(N, K)`` -> ``(Nb, Kb, bn, bk)``, zero-padded up to whole blocks."""
    bn, bk = block
    rows, cols = matrix.shape
    nb, kb = math.ceil(rows / bn), math.ceil(cols / bk)
    padded = torch.nn.functional.pad(matrix, (0, kb * bk - cols, 0, nb * bn - rows))
    return padded.view(nb, bn, kb, bk).transpose(1, 2)


def _from_blocks(blocked: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """``(Nb, Kb, bn, bk)`` -> ``(N, K)``, the padding cut off."""
    nb, kb, bn, bk = blocked.shape
    return blocked.transpose(1, 2).reshape(nb * bn, kb * bk)[:rows, :cols].contiguous()
