"""Conversations into token rows: loss masks on exactly the assistant turns, clear errors."""

import json

import datasets
import pytest

from agentrl.sft.data import (
    ConversationError,
    conversation_of,
    load_conversations,
    tokenize_conversation,
    tokenize_dataset,
)
from agentrl.tokenization import ChatFormat

TOOL_CONVERSATION = [
    {"role": "system", "content": "Use <python>code</python> to compute."},
    {"role": "user", "content": "What is 6 * 7?"},
    {"role": "assistant", "content": "Let me compute it.\n<python>print(6 * 7)</python>"},
    {"role": "tool", "name": "python", "content": "42\n"},
    {"role": "assistant", "content": "The answer is \\boxed{42}."},
]
# ChatML that refuses any role but system, user and assistant (as some model templates do)
NO_TOOL_ROLE = (
    "{% for message in messages %}{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unsupported role ' + message['role']) }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def fmt(tokenizer):
    return ChatFormat.of(tokenizer)


def masked_spans(fmt, tokens):
    """The decoded runs of ids with loss mask 1."""
    spans, run = [], []
    for token, mask in zip(tokens.input_ids, tokens.loss_mask, strict=True):
        if mask:
            run.append(token)
        elif run:
            spans.append(fmt.decode(run))
            run = []
    return spans + ([fmt.decode(run)] if run else [])


def test_loss_mask_covers_each_assistant_turn_and_its_end_of_turn_token(fmt):
    tokens = tokenize_conversation(fmt, TOOL_CONVERSATION)
    assert masked_spans(fmt, tokens) == [
        TOOL_CONVERSATION[2]["content"] + "<|im_end|>",
        TOOL_CONVERSATION[4]["content"] + "<|im_end|>",
    ]
    # everything else (system, user, tool result, role headers) is the template's text, mask 0
    assert fmt.decode(tokens.input_ids) == fmt.render(TOOL_CONVERSATION).rstrip("\n")


def test_consecutive_assistant_turns_and_user_feedback(fmt):
    messages = [
        {"role": "user", "content": "Say apple."},
        {"role": "assistant", "content": "pear"},
        {"role": "user", "content": "No. Say apple."},
        {"role": "assistant", "content": "Hmm."},
        {"role": "assistant", "content": "apple"},
    ]
    tokens = tokenize_conversation(fmt, messages)
    assert masked_spans(fmt, tokens) == ["pear<|im_end|>", "Hmm.<|im_end|>", "apple<|im_end|>"]


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        ([], "empty"),
        ([{"role": "user"}], "string 'role' and 'content'"),
        ([{"role": "user", "content": "hi"}], "no assistant turn"),
        (TOOL_CONVERSATION[:4], "ends with a 'tool' message"),
        ([{"role": "assistant", "content": "hi"}], "no prompt"),
        (
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]},
            ],
            "tool_calls",
        ),
    ],
)
def test_conversations_sft_cannot_train_on_are_refused(fmt, messages, error):
    with pytest.raises(ConversationError, match=error):
        tokenize_conversation(fmt, messages)


def test_a_role_the_template_refuses_is_a_conversation_error(tokenizer):
    fmt = ChatFormat(tokenizer, NO_TOOL_ROLE)
    tokenize_conversation(fmt, [TOOL_CONVERSATION[1], TOOL_CONVERSATION[4]])  # fine
    with pytest.raises(ConversationError, match=r"refuses a conversation with roles.*tool"):
        tokenize_conversation(fmt, TOOL_CONVERSATION)


def test_jsonl_and_parquet_rows_load_with_their_tools(tmp_path, fmt):
    schema = {"type": "object", "properties": {"code": {"type": "string"}}}
    tools = [{"type": "function", "function": {"name": "python", "parameters": schema}}]
    rows = [
        {"messages": TOOL_CONVERSATION, "tools": tools, "env_id": "x"},
        {"messages": json.dumps(TOOL_CONVERSATION[1:3])},  # a JSON string, as rollouts write
    ]
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows))
    parquet = tmp_path / "c.parquet"
    datasets.Dataset.from_list(
        [{"messages": TOOL_CONVERSATION, "tools": tools}, {"messages": TOOL_CONVERSATION[1:3]}]
    ).to_parquet(str(parquet))
    for path in (jsonl, parquet):
        dataset = load_conversations(path)
        messages, loaded_tools = conversation_of(dataset[0])
        assert messages == TOOL_CONVERSATION  # Arrow's null fields (no "name") are dropped
        assert loaded_tools == tools
        tokenized = tokenize_dataset(fmt, dataset, max_tokens=4096)
        assert len(tokenized.rows) == 2 and tokenized.dropped_too_long == 0
        assert tokenized.rows[0]["input_ids"] == tokenize_conversation(fmt, messages).input_ids


def test_long_conversations_are_dropped_and_bad_rows_named(tmp_path, fmt):
    rows = [{"messages": TOOL_CONVERSATION}, {"messages": TOOL_CONVERSATION[:2]}]
    tokenized = tokenize_dataset(fmt, rows[:1] * 2, max_tokens=4096)
    assert tokenized.dropped_too_long == 0
    with pytest.raises(ConversationError, match="no conversation fits in 16 tokens"):
        tokenize_dataset(fmt, rows[:1], max_tokens=16)
    with pytest.raises(ConversationError, match=r"demo\.jsonl, row 1: no assistant turn"):
        tokenize_dataset(fmt, rows, max_tokens=4096, where="demo.jsonl")


def test_files_without_conversations_are_refused(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ConversationError, match="empty"):
        load_conversations(empty)
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"prompt": "hi", "completion": "there"}) + "\n")
    with pytest.raises(ConversationError, match="no 'messages' column"):
        load_conversations(other)
    with pytest.raises(ConversationError, match=r"\.jsonl, \.json or \.parquet"):
        load_conversations(tmp_path / "rows.csv")
    with pytest.raises(FileNotFoundError):
        load_conversations(tmp_path / "missing.jsonl")
