"""The date and time a chat template sees, frozen for an episode.

Some templates print the date or the clock (Llama 3.2's ``Today Date: {{ strftime_now("%d %b %Y") }}``,
Granite's, templates that print the time to the second). transformers renders ``strftime_now`` with
``datetime.now()`` at every call, so two renders of one episode made on either side of midnight
disagree: the cached base render goes stale and every delta after midnight fails. A trajectory must
instead see one instant: the episode's start.

:func:`frozen_clock` makes every render inside it see a fixed instant. transformers gives templates no
way to pass their own ``strftime_now`` (it turns callables in template kwargs into placeholder
strings), so this module replaces the ``datetime`` name in ``transformers.utils.chat_template_utils``
with a subclass whose ``now()`` returns the frozen instant while one is set and the real time
otherwise; nothing else changes. :func:`clock_freezes` checks by rendering that this works with the
installed transformers; where it does not, time-dependent templates are refused with an error rather
than rendered with a moving clock.
"""

from __future__ import annotations

import contextlib
import datetime as _datetime
from collections.abc import Iterator
from contextvars import ContextVar
from functools import cache

_frozen: ContextVar[_datetime.datetime | None] = ContextVar("agentrl_template_clock", default=None)


class _TemplateDatetime(_datetime.datetime):
    """``datetime`` whose ``now()`` is the frozen instant of the current context, if any."""

    @classmethod
    def now(cls, tz: _datetime.tzinfo | None = None) -> _datetime.datetime:  # type: ignore[override]
        instant = _frozen.get()
        if instant is None:
            return _datetime.datetime.now(tz)
        return instant if tz is None else instant.astimezone(tz)


@contextlib.contextmanager
def frozen_clock(instant: _datetime.datetime | None) -> Iterator[None]:
    """Templates rendered inside see ``instant`` as the current time (``None``: the real clock)."""
    if instant is not None:
        _install()
    token = _frozen.set(instant)
    try:
        yield
    finally:
        _frozen.reset(token)


@cache
def _install() -> bool:
    """Point transformers' template ``datetime`` at :class:`_TemplateDatetime` (once)."""
    from transformers.utils import chat_template_utils

    if getattr(chat_template_utils, "datetime", None) is not _datetime.datetime:
        return False
    setattr(chat_template_utils, "datetime", _TemplateDatetime)  # noqa: B010 (a module global)
    return True


@cache
def clock_freezes() -> bool:
    """Whether :func:`frozen_clock` reaches ``strftime_now`` with the installed transformers."""
    from transformers.utils.chat_template_utils import render_jinja_template

    probe = _datetime.datetime(1999, 12, 31, 23, 59, 58)
    with frozen_clock(probe):
        rendered = render_jinja_template(
            [[]], chat_template="{{ strftime_now('%Y-%m-%d %H:%M:%S') }}"
        )
    return rendered[0][0] == "1999-12-31 23:59:58"
