"""The trainer's token-exact record of an episode, and its builder without the template check.

:class:`TokenTrajectory` (with its :class:`Segment` runs and :class:`SeamEdit` records) is the
trainer's record of one episode. :class:`UncheckedTrajectoryBuilder` builds one turn by turn,
never re-encoding, without asking :func:`~agentrl.tokenization.check_template` about the template:
the checker simulates its sample episodes with it, and
:class:`~agentrl.tokenization.TrajectoryBuilder` (the builder rollouts use) is this builder plus
the check and its :class:`~agentrl.tokenization.TemplatePolicy`. :class:`SeamPolicy` says what a
builder does at token seams.

Builder contract:

* The initial prompt is the chat template on the reset messages (with the tool schemas) plus the
  generation prompt. :meth:`~UncheckedTrajectoryBuilder.prompt_ids` always returns every id so far;
  before a generation it is exactly what the engine must be fed.
* :meth:`~UncheckedTrajectoryBuilder.add_completion` appends the engine's ids verbatim (end-of-turn
  token included) with loss mask 1, their log-probs and the weight version. Consecutive calls
  continue one assistant turn (a partial rollout resumed after a weight update), until one ends with
  an end-of-turn id; then the next call must be :meth:`~UncheckedTrajectoryBuilder.add_messages`.
* :meth:`~UncheckedTrajectoryBuilder.add_messages` appends the environment's messages (possibly
  none) as delta ids plus the next generation prompt (see :mod:`agentrl.tokenization.chat_format`),
  mask 0. If the turn did not end with an end-of-turn id (finish reason "length" or "abort"), the
  template's closing for the turn's text (normally the end-of-turn token alone) is appended first,
  mask 0.
* Everything not produced by the engine has loss mask 0, log-prob 0.0 and version -1.
* Earlier ids are never changed (except by ``seams="reencode"``, below). For an append-only
  template, the ids at every generation point decode to the template's rendering of the
  conversation so far, and equal its encoding wherever the engine's ids are the tokenizer's own.
* Every render of one episode sees the episode's start (``now``) as the current time, so templates
  that print the date or the clock stay consistent across midnight.
* A conversation whose roles the template refuses (``raise_exception`` for alternating roles, no
  tool role...) raises :class:`~agentrl.tokenization.TemplateError` before anything is appended.

Token seams. Where a generation prompt ends in text the tokenizer would merge with the generated
text (Llama 3's ``<|end_header_id|>\\n\\n`` is one ``\\n\\n`` token at the end of a prompt and two
``\\n`` tokens once text follows), the engine's ids differ from a full re-encode although the text
is equal. ``seams="keep"`` (default) keeps what the engine saw. ``seams="reencode"`` re-encodes
the few ids around the boundary as a full render would, as a ``SEAM`` segment (mask 0), and
records each edit in :attr:`TokenTrajectory.seams`. Trade-off: the trajectory then equals a
re-render (SFT data, evaluation, prefix caches keyed on renders), but the ids before the seam are
no longer exactly what the engine was fed, and engine tokens inside a seam lose their loss (they
are counted in ``mismatch/seam_engine_tokens``).
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.tokenization.chat_format import ChatFormat, Message


class SeamPolicy(enum.StrEnum):
    """What a builder does at a token seam (see the module docstring)."""

    KEEP = "keep"  # the engine's ids, as fed and sampled
    REENCODE = "reencode"  # the ids a full render gives, recorded in TokenTrajectory.seams


class SegmentKind(enum.StrEnum):
    """Where a run of ids came from."""

    PROMPT = "prompt"  # the initial prompt, mask 0
    COMPLETION = "completion"  # engine output, mask 1
    CLOSING = "closing"  # end-of-turn added after a truncated completion, mask 0
    DELTA = "delta"  # environment messages plus the generation prompt, mask 0
    SEAM = "seam"  # ids re-encoded across a prompt/completion boundary (seams="reencode"), mask 0


@dataclass(frozen=True)
class Segment:
    """Ids ``[start, end)`` of a trajectory came from ``kind``."""

    kind: SegmentKind
    start: int
    end: int


@dataclass(frozen=True)
class SeamEdit:
    """Ids ``[start, end)`` were re-encoded at a token seam; the engine had ``replaced`` there, of
    which the last ``engine_tokens`` were sampled by it (their loss and log-probs are dropped)."""

    start: int
    end: int
    replaced: tuple[int, ...]
    engine_tokens: int


@dataclass
class TokenTrajectory:
    """The trainer's record of one episode, token-aligned: four lists of equal length.

    ``loss_mask`` is 1 exactly on engine-produced ids (the ``COMPLETION`` segments), ``logprobs``
    holds the engine's log-prob there and 0.0 elsewhere, ``versions`` the weight version there and
    -1 elsewhere. ``segments`` cover ``[0, len)`` in order. The constructor checks all of this.
    ``seams`` lists the re-encoded seams (only with ``seams="reencode"``).
    """

    input_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    versions: list[int]
    prompt_length: int
    segments: list[Segment] = field(default_factory=list)
    seams: list[SeamEdit] = field(default_factory=list)

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
        return cls([], [], [], [], 0, [], [])

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
            "seams": [
                {
                    "start": e.start,
                    "end": e.end,
                    "replaced": list(e.replaced),
                    "engine_tokens": e.engine_tokens,
                }
                for e in self.seams
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
            seams=[
                SeamEdit(
                    int(e["start"]),
                    int(e["end"]),
                    tuple(int(x) for x in e["replaced"]),
                    int(e["engine_tokens"]),
                )
                for e in data.get("seams") or ()
            ],
        )


class _State(enum.Enum):
    GENERATE = "the prompt ends with a generation prompt"
    IN_TURN = "the last completion did not end its turn"
    TURN_ENDED = "the last completion ended with an end-of-turn id"


class UncheckedTrajectoryBuilder:
    """Builds one :class:`TokenTrajectory` from the reset messages, engine outputs and env messages,
    by the contract of the module docstring, without checking whether the template is append-only.

    ``fmt`` is the template. ``tools`` are OpenAI-style schemas passed to the template on every
    render. ``now`` is the instant every render of the episode sees (default: when the builder is
    made). ``seams``: see :class:`SeamPolicy`. Rollouts use
    :class:`~agentrl.tokenization.TrajectoryBuilder`, which checks the template first.
    """

    def __init__(
        self,
        fmt: ChatFormat,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        now: datetime.datetime | None = None,
        seams: SeamPolicy | str = SeamPolicy.KEEP,
    ):
        if not messages:
            raise ValueError("a trajectory starts from at least one message")
        self.seams = SeamPolicy(seams)
        self.format = fmt
        self.now = now if now is not None else datetime.datetime.now()
        self.tools = [dict(t) for t in tools] if tools else None
        self._messages: list[dict[str, Any]] = [dict(m) for m in messages]
        self._ids = fmt.prompt_ids(self._messages, self.tools, now=self.now)
        self._mask = [0] * len(self._ids)
        self._logprobs = [0.0] * len(self._ids)
        self._versions = [-1] * len(self._ids)
        self._segments = [Segment(SegmentKind.PROMPT, 0, len(self._ids))]
        self._seams: list[SeamEdit] = []
        self._prompt_length = len(self._ids)
        self._state = _State.GENERATE
        self._turn_ids: list[int] = []  # the engine's ids of the current assistant turn
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
        first_piece = self._state is _State.GENERATE
        if first_piece:
            self._turn_ids, self._turn_texts = [], []
        start = len(self._ids)
        self._ids.extend(int(t) for t in token_ids)
        self._mask.extend([1] * len(token_ids))
        self._logprobs.extend(float(p) for p in logprobs)
        self._versions.extend(int(v) for v in versions)
        self._turn_ids.extend(int(t) for t in token_ids)
        if len(token_ids):
            self._segments.append(Segment(SegmentKind.COMPLETION, start, len(self._ids)))
            # the turn's first ids (an aborted first piece may have had none)
            if len(self._turn_ids) == len(token_ids) and self.seams is SeamPolicy.REENCODE:
                self._reencode_seam(start)
        if self._turn_texts is not None:
            self._turn_texts = None if text is None else [*self._turn_texts, text]
        ended = len(token_ids) > 0 and int(token_ids[-1]) in self.format.end_of_turn_ids
        self._state = _State.TURN_ENDED if ended else _State.IN_TURN

    def add_messages(self, messages: Sequence[Message]) -> None:
        """Append env ``messages`` (tool results, feedback; possibly none) as delta ids plus the
        generation prompt, mask 0, closing a truncated turn first. Raises
        :class:`~agentrl.tokenization.TemplateError`, appending nothing, if the template refuses
        the conversation's roles (or :meth:`_admit` refuses the messages)."""
        if self._state is _State.GENERATE:
            raise RuntimeError("add_messages must follow a completion")
        self._admit(messages)
        assistant = self._assistant_message()
        new = [dict(m) for m in messages]
        # the roles so far plus the assistant turn the generation prompt opens
        upcoming = {"role": "assistant", "content": ""}
        self.format.check_roles(
            [*self._messages, assistant, *new, upcoming], self.tools, now=self.now
        )
        delta = self.format.delta_ids(new, self.tools, now=self.now)
        if self._state is _State.IN_TURN:
            closing = self.format.closing_ids(assistant["content"], self.tools, now=self.now)
            self._append_template(SegmentKind.CLOSING, closing)
        self._append_template(SegmentKind.DELTA, delta)
        self._messages.append(assistant)
        self._messages.extend(new)
        self._state = _State.GENERATE

    def _admit(self, messages: Sequence[Message]) -> None:
        """Called by :meth:`add_messages` after its state check, before anything is rendered or
        appended; raise to refuse ``messages``. Accepts everything here."""

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
            seams=list(self._seams),
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
        ids = self._turn_ids[:-1] if self._state is _State.TURN_ENDED else self._turn_ids
        return {"role": "assistant", "content": self.format.decode(ids)}

    def _reencode_seam(self, start: int) -> None:
        """Re-encode the ids around ``start`` (the first engine id of a turn) as a full render
        would, when they differ (see the module docstring)."""
        added = self.format.added_ids
        tail = start
        while tail > 0 and self._ids[tail - 1] not in added:
            tail -= 1
        window = start
        while window < len(self._ids) and self._ids[window] not in added:
            window += 1
        edit = seam_edit(self.format, self._ids[tail:start], self._ids[start:window])
        if edit is None:
            return
        offset, old_length, new_ids = edit
        lo, hi = tail + offset, tail + offset + old_length
        engine_tokens = max(0, hi - start)
        self._seams.append(SeamEdit(lo, lo + len(new_ids), tuple(self._ids[lo:hi]), engine_tokens))
        self._ids[lo:hi] = new_ids
        self._mask[lo:hi] = [0] * len(new_ids)
        self._logprobs[lo:hi] = [0.0] * len(new_ids)
        self._versions[lo:hi] = [-1] * len(new_ids)
        shift = len(new_ids) - old_length
        segments: list[Segment] = []
        for segment in self._segments:
            if segment.end <= lo:
                segments.append(segment)
            elif segment.start >= hi:
                segments.append(Segment(segment.kind, segment.start + shift, segment.end + shift))
            else:  # cut around the seam
                if segment.start < lo:
                    segments.append(Segment(segment.kind, segment.start, lo))
                if not segments or segments[-1].kind is not SegmentKind.SEAM:
                    segments.append(Segment(SegmentKind.SEAM, lo, lo + len(new_ids)))
                if segment.end > hi:
                    segments.append(Segment(segment.kind, hi + shift, segment.end + shift))
        self._segments = [s for s in segments if s.end > s.start]
        if lo < self._prompt_length:
            self._prompt_length = lo


