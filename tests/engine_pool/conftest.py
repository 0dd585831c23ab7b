"""Engine fixtures; the shared SmolLM2 model, tokenizer and tiny Llama come from tests/conftest.py."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerBase


@pytest.fixture(scope="session")
def chat_prompt(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """A short ChatML prompt (about 30 tokens) ending with the assistant header."""
    messages = [{"role": "user", "content": "Name three colours."}]
    return list(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    )
