"""TrajectoryBuilder and TokenTrajectory: the contract, one property per test."""

from __future__ import annotations

import json
import warnings

import pytest
from template_cases import ENDOFTEXT, IM_END, SYSTEM_ON_TOP, template_source

from agentrl.tokenization import (
    ChatFormat,
    Segment,
    SegmentKind,
    TemplateError,
    TemplateNotAppendOnlyError,
    TemplatePolicy,
    TemplateWarning,
    TokenTrajectory,
    TrajectoryBuilder,
)

RESET = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "What is 6*7?"}]
TOOLS = [{"type": "function", "function": {"name": "calc", "description": "d", "parameters": {}}}]


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_initial_prompt_is_the_template_with_generation_prompt(tokenizer):
    builder = TrajectoryBuilder(tokenizer, RESET, TOOLS)
    expected = tokenizer.apply_chat_template(
        RESET, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert builder.prompt_ids() == list(expected)
    assert builder.trajectory.prompt_length == len(expected)


def test_engine_tokens_are_kept_verbatim_even_when_not_canonical(tokenizer):
    builder = TrajectoryBuilder(tokenizer, RESET)
    spelled = [encode(tokenizer, ch)[0] for ch in "forty-two"]  # one id per character
    assert spelled != encode(tokenizer, "forty-two")
    builder.add_completion([*spelled, IM_END], [-0.5] * 10, version=3)
    builder.add_messages([{"role": "user", "content": "thanks"}])
    ids = builder.trajectory.input_ids
    start = builder.trajectory.prompt_length
    assert ids[start : start + 10] == [*spelled, IM_END]
    assert builder.messages[2] == {"role": "assistant", "content": "forty-two"}


def test_masks_logprobs_and_versions_cover_engine_tokens_only(tokenizer):
    builder = TrajectoryBuilder(tokenizer, RESET)
    first = [*encode(tokenizer, "Let me check."), IM_END]
    builder.add_completion(first, [-0.1] * len(first), version=1)
    builder.add_messages([{"role": "tool", "content": "42"}])
    second = [*encode(tokenizer, "42"), IM_END]
    builder.add_completion(second, [-0.2] * len(second), version=2)
    t = builder.trajectory
    engine = [i for i, kind in _kinds(t) if kind is SegmentKind.COMPLETION]
    assert [t.input_ids[i] for i in engine] == first + second
    assert [i for i, m in enumerate(t.loss_mask) if m] == engine
    assert [t.versions[i] for i in engine] == [1] * len(first) + [2] * len(second)
    assert [t.logprobs[i] for i in engine] == [-0.1] * len(first) + [-0.2] * len(second)
    others = set(range(len(t))) - set(engine)
    assert {t.versions[i] for i in others} == {-1} and {t.logprobs[i] for i in others} == {0.0}


def test_chatml_newline_after_end_of_turn_precedes_the_tool_turn(tokenizer):
    builder = TrajectoryBuilder(tokenizer, RESET)
    builder.add_completion([*encode(tokenizer, "call"), IM_END], [0.0] * 2, version=0)
    builder.add_messages([{"role": "tool", "content": "r"}])
    text = tokenizer.decode(builder.prompt_ids())
    assert text.endswith("call<|im_end|>\n<|im_start|>tool\nr<|im_end|>\n<|im_start|>assistant\n")


def test_truncated_completion_is_closed_with_a_masked_end_of_turn(tokenizer):
    builder = TrajectoryBuilder(tokenizer, RESET)
    cut = encode(tokenizer, "I will compute")
    builder.add_completion(cut, [-1.0] * len(cut), version=0)  # finish_reason "length"
    builder.add_messages([{"role": "user", "content": "go on"}])
    t = builder.trajectory
    closing = [s for s in t.segments if s.kind is SegmentKind.CLOSING]
    assert len(closing) == 1 and t.input_ids[closing[0].start : closing[0].end] == [IM_END]
    assert t.loss_mask[closing[0].start] == 0
    assert tokenizer.decode(t.input_ids).endswith(
        "I will compute<|im_end|>\n<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n"
    )


def test_truncated_tool_call_is_closed_with_the_templates_end_of_turn(tokenizer, formats):
    builder = TrajectoryBuilder(formats["tool_role_eom"], RESET, TOOLS)
    cut = encode(tokenizer, '<tool_call>\n{"name": "calc"')
    builder.add_completion(cut, [0.0] * len(cut), version=0)
    builder.add_messages([{"role": "tool", "content": "error: truncated call"}])
    assert ENDOFTEXT in builder.trajectory.input_ids[len(cut) :]
    assert [s.kind for s in builder.trajectory.segments][-2:] == [
        SegmentKind.CLOSING,
        SegmentKind.DELTA,
    ]


def test_any_end_of_turn_id_ends_the_turn(tokenizer, formats):
    builder = TrajectoryBuilder(formats["tool_role_eom"], RESET, TOOLS)
    assert builder.end_of_turn_ids == {ENDOFTEXT, IM_END}
    call = [*encode(tokenizer, "<tool_call>{}</tool_call>"), ENDOFTEXT]
    builder.add_completion(call, [0.0] * len(call), version=0)
    with pytest.raises(RuntimeError, match="turn already ended"):
        builder.add_completion([IM_END], [0.0], version=0)
    builder.add_messages([{"role": "tool", "content": "ok"}])
    assert SegmentKind.CLOSING not in {s.kind for s in builder.trajectory.segments}


def test_resumed_completion_continues_the_turn_with_a_new_version(tokenizer):
    builder = TrajectoryBuilder(tokenizer, RESET)
    head, tail = encode(tokenizer, "The answer"), encode(tokenizer, " is 42")
    builder.add_completion(head, [-0.3] * len(head), version=4, text="The answer")
    builder.add_completion([*tail, IM_END], [-0.4] * (len(tail) + 1), version=5, text=" is 42")
    t = builder.trajectory
    assert t.versions[t.prompt_length :] == [4] * len(head) + [5] * (len(tail) + 1)
    assert [s.kind for s in t.segments] == [SegmentKind.PROMPT, *[SegmentKind.COMPLETION] * 2]
    assert builder.messages[-1] == {"role": "assistant", "content": "The answer is 42"}


def test_empty_observation_appends_only_the_generation_prompt(tokenizer):
    builder = TrajectoryBuilder(tokenizer, RESET)
    builder.add_completion([IM_END], [0.0], version=0)
    before = len(builder.prompt_ids())
    builder.add_messages([])
    assert tokenizer.decode(builder.prompt_ids()[before:]) == "\n<|im_start|>assistant\n"


def test_calls_out_of_order_are_refused(tokenizer):
    builder = TrajectoryBuilder(tokenizer, RESET)
    with pytest.raises(RuntimeError, match="must follow a completion"):
        builder.add_messages([{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match="log-probs"):
        builder.add_completion([5, 6], [0.0], version=0)
    with pytest.raises(ValueError, match="version"):
        builder.add_completion([5], [0.0], version=-1)
    with pytest.raises(ValueError, match="2 token ids but 1 weight versions"):
        builder.add_completion([5, 6], [0.0, 0.0], version=[1])


def test_per_token_versions_from_a_generation_across_an_update(tokenizer):
    builder = TrajectoryBuilder(tokenizer, RESET)
    ids = [*encode(tokenizer, "The answer is 42"), IM_END]
    versions = [3] * 2 + [4] * (len(ids) - 2)
    builder.add_completion(ids, [-0.1] * len(ids), version=versions)
    assert builder.trajectory.versions[builder.trajectory.prompt_length :] == versions
    with pytest.raises(ValueError, match="at least one message"):
        TrajectoryBuilder(tokenizer, [])
    with pytest.raises(ValueError, match="not with a ChatFormat"):
        TrajectoryBuilder(builder.format, RESET, chat_template="{{ messages }}")


def test_failed_delta_leaves_the_builder_unchanged(tokenizer):
    builder = TrajectoryBuilder(ChatFormat(tokenizer, SYSTEM_ON_TOP), RESET)
    cut = encode(tokenizer, "partial")
    builder.add_completion(cut, [0.0] * len(cut), version=0)
    before = builder.trajectory
    with pytest.raises(TemplateError):
        builder.add_messages([{"role": "system", "content": "late"}])
    assert builder.trajectory == before
    builder.add_messages([{"role": "user", "content": "fine"}])
    assert builder.messages[-1] == {"role": "user", "content": "fine"}


def test_strict_policy_refuses_a_template_that_is_not_append_only(tokenizer):
    with pytest.raises(TemplateNotAppendOnlyError, match="reasoning_dropped") as caught:
        TrajectoryBuilder(
            tokenizer, RESET, policy="strict", chat_template=template_source("reasoning_stripped")
        )
    assert not caught.value.report.ok
    TrajectoryBuilder(tokenizer, RESET, policy=TemplatePolicy.STRICT)  # SmolLM2's is fine


def test_keep_policy_warns_once_per_template(tokenizer):
    fmt = ChatFormat(tokenizer, template_source("system_last_user"))
    with pytest.warns(TemplateWarning, match="system_moved"):
        TrajectoryBuilder(fmt, RESET)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TrajectoryBuilder(fmt, RESET)


def test_token_trajectory_round_trips_through_json(tokenizer):
    builder = TrajectoryBuilder(tokenizer, RESET)
    builder.add_completion([*encode(tokenizer, "hi"), IM_END], [-0.25, -0.5], version=7)
    t = builder.trajectory
    assert TokenTrajectory.from_dict(json.loads(json.dumps(t.to_dict()))) == t
    assert TokenTrajectory.from_dict(TokenTrajectory.empty().to_dict()) == TokenTrajectory.empty()


@pytest.mark.parametrize(
    "change",
    [
        {"loss_mask": [0, 1, 1]},  # mask 1 on a prompt id
        {"versions": [-1, 0, -1], "loss_mask": [0, 0, 0]},  # version on a prompt id
        {"logprobs": [0.0]},  # lengths differ
        {"prompt_length": 4},
        {"segments": [Segment(SegmentKind.PROMPT, 0, 2)]},  # does not cover every id
    ],
)
def test_inconsistent_token_trajectory_is_rejected(change):
    fields = {
        "input_ids": [1, 2, 3],
        "loss_mask": [0, 0, 1],
        "logprobs": [0.0, 0.0, -1.0],
        "versions": [-1, -1, 0],
        "prompt_length": 2,
        "segments": [Segment(SegmentKind.PROMPT, 0, 2), Segment(SegmentKind.COMPLETION, 2, 3)],
    }
    TokenTrajectory(**fields)
    with pytest.raises(ValueError):
        TokenTrajectory(**{**fields, **change})


def _kinds(t: TokenTrajectory):
    for segment in t.segments:
        for i in range(segment.start, segment.end):
            yield i, segment.kind
