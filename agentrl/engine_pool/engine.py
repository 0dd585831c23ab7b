"""The generation-engine contract: sampling parameters, results, and the `Engine` protocol.

An engine turns token ids into token ids. It never re-tokenizes text, so the context it generated
from and the sequence the trainer later scores are the same ids by construction (stop strings are
found by decoding the generated ids, never by cutting them).

Contract shared by every engine (the embedded `LocalEngine`, an SGLang client, a pool of either):

* ``generate(input_ids, sampling, session_id)`` returns a :class:`GenerateResult` holding exactly
  the sampled token ids (a stop token included; for a stop string, every token up to the one that
  completed it), one log-prob per token, why generation finished, and the weight version of every
  token. Stop strings are the one place an engine reads text: it decodes what it generated to
  find them. Requests run concurrently; a request's tokens depend only
  on its own input ids, sampling parameters and seed, not on what else is being generated (up to
  floating-point rounding, which differs between batch shapes and can flip an exact near-tie).
* ``logprobs[i]`` is ``log_softmax(logits / T)[token_ids[i]]`` over the full vocabulary, where
  ``T = sampling.temperature`` (``T = 1`` when greedy, ``temperature == 0``); top-k / top-p
  truncation shapes what is sampled, not the reported log-prob. The trainer scores the same
  quantity with :func:`agentrl.training.logprobs.token_logprobs`. A request with penalties or
  ``min_new_tokens`` (:mod:`agentrl.engine_pool.penalties`) samples from, and reports, the logits
  those reshape, as SGLang does; the trainer does not, so RL rollouts leave them unset.
* ``pause()`` returns once no token is being produced; running requests hold their state until
  ``resume()``. ``update_weights(named_tensors, version)`` loads tensors by parameter name (a
  subset is allowed, so weights may arrive in buckets) and sets ``weight_version``; tokens produced
  afterwards carry the new version. Callers that send several buckets pause first, so that no
  token is sampled from half-updated weights.
* ``abort(session_id)`` ends matching requests (all of them for ``None``), queued or running: they
  return ``finish_reason="abort"`` with the tokens produced so far. A partial rollout continues by
  calling ``generate(input_ids + result.token_ids, ...)``, under whatever weights are current.
* ``end_session(session_id)`` says that a session (an episode) will make no more requests; an
  engine may drop what it kept for it (the embedded engine: its prefix-cache entry; a pool: its
  route). It changes no result, only what stays resident.
* Invalid requests raise to their caller only (``ValueError``); an engine that can no longer serve
  raises :class:`EngineError` to every pending and later request instead of hanging.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from operator import index
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    import torch

FinishReason = Literal["stop", "length", "abort"]
CONSTRAINT_KEYS = ("json_schema", "regex", "ebnf", "structural_tag")
"""SGLang's constrained-decoding sampling keys, in the order SGLang checks them."""


