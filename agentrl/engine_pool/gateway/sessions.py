"""Sessions: an agent's calls assembled into token-exact trajectories, split where history changed.

A session is named by the caller (``/sessions/{id}/v1/...`` or the ``X-Session-Id`` header) and
made by its first call. It holds *segments*, each one :class:`~agentrl.tokenization.TrajectoryBuilder`
and the OpenAI messages its ids stand for (the last call's request plus the reply it got).

A chat call *extends* a segment when its messages start with that segment's messages (assistant
replies compared by content and tool-call names and arguments; the gateway's tool-call ids are not
the model's tokens) and everything after them is a non-assistant message (tool results, a user
turn; or nothing). Then the prompt is the segment's ids (the engine's sampled ids, never
re-encoded) plus the template's delta for the new messages, and the reply's ids are appended with
loss mask 1. Any other call (the agent dropped, edited, summarised or reordered earlier messages,
changed its tools, or branched from an earlier point) starts a new segment from a full render of
its messages, counted in ``splits``; each segment is token-exact on its own. A call with ``n > 1``
continues its segment with its first choice and starts one sibling segment per other choice (not
splits). A call that fails (engine error, refused template) changes nothing.

A text completion (``/v1/completions``) in a session is recorded the same way, by its prompt: it
*extends* a text segment when its prompt starts with that segment's text (the previous prompt
and the completion text the engine's ids decode to, special tokens included) or, for a prompt of
token ids, with that segment's ids; the prompt is then the segment's ids plus the encoded rest
(mask 0), else a new segment from the whole prompt. Chat and text segments never extend each
other. Its verdict is ``text`` (no template is involved).

Each call records the checker's verdict (:func:`~agentrl.tokenization.check_template`) for its
use of the template: ``tools``, ``plain``, or ``no_reply`` (an extension with no new message).

:meth:`SessionStore.close` hands the session out as a :class:`SessionRecord` and forgets it; a
later call with the same id starts a new session (so does a call still running when its session
was closed: close a session after its agent's last call returned). Calls of one session may run concurrently:
a call that extends a segment another call extended meanwhile becomes a new segment.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from agentrl.engine_pool.gateway.protocol import GatewayError, Message
from agentrl.engine_pool.gateway.text_segments import TextSegment, TextStart, text_start
from agentrl.tokenization import TokenTrajectory, TrajectoryBuilder


@dataclass(frozen=True)
class CallRecord:
    """One choice of one call, as its segment recorded it."""

    call: int
    """The call's number in its session (0, 1, ...)."""
    choice: int
    extended: bool
    """The prompt was the segment's ids plus a delta (False: the segment's first call)."""
    verdict: str
    """The template checker's verdict for this call's use of the template."""
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    tool_calls: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class SegmentRecord:
    """One token-exact trajectory of a session: its ids, the messages and its calls."""

    index: int
    trajectory: TokenTrajectory
    messages: list[dict[str, Any]]
    """The conversation as the template saw it (assistant turns as sampled text); empty for a
    text-completion segment."""
    calls: list[CallRecord]
    text: str | None = None
    """A text-completion segment's text (prompt and decoded completions); None otherwise."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "trajectory": self.trajectory.to_dict(),
            "messages": self.messages,
            "text": self.text,
            "calls": [call.to_dict() for call in self.calls],
        }


@dataclass(frozen=True)
class SessionRecord:
    """A closed session: its segments, and how many calls, splits and verdicts it saw."""

    session_id: str
    segments: list[SegmentRecord]
    calls: int
    splits: int
    verdicts: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "calls": self.calls,
            "splits": self.splits,
            "verdicts": dict(self.verdicts),
            "segments": [segment.to_dict() for segment in self.segments],
        }


@dataclass(eq=False)
class _Segment:
    builder: TrajectoryBuilder
    tools: str  # the tool schemas, as canonical JSON
    keys: list[str]  # message_key of each OpenAI message the ids stand for, ending with a reply
    calls: list[CallRecord] = field(default_factory=list)
    version: int = 0  # bumped by every call that extends it


@dataclass(frozen=True)
class Start:
    """Where a call starts: ``builder`` holds its prompt; ``segment`` is the one it extends."""

    builder: TrajectoryBuilder
    segment: _Segment | None = None
    version: int = 0
    use: str = "plain"


def fork(builder: TrajectoryBuilder) -> TrajectoryBuilder:
    """An independent copy of ``builder``: its lists and dicts are copied one level deep, which is
    enough because a builder only appends to them (ids, masks, frozen segments, message dicts it
    never changes in place); the chat format and tool schemas are shared. A deep copy would cost
    time linear in every id and message of the trajectory, on every call."""
    copied = copy.copy(builder)
    for name, value in vars(copied).items():
        if isinstance(value, list | dict):
            setattr(copied, name, copy.copy(value))
    return copied


def tools_key(tools: list[dict[str, Any]] | None) -> str:
    return json.dumps(tools or [], sort_keys=True)


def message_key(message: Message) -> str:
    """What must be equal for two messages to be the same turn (tool-call ids left out)."""
    if message["role"] == "assistant":
        calls = [[c["name"], c["arguments"]] for c in message.get("tool_calls", ())]
        return json.dumps(["assistant", message["content"], calls], sort_keys=True)
    return json.dumps(message, sort_keys=True)


class Session:
    """One agent's calls (see the module docstring)."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.segments: list[_Segment | TextSegment] = []
        self.calls = 0
        self.splits = 0
        self.verdicts: Counter[str] = Counter()
        self._replies: dict[str, str] = {}  # message_key of a reply -> its sampled text

    def extension(
        self, messages: list[Message], tools: list[dict[str, Any]] | None
    ) -> tuple[_Segment, list[Message]] | None:
        """The segment ``messages`` extend (the longest), and the messages after it; or None."""
        keys = [message_key(m) for m in messages]
        tools_json = tools_key(tools)
        best: _Segment | None = None
        for segment in self.segments:
            if not isinstance(segment, _Segment):
                continue
            n = len(segment.keys)
            if segment.tools != tools_json or n > len(messages):
                continue
            if best is not None and n <= len(best.keys):
                continue
            if any(m["role"] == "assistant" for m in messages[n:]):
                continue
            if keys[:n] == segment.keys:
                best = segment
        return None if best is None else (best, messages[len(best.keys) :])

    def known_reply(self, message: Message) -> str | None:
        """The sampled text of a reply this session returned that equals ``message``."""
        return self._replies.get(message_key(message))

    def commit(
        self,
        start: Start,
        messages: list[Message],
        tools: list[dict[str, Any]] | None,
        outcomes: list[tuple[Message, CallRecord, Any]],
    ) -> None:
        """Record a call that succeeded: per choice, its reply (normalised), its record and its
        :class:`~agentrl.engine_pool.GenerateResult`, appended to a fork of ``start.builder``."""
        builders = [start.builder, *(fork(start.builder) for _ in outcomes[1:])]
        self.calls += 1
        self.verdicts[outcomes[0][1].verdict] += 1  # one verdict per call, whatever its n
        request_keys = [message_key(m) for m in messages]
        for builder, (reply, record, result) in zip(builders, outcomes, strict=True):
            versions = result.token_weight_versions or result.weight_version
            builder.add_completion(result.token_ids, result.logprobs, versions)
            self._replies[message_key(reply)] = builder.messages[-1]["content"]
            keys = [*request_keys, message_key(reply)]
            segment = start.segment
            if record.choice == 0 and segment is not None and self._current(segment, start):
                segment.builder, segment.keys = builder, keys
                segment.calls.append(record)
                segment.version += 1
                continue
            if record.choice == 0 and self.segments:
                self.splits += 1
            self.segments.append(_Segment(builder, tools_key(tools), keys, [record]))

    def _current(self, segment: _Segment | TextSegment, start: Start | TextStart) -> bool:
        """Whether ``segment`` is still this session's and unchanged since ``start``."""
        return segment.version == start.version and any(s is segment for s in self.segments)

    def text_start(self, prompt: str | list[int], encode: Any) -> TextStart:
        """Where a text completion of ``prompt`` starts (:func:`text_start` over this session's
        text segments)."""
        return text_start([s for s in self.segments if isinstance(s, TextSegment)], prompt, encode)

    def commit_text(
        self,
        start: TextStart,
        prompt: str | list[int],
        outcomes: list[tuple[str, CallRecord, Any]],
    ) -> None:
        """Record a text call that succeeded: per choice, the decoded text of its ids (special
        tokens included), its record and its :class:`~agentrl.engine_pool.GenerateResult`."""
        self.calls += 1
        self.verdicts["text"] += 1
        for decoded, record, result in outcomes:
            text = prompt + decoded if isinstance(prompt, str) else None
            if start.segment is None:
                segment = TextSegment.of_prompt(text, start.prompt_ids)
            else:
                segment = start.segment.extended(text, start.delta)
            versions = result.token_weight_versions or [result.weight_version] * len(
                result.token_ids
            )
            segment.add_completion(list(result.token_ids), list(result.logprobs), list(versions))
            current = start.segment
            if record.choice == 0 and current is not None and self._current(current, start):
                # the extended copy takes the segment's place (a start holding the old one is
                # no longer current)
                segment.calls, segment.version = [*current.calls, record], current.version + 1
                self.segments[next(i for i, s in enumerate(self.segments) if s is current)] = (
                    segment
                )
                continue
            if record.choice == 0 and self.segments:
                self.splits += 1
            segment.calls.append(record)
            self.segments.append(segment)

    def record(self) -> SessionRecord:
        return SessionRecord(
            self.session_id,
            [
                SegmentRecord(i, s.builder.trajectory, s.builder.messages, list(s.calls))
                if isinstance(s, _Segment)
                else SegmentRecord(i, s.trajectory, [], list(s.calls), text=s.text)
                for i, s in enumerate(self.segments)
            ],
            self.calls,
            self.splits,
            dict(self.verdicts),
        )

    def summary(self) -> dict[str, Any]:
        """Counts only (no ids): calls, segments, splits, verdicts, tokens."""
        return {
            "session_id": self.session_id,
            "calls": self.calls,
            "segments": len(self.segments),
            "splits": self.splits,
            "verdicts": dict(self.verdicts),
            "tokens": [
                len(s.builder.prompt_ids()) if isinstance(s, _Segment) else len(s.ids)
                for s in self.segments
            ],
        }


