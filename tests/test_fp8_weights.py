"""Blockwise FP8 weights: the layout SGLang loads, the round trip's error bound, bucket conversion."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from agentrl.fp8_weights import (
    FP8_DTYPE,
    FP8_MAX,
    dequantize_blockwise,
    dequantize_named_tensors,
    fp8_weight_names,
    quantize_blockwise,
    quantize_named_tensors,
    round_trip,
    scale_name,
    sglang_quantization_config,
)


@pytest.mark.parametrize("shape", [(128, 128), (256, 384), (576, 1536), (1, 1), (130, 7)])
def test_the_layout_is_sglangs(shape: tuple[int, int]) -> None:
    weight = torch.randn(shape)
    quantized, scale_inv = quantize_blockwise(weight)
    assert quantized.dtype == FP8_DTYPE and quantized.shape == weight.shape
    assert scale_inv.dtype == torch.float32
    assert scale_inv.shape == (math.ceil(shape[0] / 128), math.ceil(shape[1] / 128))
    # weight[i, j] ~ quantized[i, j] * weight_scale_inv[i // 128, j // 128], element by element
    i = torch.arange(shape[0]).unsqueeze(1) // 128
    j = torch.arange(shape[1]).unsqueeze(0) // 128
    by_hand = quantized.float() * scale_inv[i, j]
    assert torch.equal(by_hand, dequantize_blockwise(quantized, scale_inv))


def test_each_blocks_largest_element_maps_to_the_fp8_maximum() -> None:
    weight = torch.randn(256, 256)
    weight[:128, :128] *= 1000  # blocks have independent scales
    quantized, scale_inv = quantize_blockwise(weight)
    for bi in range(2):
        for bj in range(2):
            block = weight[bi * 128 : (bi + 1) * 128, bj * 128 : (bj + 1) * 128]
            q_block = quantized[bi * 128 : (bi + 1) * 128, bj * 128 : (bj + 1) * 128].float()
            assert q_block.abs().max() == FP8_MAX
            assert scale_inv[bi, bj] == pytest.approx(float(block.abs().max()) / FP8_MAX)


def test_values_fp8_holds_exactly_come_back_exactly() -> None:
    grid = torch.tensor([0.0, 0.5, -1.0, 2.0, 448.0, -448.0, 0.001953125, 3.5, 104.0, 0.0])
    weight = grid.repeat(16).view(16, 10) * 2.0**-7  # a power-of-two scale keeps them exact
    assert torch.equal(round_trip(weight), weight)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 300),
    cols=st.integers(1, 300),
    log_scale=st.floats(-12, 6),
    seed=st.integers(0, 2**31 - 1),
)
def test_the_round_trip_error_is_within_the_bound(
    rows: int, cols: int, log_scale: float, seed: int
) -> None:
    """|w - deq(q(w))| <= max(2**-4 |w|, 2**-10 * scale) for every element (module docstring)."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(rows, cols, generator=generator) * 10.0**log_scale
    weight[torch.rand(rows, cols, generator=generator) < 0.05] = 0.0
    quantized, scale_inv = quantize_blockwise(weight)
    back = dequantize_blockwise(quantized, scale_inv)
    scale = scale_inv.repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :cols]
    bound = torch.maximum(weight.abs() * 2.0**-4, scale * 2.0**-10)
    error = (weight - back).abs()
    assert bool((error <= bound * (1 + 1e-6)).all()), float((error / bound).max())
    assert bool((back[weight == 0] == 0).all())


def test_an_all_zero_block_round_trips_to_zero() -> None:
    weight = torch.zeros(200, 130)
    weight[150:, 129] = 3.0
    back = round_trip(weight)
    assert torch.equal(back[:128, :128], torch.zeros(128, 128))
    assert torch.equal(back, weight)


def test_bfloat16_weights_come_back_in_bfloat16() -> None:
    weight = torch.randn(64, 96, dtype=torch.bfloat16)
    back = round_trip(weight)
    assert back.dtype == torch.bfloat16
    assert torch.allclose(back.float(), weight.float(), rtol=2**-4, atol=1e-6)


@pytest.mark.parametrize(
    "weight, message",
    [
        (torch.randn(4, 4, 4), "2-D"),
        (torch.tensor([[1.0, float("inf")]]), "inf or nan"),
        (torch.tensor([[1.0, float("nan")]]), "inf or nan"),
    ],
)
def test_bad_weights_are_refused(weight: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        quantize_blockwise(weight)


def test_a_scale_of_the_wrong_shape_is_refused() -> None:
    quantized, scale_inv = quantize_blockwise(torch.randn(256, 256))
    with pytest.raises(ValueError, match=r"needs \(2, 2\)"):
        dequantize_blockwise(quantized, scale_inv[:1])


class _TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(50, 16)
        self.layers = nn.ModuleList(
            nn.ModuleDict({"q_proj": nn.Linear(16, 16), "up_proj": nn.Linear(16, 32)})
            for _ in range(2)
        )
        self.norm = nn.LayerNorm(16)
        self.lm_head = nn.Linear(16, 50, bias=False)

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head


def test_linear_weights_but_the_head_are_quantised() -> None:
    model = _TinyLM()
    assert fp8_weight_names(model) == {
        f"layers.{i}.{p}.weight" for i in range(2) for p in ("q_proj", "up_proj")
    }
    assert fp8_weight_names(model, ignored=["layers.0", "layers.1.up_proj"]) == {
        "layers.1.q_proj.weight"
    }
    assert fp8_weight_names(model, ignored=["layers.1.up"]) == fp8_weight_names(model)


def test_a_bucket_round_trips_through_the_sglang_names() -> None:
    model = _TinyLM()
    names = fp8_weight_names(model)
    bucket = list(model.state_dict().items())
    sent = list(quantize_named_tensors(bucket, names))
    sent_names = [n for n, _ in sent]
    assert "layers.0.q_proj.weight_scale_inv" in sent_names
    assert "layers.0.q_proj.bias_scale_inv" not in sent_names
    assert len(sent) == len(bucket) + len(names)
    assert dict(sent)["layers.0.q_proj.weight"].dtype == FP8_DTYPE
    assert dict(sent)["lm_head.weight"].dtype == torch.float32
    received = dict(dequantize_named_tensors(sent))
    assert list(received) == [n for n, _ in bucket]
    for name, tensor in bucket:
        expected = round_trip(tensor) if name in names else tensor
        assert torch.equal(received[name], expected), name


def test_a_bucket_with_a_weight_and_no_scale_is_refused() -> None:
    quantized, scale_inv = quantize_blockwise(torch.randn(8, 8))
    with pytest.raises(ValueError, match=r"'a.weight' has no weight_scale_inv"):
        dequantize_named_tensors([("a.weight", quantized)])
    with pytest.raises(ValueError, match=r"'b.weight_scale_inv' has no FP8 weight"):
        dequantize_named_tensors([("b.weight_scale_inv", scale_inv)])
    with pytest.raises(ValueError, match="not a weight name"):
        scale_name("a.bias")


def test_the_quantization_config_is_what_sglang_reads() -> None:
    config = sglang_quantization_config(ignored=["model.layers.0.mlp"])
    # Fp8Config.from_config: "fp8" in quant_method -> an FP8-serialised checkpoint; block quant
    # requires activation_scheme "dynamic" and a two-element weight_block_size
    assert config["quant_method"] == "fp8"
    assert config["activation_scheme"] == "dynamic"
    assert config["weight_block_size"] == [128, 128]
    assert config["ignored_layers"] == ["model.layers.0.mlp"]
