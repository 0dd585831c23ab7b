"""Properties of the tool-call parsers: never raise, round-trip, keep order, never invent calls."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrl.tools import HermesParser, ParseResult, TagParser, ToolCall, ToolCallParser

HERMES = HermesParser()
TAGS = TagParser({"python": "code", "search": "query", "answer": "answer"})

# Pieces that make text look like (broken) tool calls, so generated texts hit the interesting paths.
FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "<tool_call",
    "<python>",
    "</python>",
    "<answer>",
    "</answer>",
    "<search>",
    "</search>",
    "<unknown>",
    '{"name": "f", "arguments": {"x": 1}}',
    '{"name": ',
    '"arguments": ',
    '"{\\"a\\": 1}"',
    "{",
    "}",
    "[",
    "]",
    '"',
    "\\",
    "<",
    ">",
    "/",
    ":",
    ",",
    "\n",
    " ",
    "1e999",
    "null",
]


def soup(fragments: list[str]) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(fragments) | st.text(max_size=4), max_size=30).map("".join)


def without(text: str, *opening_tags: str) -> bool:
    return not any(tag in text for tag in opening_tags)


tag_soup = soup(FRAGMENTS)
tricky_text = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=6), max_size=8).map("".join)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | tricky_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(tricky_text, inner, max_size=4),
    max_leaves=12,
)
hermes_calls = st.builds(
    ToolCall, name=tricky_text, arguments=st.dictionaries(tricky_text, json_values, max_size=5)
)
prose = st.text(st.characters(blacklist_characters="<"), max_size=20)


def tag_calls(parser: TagParser) -> st.SearchStrategy[ToolCall]:
    """Calls ``parser`` can write: a mapped tag and content without that tag's closing tag."""

    def call_for(tag: str) -> st.SearchStrategy[ToolCall]:
        content = tricky_text.filter(lambda text: f"</{tag}>" not in text)
        return content.map(lambda text: ToolCall(tag, {parser.tags[tag]: text}))

    return st.sampled_from(sorted(parser.tags)).flatmap(call_for)


def assert_partition(text: str, result: ParseResult) -> None:
    """Every character of ``text`` is either prose or inside exactly one call/error ``raw``."""
    raws = [call.raw for call in result.calls] + [error.raw for error in result.errors]
    assert all(raw in text for raw in raws)
    assert len(result.text) + sum(map(len, raws)) == len(text)


# --- both parsers -------------------------------------------------------------------------------


@pytest.mark.parametrize("parser", [HERMES, TAGS])
def test_parsers_satisfy_the_protocol(parser: ToolCallParser) -> None:
    assert isinstance(parser, ToolCallParser)


@pytest.mark.parametrize("parser", [HERMES, TAGS])
@given(text=st.text() | tag_soup)
def test_parse_never_raises_and_partitions_the_text(parser: ToolCallParser, text: str) -> None:
    result = parser.parse(text)
    assert_partition(text, result)
    assert all(isinstance(call.arguments, dict) for call in result.calls)
    assert all(error.message for error in result.errors)


# --- Hermes -------------------------------------------------------------------------------------


@given(call=hermes_calls)
def test_hermes_format_parse_round_trip(call: ToolCall) -> None:
    written = HERMES.format(call)
    result = HERMES.parse(written)
    assert result.errors == []
    assert result.calls == [ToolCall(call.name, call.arguments, written)]


@given(text=soup(FRAGMENTS).filter(lambda text: without(text, "<tool_call>")))
def test_hermes_text_without_tags_has_no_calls(text: str) -> None:
    assert HERMES.parse(text) == ParseResult([], [], text)


@given(call=hermes_calls, data=st.data())
def test_hermes_truncated_call_is_an_error_or_plain_text(
    call: ToolCall, data: st.DataObject
) -> None:
    written = HERMES.format(call)
    prefix = written[: data.draw(st.integers(0, len(written) - 1))]
    result = HERMES.parse(prefix)
    assert result.calls == []
    assert len(result.errors) == (HermesParser.OPEN in prefix)


