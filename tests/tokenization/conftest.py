"""One SmolLM2 tokenizer (~11 s to load from the GGUF) and its chat formats, shared by the session."""

from __future__ import annotations

import pytest
from template_cases import FORMATS, template_source
from transformers import PreTrainedTokenizerBase

from agentrl.models import load_tokenizer
from agentrl.tokenization import ChatFormat


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerBase:
    return load_tokenizer("smollm2")


@pytest.fixture(scope="session")
def formats(tokenizer: PreTrainedTokenizerBase) -> dict[str, ChatFormat]:
    """SmolLM2's own template and the hand-written ones, by name (see ``template_cases``)."""
    return {name: ChatFormat.of(tokenizer, template_source(name)) for name in FORMATS}
