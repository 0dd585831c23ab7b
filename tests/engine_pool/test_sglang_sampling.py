"""agentrl serve's SGLang sampling keys, response text and /v1/loads body, in-process (the same
keys judged by SGLang's own code: test_sglang_sampling_conformance.py; over HTTP with verl's
client: test_verl_client.py)."""

from __future__ import annotations

import pytest

from agentrl.engine_pool import SamplingParams
from agentrl.engine_pool.sglang_api import (
    ContractError,
    ProtocolError,
    generate_request,
    loads_body,
    parse_generate_request,
)
from agentrl.engine_pool.sglang_sampling import check_sampling_keys, response_text, text_options


def test_a_default_value_is_accepted_and_any_other_refused_naming_the_key():
    check_sampling_keys(
        {"repetition_penalty": 1.0, "presence_penalty": 0, "stop_regex": "", "n": 1}
    )
    check_sampling_keys({"repetition_penalty": 1.05, "min_new_tokens": 1, "min_p": 0.1})  # honoured
    check_sampling_keys({"regex": "a", "json_schema": ""})  # constrained decoding is honoured
    for key, value in [("n", 2), ("stop_regex", "a")]:
        with pytest.raises(ProtocolError, match=f"`{key}` = {value!r} is not supported"):
            check_sampling_keys({key: value})
    with pytest.raises(ContractError, match="unknown field `seed`, expected one of"):
        check_sampling_keys({"seed": 1})
    with pytest.raises(ProtocolError, match=r"min_p must be in \[0, 1\], got 1.5."):
        check_sampling_keys({"min_p": 1.5})
    with pytest.raises(ProtocolError, match="`skip_special_tokens` must be a boolean"):
        check_sampling_keys({"skip_special_tokens": "yes"})


def test_min_p_travels_both_ways_between_an_sglang_client_and_agentrl_serve():
    sent = SamplingParams(min_p=0.2, top_k=5, seed=1)
    body = generate_request([1, 2], sent, "r1")
    assert body["sampling_params"]["min_p"] == 0.2
    _, received, _, _ = parse_generate_request(body)
    assert (received.min_p, received.top_k) == (0.2, 5)
    assert "min_p" not in generate_request([1, 2], SamplingParams(), "r2")["sampling_params"]


def test_a_constraint_travels_both_ways_and_an_empty_one_is_unset_as_in_sglang():
    sent = SamplingParams(regex="(yes|no)")
    body = generate_request([1, 2], sent, "r1")
    assert body["sampling_params"]["regex"] == "(yes|no)"
    assert parse_generate_request(body)[1].constraint == ("regex", "(yes|no)")
    unset = {"input_ids": [1], "sampling_params": {"json_schema": "", "regex": None}}
    assert parse_generate_request(unset)[1].constraint is None
    two = {"input_ids": [1], "sampling_params": {"regex": "a", "ebnf": 'root ::= "a"'}}
    with pytest.raises(ProtocolError, match="Only one of json_schema, regex, ebnf, or structural_"):
        parse_generate_request(two)


def test_text_is_trimmed_at_the_stop_as_sglangs_detokenizer_does(tokenizer):
    ids = [*tokenizer.encode("Red, green and blue."), tokenizer.eos_token_id]
    plain = tokenizer.decode(ids[:-1])
    assert response_text(tokenizer, ids, tokenizer.eos_token_id) == plain
    assert response_text(tokenizer, ids, tokenizer.eos_token_id, no_stop_trim=True) == plain
    kept = response_text(
        tokenizer, ids, tokenizer.eos_token_id, no_stop_trim=True, skip_special_tokens=False
    )
    assert kept == plain + tokenizer.eos_token
    assert response_text(tokenizer, ids[:-1], " and") == "Red, green"
    assert response_text(tokenizer, ids[:-1], " and", no_stop_trim=True) == "Red, green and"
    assert text_options({}) == {
        "skip_special_tokens": True,
        "spaces_between_special_tokens": True,
        "no_stop_trim": False,
    }


def test_loads_body_has_sglangs_shape_and_checks_include():
    body = loads_body(running=3, max_running=8, cache_hit_rate=0.5)
    assert set(body) == {"timestamp", "version", "accelerator", "num_accelerators", "loads"}
    (load,) = body["loads"]
    assert load["num_running_reqs"] == 3 and load["utilization"] == 3 / 8
    assert loads_body(running=0, max_running=8, cache_hit_rate=0, dp_rank="1")["loads"] == []
    with pytest.raises(ProtocolError, match="Invalid include sections"):
        loads_body(running=0, max_running=8, cache_hit_rate=0, include="core,bogus")
