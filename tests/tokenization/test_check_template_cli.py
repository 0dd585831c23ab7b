"""`agentrl check-template`: exit status and report for each kind of argument."""

from __future__ import annotations

import argparse
import io
import json

import pytest
from rich.console import Console

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


def test_jinja_file_on_the_smollm2_vocabulary(tokenizer, tmp_path):
    path = tmp_path / "llama2.jinja"
    path.write_text(builtin_template("system_first_user"))
    assert check(str(path))[0] == 0


def test_json_report(tokenizer):
    status, out = check("reasoning_stripped", "--json")
    report = json.loads(out)
    assert status == 1 and report["ok"] is False
    assert {k for issue in report["issues"] for k in issue["kinds"]} == {"reasoning_dropped"}


def test_missing_model_exits_2(tmp_path):
    status, out = check(str(tmp_path / "no-such-model"))
    assert status == 2 and "cannot load" in out


def test_through_the_agentrl_command(tokenizer, capsys):
    from agentrl.cli import main

    assert main(["check-template", "smollm2"]) == 0
    assert main(["check-template", "reasoning_stripped"]) == 1
    assert "reasoning_dropped" in capsys.readouterr().out
