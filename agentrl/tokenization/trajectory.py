"""The builder rollouts use: token-exact trajectories from templates that were checked first.

:class:`TrajectoryBuilder` is
:class:`~agentrl.tokenization.token_trajectory.UncheckedTrajectoryBuilder` (whose module
docstring states the contract: the ids an engine saw, built turn by turn, never re-encoded; token
seams and :class:`SeamPolicy`) asking :func:`~agentrl.tokenization.check_template` first whether
its template is append-only for the episode's kind of conversation (with tools, without, and again
for an environment step that returns no messages). Templates that are not append-only are handled
by :class:`TemplatePolicy`, never silently: kept with a :class:`TemplateWarning`, or refused with
:class:`TemplateNotAppendOnlyError`.

The trajectory records (:class:`TokenTrajectory`, :class:`Segment`, :class:`SegmentKind`,
:class:`SeamEdit`), :class:`SeamPolicy` and :func:`seam_edit` live in
:mod:`agentrl.tokenization.token_trajectory` and are re-exported here.
"""

from __future__ import annotations

import datetime
import enum
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentrl.tokenization.chat_format import ChatFormat, Message, TemplateError
from agentrl.tokenization.checker import TemplateReport, Verdict, check_template
from agentrl.tokenization.token_trajectory import (
    SeamEdit,
    SeamPolicy,
    Segment,
    SegmentKind,
    TokenTrajectory,
    UncheckedTrajectoryBuilder,
    seam_edit,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "SeamEdit",
    "SeamPolicy",
    "Segment",
    "SegmentKind",
    "TemplateNotAppendOnlyError",
    "TemplatePolicy",
    "TemplateWarning",
    "TokenTrajectory",
    "TrajectoryBuilder",
    "seam_edit",
]


class TemplatePolicy(enum.StrEnum):
    """What a builder does with a template that is not append-only.

    ``KEEP`` (default): keep the token-exact sequence the engine saw and emit one
    :class:`TemplateWarning` per template naming the problems. The trajectory then differs from a
    from-scratch render of the final conversation (earlier reasoning still present, the system
    prompt where it first was, token seams...): what the trainer scores is what the engine saw,
    but an SFT or evaluation pipeline that re-renders conversations will see other tokens.
    ``STRICT``: refuse the template unless the builder's ids equal a full render (token seams are
    accepted with ``seams="reencode"``); the constructor raises
    :class:`TemplateNotAppendOnlyError`.

    A template that cannot be used at all for the episode's kind of conversation (it raises for
    its roles) is refused under both policies.
    """

    KEEP = "keep"
    STRICT = "strict"


class TemplateWarning(UserWarning):
    """A trajectory will keep tokens that a from-scratch render of the conversation would change."""


class TemplateNotAppendOnlyError(TemplateError):
    """Raised under ``TemplatePolicy.STRICT``; ``report`` says where the template re-renders."""

    def __init__(self, report: TemplateReport, use: str | None = None):
        super().__init__(f"chat template is not append-only:\n{report.describe(use)}")
        self.report = report


_warned: set[tuple[ChatFormat, str, bool]] = set()


class TrajectoryBuilder(UncheckedTrajectoryBuilder):
    """Builds one :class:`TokenTrajectory` from the reset messages, engine outputs and env messages.

    ``tokenizer`` is a tokenizer (its chat template, or ``chat_template`` when given) or a
    :class:`ChatFormat`. ``tools`` are OpenAI-style schemas passed to the template on every render.
    ``now`` is the instant every render of the episode sees (default: when the builder is made).
    ``policy`` and ``seams``: see :class:`TemplatePolicy` and :class:`SeamPolicy`.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase | ChatFormat,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        policy: TemplatePolicy | str = TemplatePolicy.KEEP,
        chat_template: str | None = None,
        now: datetime.datetime | None = None,
        seams: SeamPolicy | str = SeamPolicy.KEEP,
    ):
        if isinstance(tokenizer, ChatFormat):
            if chat_template is not None:
                raise ValueError("pass chat_template= with a tokenizer, not with a ChatFormat")
            fmt = tokenizer
        else:
            fmt = ChatFormat.of(tokenizer, chat_template)
        self.policy = TemplatePolicy(policy)
        seams = SeamPolicy(seams)
        self._system = bool(messages) and messages[0].get("role") == "system"
        _apply_policy(fmt, "tools" if tools else "plain", self.policy, seams, self._system)
        super().__init__(fmt, messages, tools, now=now, seams=seams)

    def add_messages(self, messages: Sequence[Message]) -> None:
        """Append env ``messages`` (tool results, feedback; possibly none) as delta ids plus the
        generation prompt, mask 0, closing a truncated turn first. Raises
        :class:`~agentrl.tokenization.TemplateError`, appending nothing, if the template refuses
        the conversation's roles or re-renders earlier turns for these messages."""
        super().add_messages(messages)

    def _admit(self, messages: Sequence[Message]) -> None:
        """A step with no messages is its own use of the template: apply the policy to it."""
        if not messages:
            _apply_policy(self.format, "no_reply", self.policy, self.seams, self._system)


def _apply_policy(
    fmt: ChatFormat, use: str, policy: TemplatePolicy, seams: SeamPolicy, system: bool
) -> None:
    """Refuse, warn about or accept ``fmt`` for ``use`` ("tools", "plain" or "no_reply") in
    episodes with (or without) a system message."""
    report = check_template(fmt)
    verdict = report.verdict([use], system)
    if verdict is Verdict.APPEND_ONLY:
        return
    usage = report.use(use)
    if verdict is Verdict.UNUSABLE:
        raise TemplateError(
            f"the chat template cannot be used for {_USE_NAMES[use]}: "
            f"{usage.error if usage else report.error}"
        )
    exact = usage is not None and usage.reencode_exact
    if verdict is Verdict.TOKEN_SEAMS and seams is SeamPolicy.REENCODE and exact:
        return
    if policy is TemplatePolicy.STRICT:
        raise TemplateNotAppendOnlyError(report, use)
    if (fmt, use, system) not in _warned:
        _warned.add((fmt, use, system))
        what = (
            "keeping the ids the engine saw at token seams (seams='reencode' makes them equal a "
            "full render)"
            if verdict is Verdict.TOKEN_SEAMS
            else "keeping the tokens the engine saw (policy 'keep')"
        )
        warnings.warn(
            f"chat template is not append-only for {_USE_NAMES[use]}; {what}:\n"
            f"{report.describe(use)}",
            TemplateWarning,
            stacklevel=3,
        )


_USE_NAMES = {
    "tools": "conversations with tools",
    "plain": "conversations without tools",
    "no_reply": "an environment step that returns no messages",
}
