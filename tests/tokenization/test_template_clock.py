"""Templates that print the date or the clock: the wall clock is moved (time-machine) across midnight
during an episode and between episodes; every episode renders at its own start."""

from __future__ import annotations

import datetime as dt
import warnings

import pytest
import time_machine

from agentrl.tokenization import ChatFormat, TrajectoryBuilder, Verdict, check_template

# Llama 3.2 style: the date in the system header of every render.
DATED = (
    "{{- '<|im_start|>system\\nToday Date: ' + strftime_now('%d %b %Y') + '<|im_end|>\\n' }}"
    "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# The clock to the second, as one family prints it.
CLOCKED = DATED.replace("Today Date: ' + strftime_now('%d %b %Y')", "' + strftime_now('%H:%M:%S')")
assert CLOCKED != DATED

BEFORE_MIDNIGHT = dt.datetime(2026, 3, 1, 23, 59, 58)
AFTER_MIDNIGHT = dt.datetime(2026, 3, 2, 0, 0, 7)


def _turn(builder: TrajectoryBuilder, reply: str, user: str) -> None:
    fmt = builder.format
    ids = [*fmt.encode(reply), fmt.end_of_turn_id]
    builder.add_completion(ids, [0.0] * len(ids), 0, text=reply)
    builder.add_messages([{"role": "user", "content": user}])


def _rendered_ids(builder: TrajectoryBuilder, at: dt.datetime) -> list[int]:
    fmt = builder.format
    return fmt.encode(fmt.render(builder.messages, add_generation_prompt=True, now=at))


@pytest.mark.parametrize(("template", "shown"), [(DATED, "01 Mar 2026"), (CLOCKED, "23:59:58")])
def test_episode_across_midnight_keeps_its_start(tokenizer, template, shown):
    fmt = ChatFormat.of(tokenizer, template)
    with time_machine.travel(BEFORE_MIDNIGHT, tick=False) as clock:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the checker does not flag the clock as a problem
            builder = TrajectoryBuilder(fmt, [{"role": "user", "content": "hi"}])
        _turn(builder, "Hello.", "what day is it?")
        clock.move_to(AFTER_MIDNIGHT)
        _turn(builder, "Still the day we started.", "thanks")  # raised before the fix
        assert builder.now == BEFORE_MIDNIGHT
        assert builder.prompt_ids() == _rendered_ids(builder, BEFORE_MIDNIGHT)
        assert builder.prompt_ids() != _rendered_ids(builder, AFTER_MIDNIGHT)
        assert shown in fmt.decode(builder.prompt_ids())

        # a new episode after midnight: the shared format's cached base is not stale
        later = TrajectoryBuilder(fmt, [{"role": "user", "content": "hi again"}])
        _turn(later, "Hello.", "what day is it now?")
        clock.shift(dt.timedelta(hours=30))
        _turn(later, "The day this episode began.", "ok")
        assert later.now == AFTER_MIDNIGHT
        assert later.prompt_ids() == _rendered_ids(later, AFTER_MIDNIGHT)


def test_checker_reports_time_dependence(tokenizer):
    report = check_template(tokenizer, DATED)
    assert report.time_dependent and report.clock_formats == ("%d %b %Y",)
    assert report.verdict() is Verdict.APPEND_ONLY
    assert check_template(tokenizer, CLOCKED).clock_formats == ("%H:%M:%S",)
    plain = check_template(tokenizer)
    assert not plain.time_dependent and plain.clock_formats == ()


def test_the_clock_really_moves_without_a_frozen_instant(tokenizer):
    # what the builder protects against: two renders of one conversation on either side of midnight
    fmt = ChatFormat.of(tokenizer, DATED)
    messages = [{"role": "user", "content": "hi"}]
    with time_machine.travel(BEFORE_MIDNIGHT, tick=False) as clock:
        before = fmt.render(messages)
        clock.move_to(AFTER_MIDNIGHT)
        assert fmt.render(messages) != before
        assert fmt.render(messages, now=BEFORE_MIDNIGHT) == before
