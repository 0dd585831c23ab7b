"""apply_named_tensors on a small randomly initialised Llama with tied embeddings (no model load)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from transformers import LlamaForCausalLM

from agentrl.engine_pool.weights import apply_named_tensors, parameter_names
from agentrl.fp8_weights import fp8_weight_names, quantize_blockwise, round_trip, scale_name


@pytest.fixture
def tiny_llama(make_tiny_llama: Callable[..., LlamaForCausalLM]) -> LlamaForCausalLM:
    return make_tiny_llama(tie_word_embeddings=True)


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def test_loads_a_subset_in_place(tiny_llama: LlamaForCausalLM) -> None:
    before = snapshot(tiny_llama)
    name = "model.layers.1.mlp.down_proj.weight"
    new = torch.randn_like(before[name])
    assert apply_named_tensors(tiny_llama, [(name, new)]) == 1
    after = tiny_llama.state_dict()
    assert torch.equal(after[name], new)
    assert all(torch.equal(after[n], before[n]) for n in before if n != name)


def test_tied_weights_answer_to_both_names(tiny_llama: LlamaForCausalLM) -> None:
    assert {"lm_head.weight", "model.embed_tokens.weight"} <= set(parameter_names(tiny_llama))
    new = torch.randn(64, 32)
    apply_named_tensors(tiny_llama, [("lm_head.weight", new)])
    assert torch.equal(tiny_llama.model.embed_tokens.weight, new)


def test_values_are_cast_to_the_parameter_dtype(tiny_llama: LlamaForCausalLM) -> None:
    name = "model.norm.weight"
    apply_named_tensors(tiny_llama, [(name, torch.full((32,), 0.5, dtype=torch.bfloat16))])
    assert tiny_llama.model.norm.weight.dtype == torch.float32
    assert torch.equal(tiny_llama.model.norm.weight, torch.full((32,), 0.5))


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (
            ("model.layers.0.mlp.down_proj.weights", torch.zeros(32, 64)),
            "did you mean 'model.layers.0.mlp.down_proj.weight'",
        ),
        (("model.norm.weight", torch.zeros(33)), r"shape \(33,\), the model expects \(32,\)"),
        (("model.layers.1.mlp.down_proj.weight", torch.zeros(32, 64)), "more than once"),
    ],
)
def test_bad_entries_are_rejected_before_anything_changes(
    tiny_llama: LlamaForCausalLM, bad: tuple[str, torch.Tensor], message: str
) -> None:
    before = snapshot(tiny_llama)
    good = ("model.layers.1.mlp.down_proj.weight", torch.ones(32, 64))
    with pytest.raises(ValueError, match=message):
        apply_named_tensors(tiny_llama, iter([good, bad]))
    assert all(torch.equal(tiny_llama.state_dict()[n], t) for n, t in before.items())


def test_an_fp8_weight_and_its_scale_load_dequantised(tiny_llama: LlamaForCausalLM) -> None:
    name = "model.layers.0.mlp.up_proj.weight"  # (64, 32): one partial 128x128 block
    new = torch.randn(64, 32)
    quantized, scale_inv = quantize_blockwise(new)
    bias = ("model.norm.weight", torch.full((32,), 2.0))
    loaded = apply_named_tensors(
        tiny_llama, [(name, quantized), (scale_name(name), scale_inv), bias]
    )
    assert loaded == 2
    assert torch.equal(tiny_llama.state_dict()[name], round_trip(new))
    assert not torch.equal(round_trip(new), new)


def test_fp8_names_arriving_in_full_precision_are_rounded(tiny_llama: LlamaForCausalLM) -> None:
    names = fp8_weight_names(tiny_llama)
    assert "model.layers.0.self_attn.q_proj.weight" in names
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" not in names
    fp8, full = "model.layers.1.mlp.down_proj.weight", "model.norm.weight"
    new_fp8, new_full = torch.randn(32, 64), torch.randn(32)
    apply_named_tensors(tiny_llama, [(fp8, new_fp8), (full, new_full)], fp8_names=names)
    assert torch.equal(tiny_llama.state_dict()[fp8], round_trip(new_fp8))
    assert torch.equal(tiny_llama.state_dict()[full], new_full)


def test_an_fp8_weight_without_its_scale_changes_nothing(tiny_llama: LlamaForCausalLM) -> None:
    before = snapshot(tiny_llama)
    name = "model.layers.0.mlp.up_proj.weight"
    quantized, _ = quantize_blockwise(torch.randn(64, 32))
    good = ("model.norm.weight", torch.ones(32))
    with pytest.raises(ValueError, match="nothing was changed: unpaired blockwise FP8"):
        apply_named_tensors(tiny_llama, [good, (name, quantized)])
    assert all(torch.equal(tiny_llama.state_dict()[n], t) for n, t in before.items())


def test_a_non_finite_weight_to_round_through_fp8_changes_nothing(
    tiny_llama: LlamaForCausalLM,
) -> None:
    before = snapshot(tiny_llama)
    names = fp8_weight_names(tiny_llama)
    good = ("model.layers.0.mlp.up_proj.weight", torch.randn(64, 32))
    bad = ("model.layers.1.mlp.up_proj.weight", torch.full((64, 32), float("nan")))
    with pytest.raises(ValueError, match=r"nothing was changed: cannot quantise .* nan"):
        apply_named_tensors(tiny_llama, [good, bad], fp8_names=names)
    assert all(torch.equal(tiny_llama.state_dict()[n], t) for n, t in before.items())
