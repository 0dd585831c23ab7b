"""The checked-in published chat templates render on SmolLM2 with their markers as single tokens."""

from __future__ import annotations

import re

import pytest
from real_templates import DIRECTORY, TEMPLATES, RealTemplate, real_tokenizer
from transformers import PreTrainedTokenizerBase

CONVERSATION = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "5."},
    {"role": "user", "content": "And 4 + 4?"},
]

by_name = pytest.mark.parametrize("template", TEMPLATES, ids=[t.name for t in TEMPLATES])


def render(tokenizer: PreTrainedTokenizerBase, template: RealTemplate) -> str:
    rendered = tokenizer.apply_chat_template(
        CONVERSATION, tokenize=False, add_generation_prompt=True, **template.render_kwargs
    )
    assert isinstance(rendered, str)
    return rendered


def test_manifest_lists_every_template_file_and_nothing_else() -> None:
    names = [t.name for t in TEMPLATES]
    assert len(names) == len(set(names)) >= 10
    assert all(t.file == f"{t.name}.jinja" for t in TEMPLATES)
    assert {t.file for t in TEMPLATES} == {p.name for p in DIRECTORY.glob("*.jinja")}
    assert {p.name for p in DIRECTORY.iterdir()} == {t.file for t in TEMPLATES} | {"manifest.json"}


@by_name
def test_manifest_entry_is_complete(template: RealTemplate) -> None:
    assert re.fullmatch(r"[0-9a-f]{40}", template.source.commit)
    assert re.fullmatch(r"[\w.-]+/[\w.-]+", template.source.repo)
    assert template.source.path and template.family and template.notes
    assert template.upstream is None or re.fullmatch(r"[\w.-]+/[\w.-]+", template.upstream)
    assert template.special_tokens and len(set(template.special_tokens)) == len(
        template.special_tokens
    )
    assert template.source_text.strip()


@by_name
def test_renders_with_markers_as_single_tokens(
    tokenizer: PreTrainedTokenizerBase, template: RealTemplate
) -> None:
    real = real_tokenizer(tokenizer, template)
    rendered = render(real, template)
    assert "And 4 + 4?" in rendered

    ids = real.encode(rendered, add_special_tokens=False)
    markers = [*template.special_tokens, template.bos_token, template.eos_token, template.pad_token]
    present = [m for m in dict.fromkeys(markers) if m is not None and m in rendered]
    assert present, "the rendering carries none of the template's markers"
    for marker in present:
        (marker_id,) = real.encode(marker, add_special_tokens=False)
        assert ids.count(marker_id) == rendered.count(marker), marker

    # Every listed marker is written by the template, literally or (Phi-4-mini's role markers) built
    # from the role names of this conversation.
    for marker in template.special_tokens:
        assert marker in template.source_text or marker in rendered, marker


@by_name
def test_real_tokenizer_leaves_the_shared_base_alone(
    tokenizer: PreTrainedTokenizerBase, template: RealTemplate
) -> None:
    before = (len(tokenizer), dict(tokenizer.special_tokens_map), tokenizer.chat_template)
    real = real_tokenizer(tokenizer, template)
    assert real is not tokenizer
    assert real.backend_tokenizer is not tokenizer.backend_tokenizer
    assert (len(tokenizer), dict(tokenizer.special_tokens_map), tokenizer.chat_template) == before
    assert real.chat_template == template.source_text
    assert (real.bos_token, real.eos_token) == (template.bos_token, template.eos_token)

    # Markers SmolLM2 already has as added tokens keep their ids; the others are new and special.
    existing = tokenizer.added_tokens_encoder
    for marker in template.special_tokens:
        marker_id = real.convert_tokens_to_ids(marker)
        assert isinstance(marker_id, int), marker
        if marker in existing:
            assert marker_id == existing[marker], marker
        else:
            assert marker_id >= len(tokenizer), marker
        assert marker in real.all_special_tokens, marker
