"""Token-in/token-out trajectories: the ids an engine saw, built turn by turn, never re-encoded.

:class:`TrajectoryBuilder` contract:

* The initial prompt is the chat template on the reset messages (with the tool schemas) plus the
  generation prompt. :meth:`~TrajectoryBuilder.prompt_ids` always returns every id so far; before a
  generation it is exactly what the engine must be fed.
* :meth:`~TrajectoryBuilder.add_completion` appends the engine's ids verbatim (end-of-turn token
  included) with loss mask 1, their log-probs and the weight version. Consecutive calls continue one
  assistant turn (a partial rollout resumed after a weight update), until one ends with an
  end-of-turn id; then the next call must be :meth:`~TrajectoryBuilder.add_messages`.
* :meth:`~TrajectoryBuilder.add_messages` appends the environment's messages (possibly none) as
  delta ids plus the next generation prompt (see :mod:`agentrl.tokenization.chat_format`), mask 0.
  If the turn did not end with an end-of-turn id (finish reason "length" or "abort"), the template's
  closing for the turn's text (normally the end-of-turn token alone) is appended first, mask 0.
* Everything not produced by the engine has loss mask 0, log-prob 0.0 and version -1.
* Earlier ids are never changed. For an append-only template, the ids at every generation point
  decode to the template's rendering of the conversation so far.

Templates that are not append-only (:func:`~agentrl.tokenization.check_template`) are handled by
:class:`TemplatePolicy`, never silently.
"""

from __future__ import annotations

import enum
import warnings
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentrl.tokenization.chat_format import ChatFormat, Message, TemplateError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from agentrl.tokenization.checker import TemplateReport


class TemplatePolicy(enum.StrEnum):
    """What a builder does with a template that is not append-only.

    ``KEEP`` (default): keep the token-exact sequence the engine saw and emit one
    :class:`TemplateWarning` per template naming the problems. The trajectory then differs from a
    from-scratch render of the final conversation (earlier reasoning still present, the system
    prompt where it first was...): what the trainer scores is what the engine saw, but an SFT or
    evaluation pipeline that re-renders conversations will see other tokens.
    ``STRICT``: refuse the template; the constructor raises :class:`TemplateNotAppendOnlyError`.
    """

    KEEP = "keep"
    STRICT = "strict"


class TemplateWarning(UserWarning):
    """A trajectory will keep tokens that a from-scratch render of the conversation would change."""


class TemplateNotAppendOnlyError(TemplateError):
    """Raised under ``TemplatePolicy.STRICT``; ``report`` says where the template re-renders."""

    def __init__(self, report: TemplateReport):
        super().__init__(f"chat template is not append-only:\n{report.describe()}")
        self.report = report


class SegmentKind(enum.StrEnum):
    """Where a run of ids came from."""

    PROMPT = "prompt"  # the initial prompt, mask 0
    COMPLETION = "completion"  # engine output, mask 1
    CLOSING = "closing"  # end-of-turn added after a truncated completion, mask 0
    DELTA = "delta"  # environment messages plus the generation prompt, mask 0


@dataclass(frozen=True)
class Segment:
    """Ids ``[start, end)`` of a trajectory came from ``kind``."""

    kind: SegmentKind
    start: int
    end: int


