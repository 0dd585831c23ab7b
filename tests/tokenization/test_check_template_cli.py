"""`agentrl check-template`: exit status and report for each kind of argument."""

from __future__ import annotations

import argparse
import io
import json

import pytest
from rich.console import Console
from template_cases import ALTERNATING

from agentrl.tokenization import builtin_template
from agentrl.tokenization.cli import add_arguments, run


def check(*argv: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out = io.StringIO()
    status = run(parser.parse_args(list(argv)), Console(file=out, width=300))
    return status, out.getvalue()


def test_smollm2_is_append_only(tokenizer):
    status, out = check("smollm2")
    assert status == 0
    assert "append-only" in out and "NOT" not in out and "<|im_end|>" in out


@pytest.mark.parametrize(
    ("name", "kind"),
    [("reasoning_stripped", "reasoning_dropped"), ("system_last_user", "system_moved")],
)
def test_builtin_template_that_rerenders_exits_1(tokenizer, name, kind):
    status, out = check(name)
    assert status == 1
    assert "NOT append-only" in out and f"[{kind}]" in out and "policy" in out.lower()


def test_jinja_file_with_token_seams_exits_4(tokenizer, tmp_path):
    path = tmp_path / "llama2.jinja"
    path.write_text(builtin_template("system_first_user"))
    status, out = check(str(path))
    assert status == 4
    assert "token seams" in out and "[token_seam]" in out and "seams='reencode'" in out


def test_json_report(tokenizer):
    status, out = check("reasoning_stripped", "--json")
    report = json.loads(out)
    assert status == 1 and report["verdict"] == "not_append_only"
    issues = [issue for use in report["uses"].values() for issue in use["issues"]]
    assert {k for issue in issues for k in issue["kinds"]} == {"reasoning_dropped"}


def test_unusable_template_exits_3(tokenizer, tmp_path):
    path = tmp_path / "alternating.jinja"
    path.write_text(ALTERNATING)
    status, out = check(str(path))
    assert status == 3 and "cannot be used" in out and "alternate" in out
    # without tools (and with an env that always replies) the same template is fine
    assert check(str(path), "--use", "plain")[0] == 0


def test_help_states_what_each_verdict_guarantees(capsys):
    from agentrl.cli import main

    with pytest.raises(SystemExit):
        main(["check-template", "--help"])
    out = capsys.readouterr().out
    for phrase in ("append-only", "(exit 0)", "token seams", "(exit 4)", "(exit 1)", "(exit 3)"):
        assert phrase in out
    assert "encode(render(conversation so far))" in out


def test_missing_model_exits_2(tmp_path):
    status, out = check(str(tmp_path / "no-such-model"))
    assert status == 2 and "cannot load" in out


def test_through_the_agentrl_command(tokenizer, capsys):
    from agentrl.cli import main

    assert main(["check-template", "smollm2"]) == 0
    assert main(["check-template", "reasoning_stripped"]) == 1
    assert "reasoning_dropped" in capsys.readouterr().out


def test_published_template_with_its_markers_added(tokenizer):
    from real_templates import DIRECTORY

    markers = "<|header_start|>,<|header_end|>,<|eot|>,<|begin_of_text|>"
    status, out = check(str(DIRECTORY / "llama4.jinja"), "--special-tokens", markers)
    assert status == 4, out
    assert "['ĊĊ'] in the trajectory, ['Ċ', 'Ċ'] in a full encode" in out
    # without the markers the template has no added end-of-turn token on this vocabulary
    status, out = check(str(DIRECTORY / "llama4.jinja"))
    assert status == 3 and "added token" in out
