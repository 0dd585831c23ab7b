"""Checker verdicts and builder behaviour for the template behaviours of real model families, each
reduced to a few lines: a generation prompt that merges with the generated text (Llama 3's
``<|end_header_id|>\\n\\n``), ChatML that closes a message only when another follows, a header
appended to every render, tools that are append-only only without tools, alternating roles.
The published templates themselves run in ``test_real_templates.py``."""

from __future__ import annotations

import copy
import warnings

import pytest
from template_cases import ALTERNATING

from agentrl.tokenization import (
    ChatFormat,
    SegmentKind,
    TemplateError,
    TemplateNotAppendOnlyError,
    TemplateWarning,
    TrajectoryBuilder,
    Verdict,
    check_template,
)

LLAMA_MARKERS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
LLAMA_LIKE = (
    "{{- bos_token }}{%- for m in messages %}"
    "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)
# ChatML as many fine-tunes ship it: a message is closed only when another message follows (or a
# generation prompt), and the generation prompt is not added after an assistant message.
CHATML_CLOSE_WHEN_FOLLOWED = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] }}"
    "{% if not loop.last or add_generation_prompt %}{{ '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt and messages[-1]['role'] != 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
ALWAYS_HEADER = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{{ '<|im_start|>assistant\\n' }}"
)
# Mistral-style: the tool list is written before the LAST user message, so it moves with every
# user turn when tools are given; without tools the template is plain and append-only.
TOOLS_BEFORE_LAST_USER = (
    "{% set ns = namespace(last=-1) %}{% for m in messages %}{% if m['role'] == 'user' %}"
    "{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}{% if tools and loop.index0 == ns.last %}"
    "<|im_start|>tools\n{{ tools | tojson }}<|im_end|>\n{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def llama(tokenizer) -> ChatFormat:
    """SmolLM2's vocabulary with Llama 3's markers as added special tokens."""
    vocabulary = copy.deepcopy(tokenizer)
    vocabulary.add_special_tokens(
        {"additional_special_tokens": LLAMA_MARKERS[1:], "bos_token": LLAMA_MARKERS[0]}
    )
    return ChatFormat(vocabulary, LLAMA_LIKE)


def _episode(builder: TrajectoryBuilder, fmt: ChatFormat, replies: list[str]) -> None:
    """Engine turns that emit the tokenizer's encoding of ``replies``, with user turns between."""
    for n, reply in enumerate(replies):
        ids = [*fmt.encode(reply), fmt.end_of_turn_id]
        builder.add_completion(ids, [-0.5] * len(ids), n, text=reply)
        builder.add_messages([{"role": "user", "content": f"and {n}?"}])


def _full_encode(fmt: ChatFormat, builder: TrajectoryBuilder, tools=None) -> list[int]:
    rendered = fmt.render(builder.messages, tools, add_generation_prompt=True, now=builder.now)
    return fmt.encode(rendered)


def test_llama_header_merge_is_a_token_seam_not_append_only(llama):
    report = check_template(llama)
    assert report.verdict() is Verdict.TOKEN_SEAMS and not report.issues
    seam = report.use("plain").seams[0]
    assert seam.built == ("ĊĊ",) and seam.rendered == ("Ċ", "Ċ") and seam.engine_tokens == 0
    assert all(use.reencode_exact for use in report.uses)


def test_seams_keep_holds_what_the_engine_saw_and_reencode_equals_a_full_render(llama):
    messages = [{"role": "user", "content": "hi"}]
    replies = ["Hello there.", "Sure: 4.", "\n\nleading newlines"]
    with pytest.warns(TemplateWarning, match=r"token seams|seams=.reencode."):
        kept = TrajectoryBuilder(llama, messages)
    _episode(kept, llama, replies)
    fixed = TrajectoryBuilder(llama, messages, seams="reencode")
    _episode(fixed, llama, replies)

    full = _full_encode(llama, fixed)
    assert fixed.prompt_ids() == full
    assert kept.prompt_ids() != full and llama.decode(kept.prompt_ids()) == llama.decode(full)
    double, single = llama.encode("\n\n"), llama.encode("\n")
    assert len(double) == 1 and kept.prompt_ids().count(double[0]) > 0

    t = fixed.trajectory
    assert [e.replaced for e in t.seams[:2]] == [tuple(double), tuple(double)]
    for edit in t.seams:
        assert t.input_ids[edit.start : edit.end] == single * 2 or edit.engine_tokens > 0
        assert all(t.loss_mask[i] == 0 for i in range(edit.start, edit.end))
    seams = [s for s in t.segments if s.kind is SegmentKind.SEAM]
    assert [(s.start, s.end) for s in seams] == [(e.start, e.end) for e in t.seams]
    # the engine's own ids keep their loss and log-probs: only the prompt's "\n\n" was split
    assert sum(t.loss_mask) == sum(kept.trajectory.loss_mask) - sum(
        e.engine_tokens for e in t.seams
    )
    assert type(t).from_dict(t.to_dict()) == t


def test_strict_refuses_seams_unless_reencoded(llama):
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(TemplateNotAppendOnlyError, match="token_seam"):
        TrajectoryBuilder(llama, messages, policy="strict")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TrajectoryBuilder(llama, messages, policy="strict", seams="reencode")


def test_seam_inside_the_engine_tokens_drops_their_loss(tokenizer):
    # "[/INST] " + "Hi": a full encode merges the prompt's space into " Hi"
    template = (
        "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ m['content'] }}<|im_end|>"
        "{% else %}<|im_start|>[INST] {{ m['content'] }} [/INST] {% endif %}{% endfor %}"
    )
    fmt = ChatFormat(tokenizer, template)
    builder = TrajectoryBuilder(fmt, [{"role": "user", "content": "x"}], seams="reencode")
    hi = fmt.encode("Hi there")
    builder.add_completion([*hi, fmt.end_of_turn_id], [-1.0] * (len(hi) + 1), 3)
    t = builder.trajectory
    (edit,) = t.seams
    assert edit.engine_tokens == 1 and t.input_ids[edit.start : edit.end] == fmt.encode(" Hi")
    assert t.input_ids == fmt.encode(fmt.render(builder.messages) + "")[: len(t)]
    assert t.loss_mask[edit.start : edit.end] == [0] and t.versions[edit.end] == 3
    assert t.prompt_length == edit.start


@pytest.mark.parametrize("template", [CHATML_CLOSE_WHEN_FOLLOWED, ALWAYS_HEADER])
def test_chatml_variants_are_append_only_and_exact(tokenizer, template):
    fmt = ChatFormat(tokenizer, template)
    report = check_template(fmt)
    assert report.use("tools").verdict is Verdict.APPEND_ONLY, report.describe()
    assert report.use("plain").verdict is Verdict.APPEND_ONLY, report.describe()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        builder = TrajectoryBuilder(fmt, [{"role": "user", "content": "hi"}], policy="strict")
    _episode(builder, fmt, ["Hello.", "4"])
    assert builder.prompt_ids() == _full_encode(fmt, builder)


def test_chatml_without_a_generation_prompt_after_an_assistant_is_flagged_for_no_reply(tokenizer):
    report = check_template(tokenizer, CHATML_CLOSE_WHEN_FOLLOWED)
    assert report.use("no_reply").verdict is Verdict.NOT_APPEND_ONLY
    assert report.verdict() is Verdict.NOT_APPEND_ONLY


def test_append_only_without_tools_is_accepted_without_tools(tokenizer):
    fmt = ChatFormat(tokenizer, TOOLS_BEFORE_LAST_USER)
    report = check_template(fmt)
    assert report.use("plain").verdict is Verdict.APPEND_ONLY
    # with tools no base conversation stays a prefix once a user message follows: no delta exists
    assert report.use("tools").verdict is Verdict.UNUSABLE
    assert "no delta" in (report.use("tools").error or "")
    messages = [{"role": "user", "content": "hi"}]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        builder = TrajectoryBuilder(fmt, messages, policy="strict")
    _episode(builder, fmt, ["Hello.", "4"])
    assert builder.prompt_ids() == _full_encode(fmt, builder)
    with pytest.raises(TemplateError, match="cannot be used for conversations with tools"):
        TrajectoryBuilder(fmt, messages, TOOLS)


def test_roles_the_template_refuses_are_an_error_not_a_trajectory(tokenizer):
    fmt = ChatFormat(tokenizer, ALTERNATING)
    report = check_template(fmt)
    assert report.use("tools").verdict is Verdict.UNUSABLE
    assert "alternate" in (report.use("tools").error or "")
    assert report.use("plain").verdict is Verdict.APPEND_ONLY
    assert report.use("no_reply").verdict is Verdict.UNUSABLE
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(TemplateError, match="cannot be used for conversations with tools"):
        TrajectoryBuilder(fmt, messages, TOOLS)  # under either policy

    builder = TrajectoryBuilder(fmt, messages)
    ids = [*fmt.encode("Hello."), fmt.end_of_turn_id]
    builder.add_completion(ids, [0.0] * len(ids), 0)
    before = builder.trajectory
    with pytest.raises(TemplateError, match=r"alternate|no messages"):
        builder.add_messages([])  # assistant after assistant
    with pytest.raises(TemplateError, match="refuses a conversation with roles"):
        builder.add_messages([{"role": "tool", "content": "4"}])
    assert builder.trajectory == before  # nothing appended
    builder.add_messages([{"role": "user", "content": "thanks"}])
    assert builder.prompt_ids() == _full_encode(fmt, builder)


def test_seam_after_an_empty_first_piece(llama):
    # an engine that aborted before its first token, then resumed (a partial rollout)
    builder = TrajectoryBuilder(llama, [{"role": "user", "content": "hi"}], seams="reencode")
    builder.add_completion([], [], 0)
    reply = [*llama.encode("Hello."), llama.end_of_turn_id]
    builder.add_completion(reply, [-0.5] * len(reply), 1)
    (edit,) = builder.trajectory.seams
    assert llama.decode(list(edit.replaced)) == "\n\n" and edit.engine_tokens == 0