class EngineError(RuntimeError):
    """The engine cannot serve requests: it is closed, not started, or its loop has died."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request. Validated on construction; invalid values raise ``ValueError``."""

    temperature: float = 1.0
    """Softmax temperature, ``>= 0``; ``0`` means greedy (argmax, ties to the lowest id)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches ``top_p``."""
    top_k: int = 0
    """Keep only the ``top_k`` most likely tokens; ``0`` disables the filter."""
    min_p: float = 0.0
    """Keep only tokens at least ``min_p`` times as likely as the most likely one, in ``[0, 1]``;
    applied after top-k and top-p, as SGLang does; ``0`` disables the filter."""
    max_new_tokens: int = 256
    """Generate at most this many tokens (fewer if the model's context fills up first)."""
    stop_token_ids: tuple[int, ...] = ()
    """Extra ids that end generation; the stop token is included in the result."""
    stop: tuple[str, ...] = ()
    """Strings that end generation when the token just sampled completes one (SGLang's rule, in
    :mod:`agentrl.engine_pool.stop_strings`); the ids are kept exactly as sampled, the completing
    token included (SGLang's ``no_stop_trim``), so the text may go on past the match within that
    token. A single string is taken as a one-string tuple."""
    ignore_eos: bool = False
    """Do not stop on the tokenizer's end-of-sequence ids (``stop_token_ids`` still apply)."""
    seed: int | None = None
    """Seed of this request's own random generator: same seed and input give the same tokens."""
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per time it was generated before, in ``[-2, 2]``
    (SGLang's penalty: the prompt does not count). The penalties change the distribution sampled
    and the log-probs reported, which the trainer does not recompute: for serving (``agentrl
    serve``), not for RL rollouts."""
    presence_penalty: float = 0.0
    """Subtracted from the logit of every token generated before, in ``[-2, 2]``."""
    repetition_penalty: float = 1.0
    """Divides the positive logits (multiplies the negative ones) of every token generated before,
    in ``(0, 2]``; 1 disables it. Applied after the two additive penalties, as SGLang does."""
    min_new_tokens: int = 0
    """The stop and end-of-sequence ids cannot be sampled before this many tokens were generated
    (stop strings still end generation, as in SGLang); at most ``max_new_tokens``."""
    json_schema: str | None = None
    """Constrained decoding, SGLang's four keys (at most one per request; :mod:`.grammar`): the
    output is JSON valid under this JSON schema (given as JSON text)."""
    regex: str | None = None
    """The output matches this regular expression."""
    ebnf: str | None = None
    """The output is a sentence of this EBNF grammar (xgrammar's dialect, rule ``root`` first)."""
    structural_tag: str | None = None
    """The output follows this xgrammar structural tag (JSON text), e.g. a model's own tool-call
    format with each tool's argument schema (what the gateway sends for ``tool_choice``)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 disables it), got {self.top_k!r}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1] (0 disables it), got {self.min_p!r}")
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        stop = tuple(self.stop_token_ids)
        if not all(_is_int(t) and t >= 0 for t in stop):
            raise ValueError(f"stop_token_ids must be ints >= 0, got {self.stop_token_ids!r}")
        object.__setattr__(self, "stop_token_ids", stop)
        strings = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if not all(isinstance(s, str) and s for s in strings):
            raise ValueError(f"stop must be non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", strings)
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < 2**63):
            raise ValueError(f"seed must be None or an int in [0, 2**63), got {self.seed!r}")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not (_is_number(value) and -2.0 <= value <= 2.0):
                raise ValueError(f"{name} must be in [-2, 2], got {value!r}")
        if not (_is_number(self.repetition_penalty) and 0.0 < self.repetition_penalty <= 2.0):
            raise ValueError(
                f"repetition_penalty must be in (0, 2] (1 = no penalty), got {self.repetition_penalty!r}"
            )
        if not _is_int(self.min_new_tokens) or not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ValueError(
                f"min_new_tokens must be an int in [0, max_new_tokens ({self.max_new_tokens})], "
                f"got {self.min_new_tokens!r}"
            )
        given = {k: getattr(self, k) for k in CONSTRAINT_KEYS if getattr(self, k) is not None}
        for key, value in given.items():
            if not (isinstance(value, str) and value):
                raise ValueError(f"{key} must be a non-empty string, got {value!r}")
        if len(given) > 1:
            raise ValueError(
                f"at most one of {', '.join(CONSTRAINT_KEYS)} may be set, got {list(given)}"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether a penalty or ``min_new_tokens`` reshapes the logits (see :mod:`.penalties`)."""
        return (
            self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
            or self.repetition_penalty != 1.0
            or self.min_new_tokens > 0
        )

    @property
    def constraint(self) -> tuple[str, str] | None:
        """The constrained-decoding key that is set and its value, or None."""
        for key in CONSTRAINT_KEYS:
            value = getattr(self, key)
            if value is not None:
                return key, value
        return None

    def continuation(self, piece: int, max_new_tokens: int) -> SamplingParams:
        """The sampling of the ``piece``-th continuation (1, 2, ...) of a generation the engine
        aborted: at most ``max_new_tokens`` more, and a seed of its own derived from ``seed`` (so
        a continuation neither repeats the first piece's draws nor another request's).
        ``min_new_tokens`` shrinks by the tokens the aborted piece generated
        (``self.max_new_tokens - max_new_tokens``)."""
        seed = None
        if self.seed is not None:
            seed = int(np.random.SeedSequence([self.seed, piece]).generate_state(1)[0])
        generated = self.max_new_tokens - max_new_tokens
        return dataclasses.replace(
            self,
            max_new_tokens=max_new_tokens,
            seed=seed,
            min_new_tokens=min(max(0, self.min_new_tokens - generated), max_new_tokens),
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class GenerateResult:
    """What one ``generate`` call produced. All per-token lists have the same length."""

    token_ids: list[int]
    """Exactly the sampled ids, including the stop token when ``finish_reason == "stop"``."""
    logprobs: list[float]
    """``log_softmax(logits / T)`` of each sampled token over the full vocabulary (T=1 if greedy)."""
    finish_reason: FinishReason
    """``"stop"`` (a stop or eos token, or a stop string), ``"length"`` (token or context limit)
    or ``"abort"``."""
    weight_version: int
    """Version of the weights that produced the last token (the current version if none)."""
    token_weight_versions: list[int] = field(default_factory=list)
    """Version of the weights that produced each token; differs only across a weight update."""
    prompt_tokens: int = 0
    """Length of the ``input_ids`` this request was given."""
    request_id: str = ""
    """Engine-assigned id, unique within the engine."""
    matched_stop: str | None = None
    """The stop string that ended generation (``finish_reason == "stop"``), else None."""


def check_input_ids(
    input_ids: Sequence[int], vocab_size: int, max_context: int | None = None
) -> list[int]:
    """Return ``input_ids`` as a list of ints, or raise a ``ValueError`` that says what is wrong.

    Rejected: an empty sequence, ids outside ``[0, vocab_size)``, and sequences that leave no room
    to generate within ``max_context`` tokens. Non-integers raise ``TypeError``.
    """
    try:
        ids = [index(token) for token in input_ids]
    except TypeError:
        raise TypeError("input_ids must be a sequence of ints") from None
    if not ids:
        raise ValueError("input_ids is empty; the engine needs at least one token")
    outside = sorted({t for t in ids if not 0 <= t < vocab_size})
    if outside:
        raise ValueError(
            f"input_ids has ids outside the vocabulary [0, {vocab_size}): {outside[:5]}"
        )
    if max_context is not None and len(ids) >= max_context:
        raise ValueError(
            f"input_ids has {len(ids)} tokens; the model's context holds {max_context}, "
            "leaving no room to generate"
        )
    return ids


@runtime_checkable
class Engine(Protocol):
    """A token-in/token-out generation engine; see the module docstring for the full contract."""

    @property
    def weight_version(self) -> int:
        """Version of the weights currently loaded (the next token is produced by them)."""
        ...

    async def generate(
        self, input_ids: Sequence[int], sampling: SamplingParams, session_id: str | None = None
    ) -> GenerateResult:
        """Generate from ``input_ids``; ``session_id`` groups requests for ``abort`` and routing."""
        ...

    async def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int
    ) -> None:
        """Load tensors by parameter name (unknown names or shapes raise) and set the version."""
        ...

    async def pause(self) -> None:
        """Stop producing tokens; returns once the step in progress (if any) has finished."""
        ...

    async def resume(self) -> None:
        """Continue the requests held by ``pause``."""
        ...

    async def abort(self, session_id: str | None = None) -> None:
        """End matching requests (all if ``None``); they return ``"abort"`` and partial tokens."""
        ...

    async def end_session(self, session_id: str) -> None:
        """``session_id`` will make no more requests: the engine may drop what it kept for it."""
        ...

    async def aclose(self) -> None:
        """Abort everything in flight and release the engine's resources."""
        ...
