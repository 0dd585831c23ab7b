"""check_template on SmolLM2's template, the hand-written ones, and one template per issue kind."""

from __future__ import annotations

import pytest
from template_cases import template_source

from agentrl.tokenization import ChatFormat, IssueKind, Verdict, check_template

CHATML_TAIL = (
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize("name", ["smollm2", "tool_role_eom"])
def test_append_only_templates_pass(tokenizer, name):
    report = check_template(tokenizer, template_source(name))
    assert report.ok and report.verdict() is Verdict.APPEND_ONLY, report.describe()
    assert report.describe() == ""
    assert {use.name for use in report.uses} == {"tools", "plain", "no_reply"}


def test_prompt_that_merges_with_the_generated_text_has_token_seams(tokenizer):
    # "[/INST] " ends the prompt; a full encode merges its space with the first generated word.
    report = check_template(tokenizer, template_source("system_first_user"))
    assert report.verdict() is Verdict.TOKEN_SEAMS and not report.ok and not report.issues
    seam = report.use("tools").seams[0]
    assert (seam.built, seam.rendered, seam.engine_tokens) == (("Ġ", "<"), ("Ġ<",), 1)
    assert all(use.reencode_exact for use in report.uses)
    assert "token_seam" in report.describe() and "'Ġ<'" in report.describe()


@pytest.mark.parametrize(
    ("name", "kind", "conversations"),
    [
        ("reasoning_stripped", IssueKind.REASONING_DROPPED, {"with_system", "without_system"}),
        ("system_last_user", IssueKind.SYSTEM_MOVED, {"with_system"}),
    ],
)
def test_templates_that_rerender_are_flagged_with_their_kind(tokenizer, name, kind, conversations):
    report = check_template(tokenizer, template_source(name))
    assert report.verdict() is Verdict.NOT_APPEND_ONLY and not report.ok
    assert report.kinds == {kind}
    tools = report.use("tools")
    assert tools.verdict is Verdict.NOT_APPEND_ONLY
    assert {issue.conversation for issue in tools.issues} == conversations
    # the first assistant turn that a later user message rewrites
    issue = tools.issues[0]
    assert issue.message_index == 5 if issue.conversation == "with_system" else 4
    assert issue.earlier != issue.later and issue.earlier[:20] == issue.later[:20]
    assert kind.value in report.describe()


def test_reasoning_snippets_show_what_was_dropped(tokenizer):
    issue = check_template(tokenizer, template_source("reasoning_stripped")).issues[0]
    assert "<think>" in issue.earlier and "<think>" not in issue.later


def test_facts_about_smollm2(tokenizer):
    report = check_template(tokenizer)
    assert report.end_of_turn_tokens == ("<|im_end|>",)
    assert report.generation_prompt == "<|im_start|>assistant\n"
    assert report.renders_tools is False  # SmolLM2's template ignores `tools`
    assert check_template(tokenizer, template_source("tool_role_eom")).renders_tools


def test_generation_prompt_that_the_turn_does_not_start_with(tokenizer):
    # Qwen3 with thinking disabled: the prompt pre-fills an empty <think> block that the rendered
    # assistant turn does not contain.
    template = (
        "{% for m in messages %}"
        + CHATML_TAIL.replace("<|im_start|>assistant\n{% endif %}", "")
        + "<|im_start|>assistant\n<think>\n\n</think>\n\n{% endif %}"
    )
    report = check_template(tokenizer, template)
    assert IssueKind.ASSISTANT_REWRITTEN in report.kinds
    assert report.verdict() is Verdict.NOT_APPEND_ONLY


def test_turn_counter_gives_context_dependent_deltas(tokenizer):
    # Numbers user turns: append-only, but a delta rendered after the fixed base has the wrong count.
    template = (
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% if m['role'] == 'user' %}"
        "{% set ns.n = ns.n + 1 %}<|im_start|>user #{{ ns.n }}\n{{ m['content'] }}<|im_end|>\n"
        "{% else %}" + CHATML_TAIL.replace("{% endfor %}", "{% endif %}{% endfor %}")
    )
    report = check_template(tokenizer, template)
    assert report.verdict() is Verdict.NOT_APPEND_ONLY
    assert report.kinds == {IssueKind.CONTEXT_DEPENDENT_DELTA}


def test_unusable_template_is_a_verdict_not_a_crash(tokenizer):
    report = check_template(tokenizer, "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert report.error and "added token" in report.error
    assert not report.ok and report.verdict() is Verdict.UNUSABLE


def test_report_is_cached_per_format(tokenizer):
    fmt = ChatFormat(tokenizer, template_source("reasoning_stripped"))
    assert check_template(fmt) is check_template(fmt)
    issues = check_template(fmt).to_dict()["uses"]["tools"]["issues"]
    assert issues[0]["kinds"] == ["reasoning_dropped"]
