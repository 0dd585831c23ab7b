"""Published chat templates of widely used model families, checked in verbatim as test data.

``real_templates/manifest.json`` lists one entry per ``real_templates/<name>.jinja``: where the text
was copied from (repository, path, commit), the Hugging Face model it belongs to, the marker strings
that model's tokenizer has as added/special tokens, its bos/eos/pad tokens, the keyword arguments
the template cannot render without, and notes on how it behaves. ``real_tokenizer`` gives SmolLM2's
vocabulary those markers as single special tokens, so every template renders on one small
tokenizer with its markers encoded the way the real model's tokenizer encodes them.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from transformers import PreTrainedTokenizerBase

DIRECTORY = Path(__file__).parent / "real_templates"
MANIFEST = DIRECTORY / "manifest.json"


@dataclass(frozen=True)
class Source:
    """Where a template's text was copied from: ``repo`` (GitHub owner/name) at ``commit``."""

    repo: str
    path: str
    commit: str
    # How the template was taken out of ``path`` when that is not the template file itself.
    extract: str | None = None
    # The repository actually read, when it is a mirror sharing ``repo``'s history.
    read_from: str | None = None


@dataclass(frozen=True)
class RealTemplate:
    """A manifest entry: one published chat template and the tokens its model's tokenizer has."""

    name: str
    family: str
    file: str
    source: Source
    upstream: str | None  # the Hugging Face model id (None: a generic template of no model)
    special_tokens: tuple[str, ...]
    bos_token: str | None
    eos_token: str | None
    notes: str
    pad_token: str | None = None
    # Keyword arguments for ``apply_chat_template`` without which the template does not render.
    render_kwargs: Mapping[str, Any] = field(
        default_factory=lambda: MappingProxyType({}), hash=False, compare=False
    )

    @property
    def path(self) -> Path:
        return DIRECTORY / self.file

    @property
    def source_text(self) -> str:
        """The template exactly as checked in (bytes decoded, no newline translation)."""
        return self.path.read_bytes().decode("utf-8")

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> RealTemplate:
        return cls(
            name=entry["name"],
            family=entry["family"],
            file=entry["file"],
            source=Source(**entry["source"]),
            upstream=entry["upstream"],
            special_tokens=tuple(entry["special_tokens"]),
            bos_token=entry["bos_token"],
            eos_token=entry["eos_token"],
            notes=entry["notes"],
            pad_token=entry.get("pad_token"),
            render_kwargs=MappingProxyType(dict(entry.get("render_kwargs", {}))),
        )


def load_manifest() -> list[RealTemplate]:
    return [RealTemplate.from_json(entry) for entry in json.loads(MANIFEST.read_text("utf-8"))]


TEMPLATES: list[RealTemplate] = load_manifest()


def real_tokenizer(
    base: PreTrainedTokenizerBase, template: RealTemplate
) -> PreTrainedTokenizerBase:
    """A new tokenizer: ``base``'s vocabulary plus ``template``'s markers as special tokens.

    ``base`` is shared by the whole session and is never modified: this works on a deep copy, which
    has its own backend tokenizer. Markers ``base`` already has as added tokens (SmolLM2's
    ``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>``...) keep their ids; the others get new ids
    past the end of the vocabulary. bos/eos/pad become the real tokenizer's (a ``None`` bos, as in
    Qwen's tokenizers, unsets it; a missing pad leaves ``base``'s), and the chat template is the
    checked-in one.
    """
    tokenizer = copy.deepcopy(base)
    special: dict[str, Any] = {"additional_special_tokens": list(template.special_tokens)}
    for key in ("bos_token", "eos_token", "pad_token"):
        value = getattr(template, key)
        if value is not None:
            special[key] = value
    tokenizer.add_special_tokens(special)
    if template.bos_token is None:
        tokenizer.bos_token = None
    tokenizer.chat_template = template.source_text
    return tokenizer
