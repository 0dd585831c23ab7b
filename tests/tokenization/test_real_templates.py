"""The checker and the builder on the published chat templates of real model families
(``real_templates/``, SmolLM2's vocabulary plus each family's markers as special tokens).

* ``test_verdicts``: what the checker says about each template, per use, and why (a table kept
  in step with docs/architecture.md).
* ``test_verdict_holds_on_random_episodes``: random multi-turn episodes (tools or not, reasoning,
  truncated turns, empty environment replies) through a simulated engine. Where the checker says
  append-only or token seams, the ids fed at every generation point decode to the full render;
  where it says append-only they also equal its encoding (when the engine's ids do not merge with
  the prompt before them); with ``seams="reencode"`` the final ids equal the full encode whenever
  the engine's ids are the tokenizer's own. Where it says "cannot be used", the builder refuses;
  where the builder refuses an episode's messages, the checker did not call the template safe.
* ``test_llama_seam_on_the_real_template``: the ``<|end_header_id|>\\n\\n`` seam, id by id.
"""

from __future__ import annotations

import datetime as dt

import jinja2
import pytest
from episodes import TOOLS, engine_output, episodes
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from real_templates import TEMPLATES, real_tokenizer

from agentrl.tokenization import (
    ChatFormat,
    TemplateError,
    TrajectoryBuilder,
    Verdict,
    check_template,
)

NOW = dt.datetime(2026, 3, 1, 12, 0, 0)
A, S, N, U = (
    Verdict.APPEND_ONLY,
    Verdict.TOKEN_SEAMS,
    Verdict.NOT_APPEND_ONLY,
    Verdict.UNUSABLE,
)
# name -> verdicts for (tools, plain, no_reply), and why
VERDICTS: dict[str, tuple[Verdict, Verdict, Verdict, str]] = {
    "llama3_1": (N, N, N, "trims assistant content; '<|end_header_id|>\\n\\n' seams"),
    "llama3_2": (N, N, N, "as Llama 3.1, and prints today's date"),
    "llama4": (S, S, S, "'<|header_end|>\\n\\n' merges with the generated text"),
    "deepseek_r1": (N, N, N, "drops reasoning from earlier turns"),
    "deepseek_v3_1": (N, N, N, "drops reasoning from earlier turns"),
    "qwen3": (N, N, N, "drops reasoning before the last user turn"),
    "qwen3_coder": (A, A, A, ""),
    "mistral_nemo": (
        U,
        N,
        U,
        "tool results need 9-character ids; system prompt moves; alternation",
    ),
    "phi4_mini": (A, A, A, ""),
    "gemma3": (U, N, U, "roles must alternate (no tool role, no empty reply); trims content"),
    "granite3_3": (A, A, A, "prints today's date in its default system prompt"),
    "olmo3_think": (N, N, N, "the generation prompt pre-fills '<think>'; last turn ends in eos"),
    "hermes3": (N, U, U, "renders only with tools; a tool result's newline depends on the next"),
    "chatml": (A, A, N, "no generation prompt after an assistant message"),
}
NAMES = [t.name for t in TEMPLATES]


@pytest.fixture(scope="session")
def real_formats(tokenizer) -> dict[str, ChatFormat]:
    return {t.name: ChatFormat(real_tokenizer(tokenizer, t)) for t in TEMPLATES}


def test_every_checked_in_template_has_a_verdict():
    assert sorted(VERDICTS) == sorted(NAMES) and len(NAMES) >= 8


@pytest.mark.parametrize("name", NAMES)
def test_verdicts(real_formats, name):
    report = check_template(real_formats[name])
    got = tuple(report.use(use).verdict for use in ("tools", "plain", "no_reply"))
    assert got == VERDICTS[name][:3], report.describe()


def test_time_dependent_real_templates(real_formats):
    dated = {n for n in NAMES if check_template(real_formats[n]).time_dependent}
    assert dated == {"llama3_2", "granite3_3"}  # Llama 4 computes the date but never prints it


def _raises(render) -> bool:
    try:
        render()
    except (jinja2.TemplateError, TypeError, ValueError, KeyError):
        return True
    return False