class SessionStore:
    """The open sessions, at most ``max_sessions`` (a new one past that is refused with 429)."""

    def __init__(self, max_sessions: int = 10_000) -> None:
        self.max_sessions = max_sessions
        self._sessions: dict[str, Session] = {}
        self.closed = 0
        self.splits = 0  # over closed sessions

    def __len__(self) -> int:
        return len(self._sessions)

    def find(self, session_id: str) -> Session | None:
        """The open session ``session_id``, or None; raises 429 when it would be a new session
        and ``max_sessions`` are open."""
        session = self._sessions.get(session_id)
        if session is None and len(self._sessions) >= self.max_sessions:
            raise GatewayError(
                429,
                f"{self.max_sessions} sessions are open; close some "
                "(GET /sessions/{id}/trajectories) before starting more",
                type="rate_limit_error",
                code="too_many_sessions",
            )
        return session

    def open(self, session_id: str) -> Session:
        """The session ``session_id``, made if new (a call made it, so it is recorded)."""
        session = self.find(session_id)
        if session is None:
            session = self._sessions[session_id] = Session(session_id)
        return session

    def get(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise GatewayError(
                404,
                f"no open session {session_id!r}: it never made a call, or it was closed",
                param="session_id",
                code="session_not_found",
            )
        return session

    def close(self, session_id: str) -> SessionRecord:
        """Hand out the session's trajectories and forget it (404 for an unknown id)."""
        session = self.get(session_id)
        del self._sessions[session_id]
        self.closed += 1
        self.splits += session.splits
        return session.record()

    def summary(self) -> dict[str, Any]:
        return {
            "open": len(self._sessions),
            "closed": self.closed,
            "splits": self.splits + sum(s.splits for s in self._sessions.values()),
            "sessions": [s.summary() for s in self._sessions.values()],
        }
