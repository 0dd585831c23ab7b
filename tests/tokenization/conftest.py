"""The chat formats of the shared SmolLM2 tokenizer (tests/conftest.py), by template name."""

from __future__ import annotations

import pytest
from template_cases import FORMATS, template_source
from transformers import PreTrainedTokenizerBase

from agentrl.tokenization import ChatFormat


@pytest.fixture(scope="session")
def formats(tokenizer: PreTrainedTokenizerBase) -> dict[str, ChatFormat]:
    """SmolLM2's own template and the hand-written ones, by name (see ``template_cases``)."""
    return {name: ChatFormat.of(tokenizer, template_source(name)) for name in FORMATS}
