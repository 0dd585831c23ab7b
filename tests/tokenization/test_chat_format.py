"""The delta rule, end-of-turn detection and anchored encoding of ChatFormat."""

from __future__ import annotations

import pytest
from template_cases import ENDOFTEXT, IM_END, SYSTEM_ON_TOP

from agentrl.tokenization import ChatFormat, TemplateError

TOOLS = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {}}}]
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Calling f."},
]


def test_chatml_delta_starts_with_the_newline_after_the_end_of_turn(formats):
    delta = formats["smollm2"].delta_text([{"role": "tool", "content": "42"}])
    assert delta == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"


def test_empty_delta_is_the_generation_prompt(formats):
    assert formats["smollm2"].delta_text([]) == "\n<|im_start|>assistant\n"
    assert formats["system_last_user"].delta_text([]) == ""


@pytest.mark.parametrize("name", ["smollm2", "reasoning_stripped", "tool_role_eom"])
def test_delta_ids_are_the_tail_of_a_full_encode(tokenizer, formats, name):
    fmt = formats[name]
    new = [{"role": "tool", "content": " 4\n\n"}, {"role": "user", "content": "ünï  code\t"}]
    full = fmt.render([*CONVERSATION, *new], TOOLS, add_generation_prompt=True)
    head = fmt.render(CONVERSATION, TOOLS)
    head = head[: head.rindex("Calling f.") + len("Calling f.")]
    full_ids = tokenizer.encode(full, add_special_tokens=False)
    head_ids = [*tokenizer.encode(head, add_special_tokens=False), fmt.end_of_turn_id]
    assert full_ids[: len(head_ids)] == head_ids
    assert fmt.delta_ids(new, TOOLS) == full_ids[len(head_ids) :]


@pytest.mark.parametrize(
    ("name", "closing", "end_of_turn_ids"),
    [
        ("smollm2", "<|im_end|>", {IM_END}),
        ("system_last_user", "<|endoftext|>", {ENDOFTEXT, IM_END}),
        ("system_first_user", "<|endoftext|>", {ENDOFTEXT, IM_END}),
        ("reasoning_stripped", "<|im_end|>", {IM_END}),
        ("tool_role_eom", "<|im_end|>", {ENDOFTEXT, IM_END}),
    ],
)
def test_end_of_turn_tokens_are_detected(formats, name, closing, end_of_turn_ids):
    assert formats[name].closing == closing
    assert formats[name].end_of_turn_ids == end_of_turn_ids


def test_closing_follows_the_content(formats):
    fmt = formats["tool_role_eom"]
    assert fmt.closing_text("plain answer") == "<|im_end|>"
    assert fmt.closing_text('<tool_call>\n{"name": "f"') == "<|endoftext|>"
    assert fmt.closing_ids("<tool_call>") == [ENDOFTEXT]


def test_base_leaves_out_a_system_prompt_that_moves(formats):
    assert [m["role"] for m in formats["system_last_user"]._base(None, None).messages] == [
        "user",
        "assistant",
    ]
    assert formats["smollm2"]._base(None, None).messages[0]["role"] == "system"


def test_encode_after_turn_matches_in_context_tokenization(tokenizer, formats):
    fmt = formats["smollm2"]
    text = "  leading spaces and a 🎉"
    in_context = tokenizer.encode("x<|im_end|>" + text, add_special_tokens=False)
    assert fmt.encode_after_turn(text) == in_context[in_context.index(IM_END) + 1 :]


def test_template_without_added_end_of_turn_token_is_refused(tokenizer):
    plain = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n\n{% endfor %}"
    with pytest.raises(TemplateError, match="added token"):
        ChatFormat(tokenizer, plain)


def test_template_that_rerenders_every_base_is_refused(tokenizer):
    reversed_order = (
        "{% for m in messages | reverse %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(TemplateError, match="re-rendered"):
        ChatFormat(tokenizer, reversed_order)


def test_template_without_tool_role_still_gives_user_deltas(tokenizer):
    no_tools = (
        "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools') }}"
        "{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    fmt = ChatFormat(tokenizer, no_tools)
    assert fmt.delta_text([{"role": "user", "content": "u"}]).startswith("\n<|im_start|>user\nu")


def test_delta_that_rerenders_the_base_raises(tokenizer):
    fmt = ChatFormat(tokenizer, SYSTEM_ON_TOP)
    assert fmt.delta_text([{"role": "user", "content": "u"}]).startswith("\n<|im_start|>user")
    with pytest.raises(TemplateError, match="re-renders earlier turns"):
        fmt.delta_text([{"role": "system", "content": "late system message"}])


def test_shared_format_is_built_once(tokenizer, formats):
    assert ChatFormat.of(tokenizer) is formats["smollm2"]
    assert ChatFormat.of(tokenizer, formats["tool_role_eom"].template) is formats["tool_role_eom"]
