"""apply_named_tensors on a small randomly initialised Llama with tied embeddings (no model load)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from transformers import LlamaForCausalLM

from agentrl.engine_pool.weights import apply_named_tensors, parameter_names


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
