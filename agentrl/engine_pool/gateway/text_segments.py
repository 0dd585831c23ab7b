"""A session's text-completion segments: ids as the engine saw them, and the text they stand for
(the extension rule is in :mod:`agentrl.engine_pool.gateway.sessions`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.tokenization import TokenTrajectory
from agentrl.tokenization.token_trajectory import Segment, SegmentKind


@dataclass(eq=False)
class TextSegment:
    """A text-completion segment: its ids as the engine saw them, and the text they stand for."""

    text: str | None  # the prompt string plus the completions' decoded text; None: id prompts
    ids: list[int]
    mask: list[int]
    logprobs: list[float]
    versions: list[int]
    pieces: list[Segment]
    prompt_length: int
    calls: list[Any] = field(default_factory=list)  # the sessions module's CallRecords
    version: int = 0

    @classmethod
    def of_prompt(cls, text: str | None, ids: list[int]) -> TextSegment:
        n = len(ids)
        pieces = [Segment(SegmentKind.PROMPT, 0, n)]
        return cls(text, list(ids), [0] * n, [0.0] * n, [-1] * n, pieces, n)

    def extended(self, text: str | None, delta: list[int]) -> TextSegment:
        """A copy with ``delta`` (mask 0) appended, with no calls yet; ``text`` is the new
        prompt's."""
        copied = TextSegment(
            text,
            self.ids + delta,
            self.mask + [0] * len(delta),
            self.logprobs + [0.0] * len(delta),
            self.versions + [-1] * len(delta),
            list(self.pieces),
            self.prompt_length,
        )
        if delta:
            copied.pieces.append(Segment(SegmentKind.DELTA, len(self.ids), len(copied.ids)))
        return copied

    def add_completion(self, ids: list[int], logprobs: list[float], versions: list[int]) -> None:
        start = len(self.ids)
        self.ids += ids
        self.mask += [1] * len(ids)
        self.logprobs += logprobs
        self.versions += versions
        self.pieces.append(Segment(SegmentKind.COMPLETION, start, len(self.ids)))

    @property
    def trajectory(self) -> TokenTrajectory:
        return TokenTrajectory(
            list(self.ids),
            list(self.mask),
            list(self.logprobs),
            list(self.versions),
            self.prompt_length,
            list(self.pieces),
        )


@dataclass(frozen=True)
class TextStart:
    """Where a text call starts: its prompt ids; ``segment`` is the text segment it extends."""

    prompt_ids: list[int]
    delta: list[int]
    segment: TextSegment | None = None
    version: int = 0


def text_start(segments: Sequence[TextSegment], prompt: str | list[int], encode: Any) -> TextStart:
    """Where a text completion of ``prompt`` starts: the longest of ``segments`` it extends (its
    ids plus ``encode`` of the rest of the text, or the rest of the ids), else the whole prompt
    (a string encoded with ``encode``)."""
    best: TextSegment | None = None
    for segment in segments:
        if best is not None and len(segment.ids) <= len(best.ids):
            continue
        if isinstance(prompt, str):
            if segment.text is not None and prompt.startswith(segment.text):
                best = segment
        elif prompt[: len(segment.ids)] == segment.ids:
            best = segment
    if best is None:
        return TextStart(list(encode(prompt)) if isinstance(prompt, str) else list(prompt), [])
    if isinstance(prompt, str):
        assert best.text is not None
        rest = prompt[len(best.text) :]
        delta = list(encode(rest, add_special_tokens=False)) if rest else []
    else:
        delta = list(prompt[len(best.ids) :])
    return TextStart(best.ids + delta, delta, best, best.version)
