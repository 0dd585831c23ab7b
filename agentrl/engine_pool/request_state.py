"""What `LocalEngine`'s scheduler tracks: each request's state, and the engine's counters.

A `RequestState` lives from ``generate`` until its future resolves. Its future is the single
source of truth for "done": the request finished (``"stop"`` / ``"length"``), was aborted, failed,
or its caller cancelled ``generate``. Everything seen by the model for the request is
``context = input_ids + token_ids``; a row in the decode batch holds the KV of a prefix of it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import torch

from agentrl.engine_pool.engine import FinishReason, GenerateResult, SamplingParams
from agentrl.engine_pool.stop_strings import Decode, completed_stop


@dataclass
class EngineStats:
    """Counters the scheduler keeps; they only grow."""

    steps: int = 0
    """Scheduler iterations that produced tokens."""
    prefills: int = 0
    """Prefill forward passes (admitting requests, or rebuilding the cache after new weights)."""
    max_rows: int = 0
    """Most requests that received a token in a single iteration."""
    tokens_generated: int = 0
    """Tokens handed to requests (tokens of requests aborted mid-step are not counted)."""
    requests_finished: int = 0
    """Requests that ended on a stop token or a limit (aborted or failed ones are not counted)."""
    prefill_tokens: int = 0
    """Tokens whose KV a prefill computed (padding not counted)."""
    prefix_hit_tokens: int = 0
    """Tokens whose KV a prefill took from the prefix cache instead of computing it."""

    @property
    def prefix_hit_rate(self) -> float:
        """Share of the tokens prefilled so far whose KV came from the prefix cache (0 if none)."""
        total = self.prefix_hit_tokens + self.prefill_tokens
        return self.prefix_hit_tokens / total if total else 0.0


@dataclass(eq=False)
class RequestState:
    """One request: its inputs, the tokens produced so far, and the future its caller awaits."""

    request_id: str
    session_id: str | None
    input_ids: list[int]
    sampling: SamplingParams
    generator: torch.Generator | None
    future: asyncio.Future[GenerateResult]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    stop_tail_tokens: int = 0
    """Generated tokens decoded to look for the stop strings (:mod:`.stop_strings`)."""
    matched_stop: str | None = None
    grammar: Any = None
    """The request's ``xgrammar.GrammarMatcher`` when its sampling is constrained (:mod:`.grammar`)."""

    @property
    def done(self) -> bool:
        return self.future.done()  # finished, aborted, failed, or the caller cancelled

    @property
    def context(self) -> list[int]:
        """Input ids followed by the tokens produced so far."""
        return self.input_ids + self.token_ids

    def append(
        self,
        token: int,
        logprob: float,
        version: int,
        eos_token_ids: frozenset[int],
        max_context: int | None,
        decode: Decode | None = None,
    ) -> bool:
        """Record one sampled token; finish the request if it completes a stop string, is a stop
        token, or reaches a limit (checked in that order, as SGLang does). ``decode`` turns ids
        into text; it is needed when the request has stop strings.

        Returns whether the request finished. Must not be called once the request is done.
        """
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        self.versions.append(version)
        sampling = self.sampling
        if sampling.stop:
            if decode is None:
                raise ValueError("stop strings need a decode function (the engine's tokenizer)")
            self.matched_stop = completed_stop(
                self.token_ids, sampling.stop, self.stop_tail_tokens, decode
            )
        stop_token = token in sampling.stop_token_ids or (
            not sampling.ignore_eos and token in eos_token_ids
        )
        if self.matched_stop is not None or stop_token:
            self.finish("stop", version)
        elif len(self.token_ids) >= sampling.max_new_tokens or (
            max_context is not None and len(self.input_ids) + len(self.token_ids) >= max_context
        ):
            self.finish("length", version)
        return self.done

    def finish(self, reason: FinishReason, current_version: int) -> None:
        """Resolve the future with the tokens so far (no-op once done)."""
        if self.done:
            return
        result = GenerateResult(
            token_ids=list(self.token_ids),
            logprobs=list(self.logprobs),
            finish_reason=reason,
            weight_version=self.versions[-1] if self.versions else current_version,
            token_weight_versions=list(self.versions),
            prompt_tokens=len(self.input_ids),
            request_id=self.request_id,
            matched_stop=self.matched_stop if reason == "stop" else None,
        )
        self.future.set_result(result)

    def fail(self, error: BaseException) -> None:
        """Resolve the future with ``error`` (no-op once done)."""
        if not self.done:
            self.future.set_exception(error)
