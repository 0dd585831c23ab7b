"""SGLang's ``sampling_params`` keys on ``/generate``: which ``agentrl serve`` honours, and which it refuses.

The key list is SGLang 0.5.23's own request contract (``sglang/api/v1/api_types.py``,
``_FIELDS_SamplingParams``, which mirrors ``sglang/srt/sampling/sampling_params.py``'s
``SamplingParams``). Three kinds of keys:

* **Unknown to SGLang**: refused as SGLang's contract gate refuses them, 400 with ``{"error":
  "unknown field `KEY`, expected one of ..."}`` (``error`` is a string there), raised as
  :class:`ContractError`.
* **Honoured**: ``temperature``, ``top_p``, ``top_k``, ``max_new_tokens``, ``stop``,
  ``stop_token_ids``, ``ignore_eos``, ``sampling_seed``, the penalties (``frequency_penalty``,
  ``presence_penalty``, ``repetition_penalty``) and ``min_new_tokens`` (SGLang's penalizers, in
  :mod:`agentrl.engine_pool.penalties`), ``no_stop_trim``, ``skip_special_tokens``,
  ``spaces_between_special_tokens`` (the last three change only the response's ``text``), ``min_p``
  (after top-k and top-p, as SGLang's sampler applies it), ``n`` = 1, and constrained decoding's
  ``json_schema``, ``regex``, ``ebnf`` and ``structural_tag`` (:mod:`agentrl.engine_pool.grammar`:
  xgrammar, as SGLang's default backend; an empty string is unset, as in SGLang).
* **Accepted by SGLang, not implemented here**: accepted when the value is SGLang's default (or
  what SGLang reads as unset: ``null``, an empty grammar string, an empty ``stop_regex``,
  ``logit_bias`` or ``custom_params``); any other value is refused with a
  :class:`ProtocolError` (400, ``{"error": {"message": ...}}``, the
  shape SGLang uses for a bad sampling value) whose message names the key. ``choice``,
  ``stop_regex``, ``logit_bias``, beams, watermarks and ``stream_interval`` are of this kind:
  agentrl's sampler does not implement them, so the sampled distribution would differ from the one
  the log-probs describe.

Values of honoured keys are checked with SGLang's own limits and messages
(``SamplingParams.verify``): ``top_k`` must be -1 or >= 1 (0 is refused, as SGLang refuses it),
``top_p`` in (0, 1], ``min_p`` in [0, 1], ``temperature`` finite and >= 0, ``max_new_tokens`` >= 0, the additive
penalties in [-2, 2], ``repetition_penalty`` in (0, 2], ``min_new_tokens`` in [0, max_new_tokens].
"""

from __future__ import annotations

import math
from typing import Any, TypeGuard

from agentrl.engine_pool.engine import CONSTRAINT_KEYS


class ProtocolError(ValueError):
    """A request or response does not have the shape this API needs; the message says what.

    Re-exported by :mod:`agentrl.engine_pool.sglang_api`, where callers import it from."""


SGLANG_SAMPLING_KEYS: tuple[str, ...] = (
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "n",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "stream_interval",
    "logit_bias",
    "sampling_seed",
    "custom_params",
    "beam_width",
    "watermark",
    "choice",
)
"""SGLang 0.5.23's ``sampling_params`` keys, in its contract's order (its error message lists them)."""

HONOURED_KEYS = frozenset(
    {
        "max_new_tokens",
        "stop",
        "stop_token_ids",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "ignore_eos",
        "sampling_seed",
        "no_stop_trim",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "min_new_tokens",
        "json_schema",
        "regex",
        "ebnf",
        "structural_tag",
    }
)

PENALTY_KEYS: tuple[str, ...] = (
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
)
"""The keys of :mod:`agentrl.engine_pool.penalties`: same names in SGLang and ``SamplingParams``."""

# what SGLang reads as "not set" for each key agentrl serve does not implement
_UNSET: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "beam_width": (None,),
    "stop_regex": (None, [], ""),
    "stream_interval": (None,),
    "logit_bias": (None, {}),
    "custom_params": (None, {}),
    "watermark": (None,),
}

_BOOL_KEYS = ("ignore_eos", "no_stop_trim", "skip_special_tokens", "spaces_between_special_tokens")


class ContractError(ProtocolError):
    """A body SGLang's contract gate refuses: answered ``{"error": "<message>"}`` (a string)."""


