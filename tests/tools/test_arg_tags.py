"""ArgTagParser: tag-format calls with several arguments, built from the tools' schemas."""

from hypothesis import given
from hypothesis import strategies as st

from agentrl.tools import Tool
from agentrl.tools.arg_tags import ArgTagParser
from agentrl.tools.parsers import ToolCall


def bash(command: str) -> str:
    """Run."""
    return command


def view(path: str, start_line: int = 1, end_line: int = -1) -> str:
    """Show."""
    return path


def str_replace(path: str, old: str, new: str) -> str:
    """Edit."""
    return path


def submit() -> str:
    """Done."""
    return "ok"


PARSER = ArgTagParser([Tool.from_function(f) for f in (bash, view, str_replace, submit)])


def test_one_argument_tools_take_the_whole_content():
    result = PARSER.parse("Look:\n<bash>\nls -la\n</bash>\ndone")
    assert [(c.name, c.arguments) for c in result.calls] == [("bash", {"command": "ls -la"})]
    assert result.errors == [] and result.text == "Look:\n\ndone"


def test_several_arguments_are_inner_tags_and_integers_are_converted():
    text = "<view>\n<path>a.py</path>\n<end_line>20</end_line>\n</view><submit></submit>"
    view_call, submit_call = PARSER.parse(text).calls
    assert view_call.arguments == {"path": "a.py", "end_line": 20}
    assert (submit_call.name, submit_call.arguments) == ("submit", {})


def test_values_keep_other_tags_and_newlines():
    text = "<str_replace><path>x.py</path><old>\nif a < b:\n</old><new><b></new></str_replace>"
    (call,) = PARSER.parse(text).calls
    assert call.arguments == {"path": "x.py", "old": "if a < b:", "new": "<b>"}


def test_malformed_calls_become_errors_that_show_the_form():
    for text, problem in [
        ("<view><path>a</path><start_line>x</start_line></view>", "must hold a integer"),
        ("<str_replace><path>a</path><old>b</old></str_replace>", "missing <new>"),
        ("<view>a.py</view>", "unexpected text 'a.py'"),
        ("<view><path>a</path>", "unterminated <view>"),
    ]:
        result = PARSER.parse(text)
        assert result.calls == [] and len(result.errors) == 1, text
        assert problem in result.errors[0].message
    assert "<path>...</path>" in PARSER.parse("<view>a.py</view>").errors[0].message


def test_format_is_parsed_back():
    calls = [
        ToolCall("bash", {"command": "echo 1\necho 2"}),
        ToolCall("view", {"path": "a.py", "start_line": 3}),
        ToolCall("str_replace", {"path": "a", "old": "x\n", "new": ""}),
        ToolCall("submit", {}),
    ]
    for call in calls:
        (back,) = PARSER.parse(PARSER.format(call)).calls
        assert (back.name, back.arguments) == (call.name, call.arguments)


@given(st.text())
def test_parse_never_raises(text):
    PARSER.parse(text)