@dataclass
class TokenTrajectory:
    """The trainer's record of one episode, token-aligned: four lists of equal length.

    ``loss_mask`` is 1 exactly on engine-produced ids (the ``COMPLETION`` segments), ``logprobs``
    holds the engine's log-prob there and 0.0 elsewhere, ``versions`` the weight version there and
    -1 elsewhere. ``segments`` cover ``[0, len)`` in order. The constructor checks all of this.
    """

    input_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    versions: list[int]
    prompt_length: int
    segments: list[Segment] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        if not len(self.loss_mask) == len(self.logprobs) == len(self.versions) == n:
            raise ValueError("input_ids, loss_mask, logprobs and versions differ in length")
        if not 0 <= self.prompt_length <= n:
            raise ValueError(f"prompt_length {self.prompt_length} outside [0, {n}]")
        if not set(self.loss_mask) <= {0, 1}:
            raise ValueError("loss_mask holds values other than 0 and 1")
        position = 0
        for segment in self.segments:
            if segment.start != position or segment.end < segment.start:
                raise ValueError(f"segments are not contiguous at {segment}")
            engine = segment.kind is SegmentKind.COMPLETION
            for i in range(segment.start, segment.end):
                if self.loss_mask[i] != engine or (not engine and self.versions[i] != -1):
                    raise ValueError(f"loss mask or version at {i} disagree with {segment.kind}")
            position = segment.end
        if self.segments and position != n:
            raise ValueError(f"segments cover {position} of {n} ids")

    def __len__(self) -> int:
        return len(self.input_ids)

    @classmethod
    def empty(cls) -> TokenTrajectory:
        """No ids at all (an episode that failed before its first prompt)."""
        return cls([], [], [], [], 0, [])

    def to_dict(self) -> dict[str, Any]:
        """Plain lists and ints (JSON / Parquet ready); :meth:`from_dict` inverts it."""
        return {
            "input_ids": list(self.input_ids),
            "loss_mask": list(self.loss_mask),
            "logprobs": list(self.logprobs),
            "versions": list(self.versions),
            "prompt_length": self.prompt_length,
            "segments": [
                {"kind": s.kind.value, "start": s.start, "end": s.end} for s in self.segments
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TokenTrajectory:
        return cls(
            input_ids=[int(x) for x in data["input_ids"]],
            loss_mask=[int(x) for x in data["loss_mask"]],
            logprobs=[float(x) for x in data["logprobs"]],
            versions=[int(x) for x in data["versions"]],
            prompt_length=int(data["prompt_length"]),
            segments=[
                Segment(SegmentKind(s["kind"]), int(s["start"]), int(s["end"]))
                for s in data.get("segments") or ()
            ],
        )


class _State(enum.Enum):
    GENERATE = "the prompt ends with a generation prompt"
    IN_TURN = "the last completion did not end its turn"
    TURN_ENDED = "the last completion ended with an end-of-turn id"


_warned: weakref.WeakSet[ChatFormat] = weakref.WeakSet()


class TrajectoryBuilder:
    """Builds one :class:`TokenTrajectory` from the reset messages, engine outputs and env messages.

    ``tokenizer`` is a tokenizer (its chat template, or ``chat_template`` when given) or a
    :class:`ChatFormat`. ``tools`` are OpenAI-style schemas passed to the template on every render.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase | ChatFormat,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        policy: TemplatePolicy | str = TemplatePolicy.KEEP,
        chat_template: str | None = None,
    ):
        if isinstance(tokenizer, ChatFormat):
            if chat_template is not None:
                raise ValueError("pass chat_template= with a tokenizer, not with a ChatFormat")
            self.format = tokenizer
        else:
            self.format = ChatFormat.of(tokenizer, chat_template)
        if not messages:
            raise ValueError("a trajectory starts from at least one message")
        _apply_policy(self.format, TemplatePolicy(policy))
        self.tools = [dict(t) for t in tools] if tools else None
        self._messages: list[dict[str, Any]] = [dict(m) for m in messages]
        self._ids = self.format.prompt_ids(self._messages, self.tools)
        self._mask = [0] * len(self._ids)
        self._logprobs = [0.0] * len(self._ids)
        self._versions = [-1] * len(self._ids)
        self._segments = [Segment(SegmentKind.PROMPT, 0, len(self._ids))]
        self._prompt_length = len(self._ids)
        self._state = _State.GENERATE
        self._turn_start = 0  # first id of the current assistant turn
        self._turn_texts: list[str] | None = []  # None once a piece came without text

    @property
    def end_of_turn_ids(self) -> frozenset[int]:
        """Ids that end an assistant turn: the engine's stop tokens."""
        return self.format.end_of_turn_ids

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The conversation so far; assistant contents are the engine's text (end-of-turn excluded)."""
        if self._state is _State.GENERATE:
            return [dict(m) for m in self._messages]
        return [*(dict(m) for m in self._messages), self._assistant_message()]

    def prompt_ids(self) -> list[int]:
        """Every id so far (a copy): exactly what to feed the engine for the next generation."""
        return list(self._ids)

    def add_completion(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[float],
        version: int | Sequence[int],
        text: str | None = None,
    ) -> None:
        """Append engine output verbatim: mask 1, its log-probs, weight ``version`` (>= 0): one
        version for all the ids, or one per id (a generation that spanned a weight update).

        ``text`` is the engine's decoded text of ``token_ids`` without the end-of-turn token; it
        only saves a decode when the turn is recorded in :attr:`messages`.
        """
        if self._state is _State.TURN_ENDED:
            raise RuntimeError("the turn already ended; add the environment's messages first")
        if len(token_ids) != len(logprobs):
            raise ValueError(f"{len(token_ids)} token ids but {len(logprobs)} log-probs")
        versions = [version] * len(token_ids) if isinstance(version, int) else list(version)
        if len(versions) != len(token_ids):
            raise ValueError(f"{len(token_ids)} token ids but {len(versions)} weight versions")
        if any(v < 0 for v in versions):
            raise ValueError(f"weight versions must be >= 0, got {version}")
        if self._state is _State.GENERATE:
            self._turn_start, self._turn_texts = len(self._ids), []
        start = len(self._ids)
        self._ids.extend(int(t) for t in token_ids)
        self._mask.extend([1] * len(token_ids))
        self._logprobs.extend(float(p) for p in logprobs)
        self._versions.extend(int(v) for v in versions)
        if len(token_ids):
            self._segments.append(Segment(SegmentKind.COMPLETION, start, len(self._ids)))
        if self._turn_texts is not None:
            self._turn_texts = None if text is None else [*self._turn_texts, text]
        ended = len(token_ids) > 0 and int(token_ids[-1]) in self.format.end_of_turn_ids
        self._state = _State.TURN_ENDED if ended else _State.IN_TURN

    def add_messages(self, messages: Sequence[Message]) -> None:
        """Append env ``messages`` (tool results, feedback; possibly none) as delta ids plus the
        generation prompt, mask 0, closing a truncated turn first. Raises
        :class:`~agentrl.tokenization.TemplateError` if the template re-renders earlier turns
        for these messages (no delta exists)."""
        if self._state is _State.GENERATE:
            raise RuntimeError("add_messages must follow a completion")
        assistant = self._assistant_message()
        delta = self.format.delta_ids(messages, self.tools)
        if self._state is _State.IN_TURN:
            self._append_template(
                SegmentKind.CLOSING, self.format.closing_ids(assistant["content"], self.tools)
            )
        self._append_template(SegmentKind.DELTA, delta)
        self._messages.append(assistant)
        self._messages.extend(dict(m) for m in messages)
        self._state = _State.GENERATE

    @property
    def trajectory(self) -> TokenTrajectory:
        """A snapshot of everything so far (copies; the builder can keep going)."""
        return TokenTrajectory(
            input_ids=list(self._ids),
            loss_mask=list(self._mask),
            logprobs=list(self._logprobs),
            versions=list(self._versions),
            prompt_length=self._prompt_length,
            segments=list(self._segments),
        )

    def _append_template(self, kind: SegmentKind, ids: list[int]) -> None:
        start = len(self._ids)
        self._ids.extend(ids)
        self._mask.extend([0] * len(ids))
        self._logprobs.extend([0.0] * len(ids))
        self._versions.extend([-1] * len(ids))
        if ids:
            self._segments.append(Segment(kind, start, len(self._ids)))

    def _assistant_message(self) -> dict[str, Any]:
        if self._turn_texts is not None:
            return {"role": "assistant", "content": "".join(self._turn_texts)}
        end = len(self._ids) - (self._state is _State.TURN_ENDED)
        return {
            "role": "assistant",
            "content": self.format.decode(self._ids[self._turn_start : end]),
        }


def _apply_policy(fmt: ChatFormat, policy: TemplatePolicy) -> None:
    from agentrl.tokenization.checker import check_template

    report = check_template(fmt)
    if report.ok:
        return
    if policy is TemplatePolicy.STRICT:
        raise TemplateNotAppendOnlyError(report)
    if fmt not in _warned:
        _warned.add(fmt)
        warnings.warn(
            "chat template is not append-only; keeping the tokens the engine saw "
            f"(policy 'keep'):\n{report.describe()}",
            TemplateWarning,
            stacklevel=3,
        )