@pytest.mark.filterwarnings("ignore::agentrl.tokenization.TemplateWarning")
@pytest.mark.parametrize("use", ["tools", "plain"])
@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_verdict_holds_on_random_episodes(real_formats, name, use, data):
    fmt = real_formats[name]
    tools = TOOLS if use == "tools" else None
    reset, turns = data.draw(episodes(tools=use == "tools"))
    system = reset[0]["role"] == "system"
    report = check_template(fmt)

    def render(conversation: list[dict], generation_prompt: bool) -> str:
        return fmt.render(conversation, tools, add_generation_prompt=generation_prompt, now=NOW)

    if report.verdict([use], system) is Verdict.UNUSABLE:
        event("refused: cannot be used")
        with pytest.raises(TemplateError):
            TrajectoryBuilder(fmt, reset, tools, now=NOW)
        return
    if _raises(lambda: render(reset, True)):
        with pytest.raises(TemplateError):
            TrajectoryBuilder(fmt, reset, tools, now=NOW)
        return
    kept = TrajectoryBuilder(fmt, reset, tools, now=NOW)
    fixed = TrajectoryBuilder(fmt, reset, tools, now=NOW, seams="reencode")
    uses = [use]
    conversation = list(reset)
    fed: list[tuple[list[int], list[int], str]] = []
    canonical = True

    def end_of_turn(content: str) -> int:
        return fmt.closing_ids(content, tools, now=NOW)[-1]

    for version, turn in enumerate(turns):
        prompt = kept.prompt_ids()
        ids, content = engine_output(fmt.tokenizer, turn, end_of_turn)
        body = ids if turn.truncate is not None else ids[:-1]
        canonical = canonical and fmt.encode(fmt.decode(body)) == body
        for builder in (kept, fixed):
            builder.add_completion(ids, [-0.1] * len(ids), version, text=content)
        fed.append((prompt, ids, render(conversation, True)))
        conversation.append({"role": "assistant", "content": content})
        if turn.env is None:
            break
        if not turn.env:
            uses.append("no_reply")
        before = kept.trajectory
        try:
            kept.add_messages(turn.env)
        except TemplateError:
            # refused, nothing appended, and the checker did not call this safe (or the
            # template itself refuses the conversation)
            assert kept.trajectory == before
            event("refused mid-episode")
            upcoming = [*conversation, *turn.env, {"role": "assistant", "content": "x"}]
            assert report.verdict(uses, system) in (N, U) or _raises(
                lambda upcoming=upcoming: render(upcoming, False)
            )
            return
        fixed.add_messages(turn.env)
        conversation.extend(turn.env)
    verdict = report.verdict(uses, system)
    t = kept.trajectory
    for prompt, ids, _ in fed:  # the engine's ids as produced, the prompts as fed
        assert t.input_ids[: len(prompt)] == prompt
        assert t.input_ids[len(prompt) : len(prompt) + len(ids)] == ids
    event(f"verdict {verdict.value}")
    if verdict not in (A, S):
        return
    for prompt, _, rendered in fed:
        assert fmt.decode(prompt) == rendered
    ends_on_messages = turns[-1].env is not None
    if ends_on_messages:
        assert fmt.decode(t.input_ids) == render(conversation, True)
    else:  # the last turn is closed only when something follows, in some templates
        assert render([*conversation, {"role": "user", "content": "x"}], True).startswith(
            fmt.decode(t.input_ids)
        )
    event(f"reencode compared with a full encode: {canonical and ends_on_messages}")
    if canonical and ends_on_messages:
        assert fixed.prompt_ids() == fmt.encode(render(conversation, True))
    if verdict is A:
        merge_free = all(
            fmt.encode(rendered + fmt.decode(ids)) == fmt.encode(rendered) + ids
            for _, ids, rendered in fed
        )
        event(f"ids compared with a full encode: {merge_free and ends_on_messages}")
        if merge_free and ends_on_messages:
            assert t.input_ids == fmt.encode(render(conversation, True))


def test_llama_seam_on_the_real_template(real_formats):
    fmt = real_formats["llama4"]
    messages = [{"role": "user", "content": "What is 2+2?"}]
    fixed = TrajectoryBuilder(fmt, messages, now=NOW, seams="reencode")
    kept = TrajectoryBuilder(fmt, messages, now=NOW)
    for builder in (kept, fixed):
        assert fmt.decode(builder.prompt_ids()).endswith("<|header_end|>\n\n")
        reply = [*fmt.encode("4."), fmt.end_of_turn_id]
        builder.add_completion(reply, [-0.1] * len(reply), 0, text="4.")
        builder.add_messages([{"role": "user", "content": "And 3+3?"}])
    full = fmt.encode(fmt.render(kept.messages, add_generation_prompt=True, now=NOW))
    assert fixed.prompt_ids() == full != kept.prompt_ids()
    assert fmt.decode(kept.prompt_ids()) == fmt.decode(full)
    (edit,) = fixed.trajectory.seams
    assert fmt.decode(list(edit.replaced)) == "\n\n" and edit.engine_tokens == 0