@given(calls=st.lists(hermes_calls, min_size=1, max_size=5), gaps=st.lists(prose, min_size=6))
def test_hermes_multiple_calls_keep_order(calls: list[ToolCall], gaps: list[str]) -> None:
    text = gaps[0] + "".join(
        HERMES.format(call) + gap for call, gap in zip(calls, gaps[1 : len(calls) + 1], strict=True)
    )
    result = HERMES.parse(text)
    assert [(c.name, c.arguments) for c in result.calls] == [(c.name, c.arguments) for c in calls]
    assert result.text == "".join(gaps[: len(calls) + 1])


def test_hermes_parses_qwen_layout_and_keeps_surrounding_text() -> None:
    text = 'Let me look.\n<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>'
    result = HERMES.parse(text)
    assert result.calls == [ToolCall("search", {"q": "x"}, text[len("Let me look.\n") :])]
    assert result.text == "Let me look.\n"


def test_hermes_decodes_double_encoded_arguments_and_defaults_missing_ones() -> None:
    encoded = json.dumps({"name": "f", "arguments": json.dumps({"a": [1, 2]})})
    assert HERMES.parse(f"<tool_call>{encoded}</tool_call>").calls[0].arguments == {"a": [1, 2]}
    assert HERMES.parse('<tool_call>{"name": "g"}</tool_call>').calls[0].arguments == {}


def test_hermes_format_escapes_closing_tags_inside_strings() -> None:
    call = ToolCall("f", {"html": "</tool_call><tool_call>"})
    written = HERMES.format(call)
    assert written.count("</tool_call>") == 1
    assert HERMES.parse(written).calls[0].arguments == call.arguments


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            '{"name": "f", "arguments": {"x": 1}',
            "Expecting ',' delimiter at line 1 column 36 (char 35)",
        ),
        ("{'name': 'f'}", "Expecting property name enclosed in double quotes"),
        ('["f", {}]', "must be a JSON object, got list"),
        ('{"arguments": {}}', '"name" is missing'),
        ('{"name": 3, "arguments": {}}', '"name" must be a string, got 3'),
        ('{"name": "f", "arguments": [1]}', "\"arguments\" of 'f' must be a JSON object"),
        ('{"name": "f", "arguments": "[1]"}', "\"arguments\" of 'f' must be a JSON object"),
        ('{"name": "f", "arguments": "not json"}', "\"arguments\" of 'f' must be a JSON object"),
        ("[" * 100_000, "invalid JSON"),
        ("9" * 10_000, "invalid JSON"),
    ],
)
def test_hermes_malformed_calls_are_errors_that_show_a_correct_call(
    body: str, expected: str
) -> None:
    raw = f"<tool_call>{body}</tool_call>"
    result = HERMES.parse(f"before {raw} after")
    assert result.calls == []
    [error] = result.errors
    assert expected in error.message
    assert HermesParser.EXAMPLE in error.message
    assert error.raw == raw
    assert result.text == "before  after"


def test_hermes_unterminated_call_swallows_the_rest_of_the_text() -> None:
    good = HERMES.format(ToolCall("f", {}))
    text = f"{good} then <tool_call>{{...}} and {good}"
    result = HERMES.parse(text.removesuffix("</tool_call>"))
    assert [call.raw for call in result.calls] == [good]
    [error] = result.errors
    assert error.message.startswith("unterminated <tool_call>")
    assert error.raw.startswith("<tool_call>{...} and <tool_call>")


def test_hermes_ignores_stray_closing_tags() -> None:
    assert HERMES.parse("</tool_call> done") == ParseResult([], [], "</tool_call> done")


def test_hermes_format_rejects_values_that_are_not_json() -> None:
    with pytest.raises(ValueError):
        HERMES.format(ToolCall("f", {"x": float("nan")}))
    with pytest.raises(TypeError):
        HERMES.format(ToolCall("f", {"x": {1, 2}}))


# --- tags ---------------------------------------------------------------------------------------


