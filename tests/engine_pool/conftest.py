"""Engine fixtures; the shared SmolLM2 model and tokenizer come from tests/conftest.py."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase


@pytest.fixture(scope="session")
def chat_prompt(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """A short ChatML prompt (about 30 tokens) ending with the assistant header."""
    messages = [{"role": "user", "content": "Name three colours."}]
    return list(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    )


@pytest.fixture(scope="session")
def make_tiny_llama() -> Callable[..., LlamaForCausalLM]:
    """Build a small randomly initialised Llama (vocab 64, 2 layers) for tests that need no load."""

    def make(**overrides: object) -> LlamaForCausalLM:
        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            **overrides,
        )
        return LlamaForCausalLM(config).eval()

    return make