def seam_edit(
    fmt: ChatFormat, before: Sequence[int], engine: Sequence[int]
) -> tuple[int, int, list[int]] | None:
    """How a full render re-encodes template ids ``before`` followed by engine ids ``engine``
    (neither containing an added token): ``(offset, length, new_ids)`` replacing
    ``(before + engine)[offset : offset + length]``, or ``None`` when they already agree.

    The seam is cut at the first engine id after which the tokenizer splits the text the same
    way whatever follows, so engine ids past it are kept as sampled."""
    if not before or not engine:
        return None
    head = fmt.decode(before)
    whole = fmt.encode(head + fmt.decode(engine))
    for k in range(1, min(len(engine), 16) + 1):
        text = fmt.decode(engine[:k])
        if "\ufffd" in text and k < len(engine):
            continue
        left = fmt.encode(head + text)
        if whole[: len(left)] == left:
            break
    else:
        k, left = len(engine), whole
    old = [*before, *engine[:k]]
    if left == old:
        return None
    prefix = 0
    while prefix < min(len(old), len(left)) and old[prefix] == left[prefix]:
        prefix += 1
    suffix = 0
    limit = min(len(old), len(left)) - prefix
    while suffix < limit and old[-1 - suffix] == left[-1 - suffix]:
        suffix += 1
    return prefix, len(old) - prefix - suffix, left[prefix : len(left) - suffix]
