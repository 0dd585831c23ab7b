"""Every SGLang ``sampling_params`` key, judged by SGLang 0.5.23's own code and by ``agentrl serve``.

Each ``/generate`` body below goes through SGLang's real HTTP app and tokenizer manager in the side
venv (``sglang_conformance/sglang_side.py check-requests``: the contract gate,
``SamplingParams(...)``, ``.normalize``, ``.verify``) and through
:func:`agentrl.engine_pool.sglang_api.parse_generate_request` (what ``agentrl serve``'s
``/generate`` runs first). The rule (docs/sglang_http_api.md, "agentrl serve as an SGLang server"):

* SGLang refuses -> agentrl refuses, with SGLang's error shape (a string ``error`` for a key SGLang
  does not know, ``{"message"}`` otherwise) and, for the keys agentrl honours, SGLang's message;
* SGLang accepts -> agentrl accepts, unless the key is one agentrl does not implement and the
  value is not SGLang's default: then agentrl refuses with a message naming the key.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_sglang_conformance import harness_server_options, side, side_python  # noqa: F401

from agentrl.engine_pool.sglang_api import ContractError, ProtocolError, parse_generate_request
from agentrl.engine_pool.sglang_sampling import HONOURED_KEYS, SGLANG_SAMPLING_KEYS

pytestmark = pytest.mark.slow

PROMPT = [1, 17, 42]

DEFAULTS: list[dict[str, Any]] = [
    {"min_p": 0.0},
    {"frequency_penalty": 0.0},
    {"presence_penalty": 0},
    {"repetition_penalty": 1.0},  # what verl's agent loop sends
    {"min_new_tokens": 0},
    {"n": 1},
    {"json_schema": None},
    {"regex": ""},
    {"ebnf": None},
    {"structural_tag": None},
    {"stop_regex": []},
    {"stream_interval": None},
    {"logit_bias": {}},
    {"custom_params": None},
    {"beam_width": None},
    {"watermark": None},
]
HONOURED: list[dict[str, Any]] = [
    {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "max_new_tokens": 4},
    {"temperature": 1.0, "top_p": 1.0, "top_k": -1},  # verl's rollout defaults
    {"temperature": 0, "top_k": 0},  # greedy: SGLang replaces top_k by 1 before verify
    {"stop": "</s>"},
    {"stop": ["</s>", "\n\n"], "no_stop_trim": True},
    {"stop_token_ids": [2, 3]},
    {"ignore_eos": True},
    {"sampling_seed": 3},
    {"skip_special_tokens": False, "spaces_between_special_tokens": False},
    {"repetition_penalty": 1.1},
    {"frequency_penalty": 0.5},
    {"presence_penalty": -0.5},
    {"min_new_tokens": 2},
    {"min_p": 0.1},
    {"min_p": 1, "top_k": 5, "top_p": 0.9},
    {
        "frequency_penalty": -2,
        "presence_penalty": 2.0,
        "repetition_penalty": 2,
        "min_new_tokens": 4,
    },
    {"json_schema": '{"type": "object"}'},
    {"regex": "a+"},
    {"ebnf": 'root ::= "a"'},
    {
        "structural_tag": '{"type": "structural_tag", "format": {"type": "const_string", "value": "a"}}'
    },
]
UNSUPPORTED: list[dict[str, Any]] = [
    {"n": 2},
    {"stop_regex": "a+b"},
    {"logit_bias": {"5": 1.5}},
    {"custom_params": {"x": 1}},
    {"stream_interval": 2},
    {"max_new_tokens": 0},  # honoured key, but agentrl's engine always generates a token
]
REFUSED: list[dict[str, Any]] = [
    {"seed": 1},  # SGLang's name is sampling_seed
    {"best_of": 2},
    {"max_tokens": 5},  # an OpenAI key, not SGLang's
    {"top_p": 2},
    {"top_p": 0},
    {"temperature": -1},
    {"top_k": 0},
    {"max_new_tokens": -1},
    {"repetition_penalty": 3.0},
    {"repetition_penalty": 0},
    {"frequency_penalty": 5},
    {"presence_penalty": -2.5},
    {"min_new_tokens": 5},  # more than max_new_tokens (4)
    {"min_new_tokens": -1},
    {"min_p": 1.5},
    {"min_p": -0.1},
    {"regex": "a+", "ebnf": 'root ::= "a"'},  # at most one constraint
]


def agentrl_verdict(params: dict[str, Any]) -> tuple[str, str]:
    """``("accepted" | "contract" | "refused", message)`` from agentrl serve's request parser."""
    try:
        parse_generate_request({"input_ids": PROMPT, "sampling_params": params})
    except ContractError as exc:
        return "contract", str(exc)
    except ProtocolError as exc:
        return "refused", str(exc)
    return "accepted", ""


def same_message(judged: str, ours: str) -> bool:
    """The harness cuts long messages to ``<head>... (N chars)``."""
    head, cut, rest = judged.partition("... (")
    if not cut:
        return judged == ours
    return ours.startswith(head) and rest == f"{len(ours)} chars)"


async def test_every_sampling_key_is_honoured_or_refused_as_sglang_does(side_python):  # noqa: F811
    cases = DEFAULTS + HONOURED + UNSUPPORTED + REFUSED
    # the cases name every key SGLang has but `choice`, which SGLang's own code fails on (500)
    assert {key for case in cases for key in case} >= set(SGLANG_SAMPLING_KEYS) - {"choice"}
    requests = [
        {
            "route": "/generate",
            "method": "POST",
            "body": {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4, **case}},
        }
        for case in cases
    ]
    verdicts = await asyncio.to_thread(
        side, side_python, "check-requests", {"requests": requests, **harness_server_options()}
    )
    wrong = []
    for case, verdict in zip(cases, verdicts, strict=True):
        ours, message = agentrl_verdict({"max_new_tokens": 4, **case})
        sglang_error = verdict.get("response", {}).get("error") if not verdict["accepted"] else None
        keys = set(case)
        if verdict["accepted"]:
            honoured = keys <= HONOURED_KEYS and case not in UNSUPPORTED
            expected = "accepted" if case in DEFAULTS or honoured else "refused"
        else:
            expected = "contract" if isinstance(sglang_error, str) else "refused"
        if ours != expected:
            wrong.append(f"{case}: SGLang {verdict.get('status')} {sglang_error!r}, agentrl {ours}")
        elif (
            ours == "refused" and verdict["accepted"] and not any(f"`{k}`" in message for k in keys)
        ):
            wrong.append(f"{case}: the refusal does not name the key: {message}")
        elif ours == "refused" and not verdict["accepted"] and keys <= HONOURED_KEYS:
            if message not in str(sglang_error):
                wrong.append(f"{case}: SGLang says {sglang_error!r}, agentrl says {message!r}")
        elif ours == "contract" and not same_message(str(sglang_error), message):
            wrong.append(f"{case}: SGLang says {sglang_error!r}, agentrl says {message!r}")
    assert not wrong, "\n".join(wrong)
    assert [case for case, v in zip(cases, verdicts, strict=True) if not v["accepted"]] == REFUSED