@given(
    tag=st.from_regex(r"[A-Za-z_][A-Za-z0-9_.-]{0,8}", fullmatch=True),
    argument=st.text(min_size=1, max_size=8),
    data=st.data(),
)
def test_tag_format_parse_round_trip(tag: str, argument: str, data: st.DataObject) -> None:
    parser = TagParser({tag: argument})
    call = data.draw(tag_calls(parser))
    written = parser.format(call)
    assert parser.parse(written) == ParseResult([ToolCall(tag, call.arguments, written)], [], "")


@given(text=soup(FRAGMENTS).filter(lambda text: without(text, "<python>", "<search>", "<answer>")))
def test_tag_text_without_tags_has_no_calls(text: str) -> None:
    assert TAGS.parse(text) == ParseResult([], [], text)


@given(call=tag_calls(TAGS), data=st.data())
def test_tag_truncated_call_is_an_error_or_plain_text(call: ToolCall, data: st.DataObject) -> None:
    written = TAGS.format(call)
    prefix = written[: data.draw(st.integers(0, len(written) - 1))]
    result = TAGS.parse(prefix)
    assert result.calls == []
    assert len(result.errors) == prefix.startswith(f"<{call.name}>")


@given(calls=st.lists(tag_calls(TAGS), min_size=1, max_size=5), gaps=st.lists(prose, min_size=6))
def test_tag_multiple_calls_keep_order(calls: list[ToolCall], gaps: list[str]) -> None:
    text = gaps[0] + "".join(
        TAGS.format(call) + gap for call, gap in zip(calls, gaps[1 : len(calls) + 1], strict=True)
    )
    result = TAGS.parse(text)
    assert [(c.name, c.arguments) for c in result.calls] == [(c.name, c.arguments) for c in calls]
    assert result.errors == []


def test_tag_content_is_verbatim_except_one_newline_each_side() -> None:
    text = "<python>\n\n  x = 1\t\n\n</python>"
    assert TAGS.parse(text).calls == [ToolCall("python", {"code": "\n  x = 1\t\n"}, text)]
    assert TAGS.parse("<answer> 42 </answer>").calls[0].arguments == {"answer": " 42 "}


def test_tag_first_closing_tag_wins_for_nested_same_tags() -> None:
    result = TAGS.parse("<python>a<python>b</python>c</python>")
    assert result.calls == [
        ToolCall("python", {"code": "a<python>b"}, "<python>a<python>b</python>")
    ]
    assert result.text == "c</python>"


def test_tag_content_may_hold_other_tags_which_are_not_parsed() -> None:
    result = TAGS.parse('<python>print("<answer>")</python><answer>7</answer>')
    assert [(c.name, c.arguments) for c in result.calls] == [
        ("python", {"code": 'print("<answer>")'}),
        ("answer", {"answer": "7"}),
    ]


def test_tag_unmapped_tags_are_plain_text_and_unterminated_tags_are_errors() -> None:
    text = "<think>hmm</think> <search>paris <answer>Paris</answer>"
    result = TAGS.parse(text)
    assert result.calls == []
    [error] = result.errors
    assert error.raw == "<search>paris <answer>Paris</answer>"
    assert "unterminated <search>" in error.message
    assert "</search>" in error.message
    assert result.text == "<think>hmm</think> "


def test_tag_format_layout_and_refusals() -> None:
    assert TAGS.format(ToolCall("answer", {"answer": "42"})) == "<answer>42</answer>"
    assert TAGS.format(ToolCall("python", {"code": "a\nb"})) == "<python>\na\nb\n</python>"
    with pytest.raises(ValueError, match="no tag for tool 'bash'"):
        TAGS.format(ToolCall("bash", {"code": "ls"}))
    with pytest.raises(ValueError, match="exactly one string argument 'code'"):
        TAGS.format(ToolCall("python", {"code": "1", "extra": "2"}))
    with pytest.raises(ValueError, match="cannot contain </python>"):
        TAGS.format(ToolCall("python", {"code": "x</python>"}))


@pytest.mark.parametrize("tags", [{}, {"a b": "x"}, {"<a>": "x"}, {"": "x"}])
def test_tag_parser_rejects_bad_tag_names(tags: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        TagParser(tags)