def check_sampling_keys(raw: dict[str, Any]) -> None:
    """Refuse ``raw`` (a ``sampling_params`` object) as SGLang would, or as unsupported here.

    Raises :class:`ContractError` for a key SGLang does not know, ``ProtocolError`` naming the key
    for a value agentrl serve cannot honour or SGLang's ``verify`` refuses.
    """
    for key in raw:
        if key not in SGLANG_SAMPLING_KEYS:
            listed = ", ".join(f"`{name}`" for name in SGLANG_SAMPLING_KEYS)
            raise ContractError(f"unknown field `{key}`, expected one of {listed}")
    if "choice" in raw:  # in SGLang's contract, but its SamplingParams has no such field
        raise ProtocolError(
            "sampling_params `choice` is not supported (SGLang 0.5.23 accepts the key at its "
            "contract gate, then fails with `Unexpected keyword argument 'choice'`)"
        )
    for key, unset in _UNSET.items():
        if key in raw and not _is_unset(raw[key], unset):
            raise ProtocolError(
                f"sampling_params `{key}` = {raw[key]!r} is not supported by agentrl serve "
                f"(it accepts only SGLang's default, {unset[-1]!r}); drop the key or send the default"
            )
    for key in _BOOL_KEYS:
        if raw.get(key) is not None and not isinstance(raw[key], bool):
            raise ProtocolError(f"sampling_params `{key}` must be a boolean, got {raw[key]!r}")
    _verify_values(raw)


def _is_unset(value: Any, unset: tuple[Any, ...]) -> bool:
    for default in unset:
        if default is None:
            if value is None:
                return True
        elif isinstance(default, (int, float)):
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value == default:
                return True
        elif type(value) is type(default) and value == default:
            return True
    return False


def _verify_values(raw: dict[str, Any]) -> None:
    """SGLang's ``SamplingParams.verify`` for the honoured keys, with its messages."""
    temperature = raw.get("temperature")
    if isinstance(temperature, (int, float)) and not (
        math.isfinite(temperature) and temperature >= 0
    ):
        raise ProtocolError(f"temperature must be a non-negative finite number, got {temperature}.")
    top_p = raw.get("top_p")
    if isinstance(top_p, (int, float)) and not 0.0 < top_p <= 1.0:
        raise ProtocolError(f"top_p must be in (0, 1], got {top_p}.")
    min_p = raw.get("min_p")
    if _is_number(min_p) and not 0.0 <= min_p <= 1.0:
        raise ProtocolError(f"min_p must be in [0, 1], got {min_p}.")
    top_k = raw.get("top_k")
    greedy = isinstance(temperature, (int, float)) and 0 <= temperature < 1e-6
    if isinstance(top_k, int) and not greedy and top_k != -1 and top_k < 1:
        raise ProtocolError(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    for key in ("frequency_penalty", "presence_penalty"):
        value = raw.get(key)
        if _is_number(value) and not -2.0 <= value <= 2.0:
            raise ProtocolError(f"{key} must be in [-2, 2], got {value}.")
    repetition = raw.get("repetition_penalty")
    if _is_number(repetition) and not 0.0 < repetition <= 2.0:
        raise ProtocolError(
            f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {repetition}."
        )
    max_new = raw.get("max_new_tokens")
    min_new = raw.get("min_new_tokens")
    if isinstance(min_new, int) and min_new < 0:
        raise ProtocolError(f"min_new_tokens must be in [0, max_new_tokens], got {min_new}.")
    if isinstance(max_new, int) and max_new < 0:
        raise ProtocolError(f"max_new_tokens must be at least 0, got {max_new}.")
    if isinstance(max_new, int) and isinstance(min_new, int) and min_new > max_new:
        raise ProtocolError(
            f"min_new_tokens must be in [0, max_new_tokens({max_new})], got {min_new}."
        )
    constraints = [raw.get(k) for k in CONSTRAINT_KEYS]
    if sum(c not in (None, "") for c in constraints) > 1:  # SGLang reads "" as unset
        raise ProtocolError("Only one of json_schema, regex, ebnf, or structural_tag can be set.")
    if max_new == 0:  # SGLang answers no tokens; agentrl's engine always generates one
        raise ProtocolError(
            "sampling_params `max_new_tokens` = 0 is not supported by agentrl serve (its engine "
            "generates at least one token)"
        )


def _is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def text_options(raw: dict[str, Any]) -> dict[str, bool]:
    """The keys that shape the response's ``text``: SGLang's defaults where not given."""
    return {
        "skip_special_tokens": raw.get("skip_special_tokens") is not False,
        "spaces_between_special_tokens": raw.get("spaces_between_special_tokens") is not False,
        "no_stop_trim": raw.get("no_stop_trim") is True,
    }


def response_text(
    tokenizer: Any,
    token_ids: list[int],
    matched: int | str | None,
    *,
    skip_special_tokens: bool = True,
    spaces_between_special_tokens: bool = True,
    no_stop_trim: bool = False,
) -> str:
    """The ``text`` SGLang's detokenizer returns for ``token_ids`` (``trim_matched_stop``).

    A stop token (``matched`` an int) is left out of the text unless ``no_stop_trim``; a stop
    string (``matched`` a str) is cut from the text (kept with ``no_stop_trim``). The ids in the
    response are never trimmed.
    """
    ids = list(token_ids)
    if isinstance(matched, int) and not no_stop_trim and ids:
        ids = ids[:-1]
    text = tokenizer.decode(
        ids,
        skip_special_tokens=skip_special_tokens,
        spaces_between_special_tokens=spaces_between_special_tokens,
    )
    if isinstance(matched, str) and (pos := text.find(matched)) != -1:
        text = text[: pos + len(matched)] if no_stop_trim else text[:pos]
    return str(text)
