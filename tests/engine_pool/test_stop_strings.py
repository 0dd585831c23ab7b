"""Stop strings end to end: SGLang's own scheduler code as the judge of where a request ends, the
embedded engine, greedy and sampled (`agentrl serve` with the SGLang client: test_sglang_http.py;
the runner: tests/rollout/test_runner_stop.py).

The judge: the harness's ``stop-strings`` command (``sglang_conformance/sglang_side.py``) feeds
the same output ids, one at a time, to SGLang 0.5.23's ``Req.update_finish_state`` with the same
tokenizer; the embedded engine's :class:`RequestState` must end each case on the same token, for
the same reason.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_sglang_conformance import HARNESS, SIDE_PYTHON, side_python  # noqa: F401 (fixture)

from agentrl.engine_pool.engine import GenerateResult, SamplingParams
from agentrl.engine_pool.local_engine import LocalEngine
from agentrl.engine_pool.request_state import RequestState
from agentrl.engine_pool.sglang_api import generate_response, parse_generate_response
from agentrl.engine_pool.stop_strings import completed_stop, stop_tail_tokens
from agentrl.models import SMOLLM2, resolve_model


def test_stop_is_a_tuple_of_non_empty_strings():
    assert SamplingParams(stop="</search>").stop == ("</search>",)
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")  # type: ignore[arg-type]
    for bad in ("", ("ok", ""), (3,)):
        with pytest.raises(ValueError, match="stop must be non-empty strings"):
            SamplingParams(stop=bad)  # type: ignore[arg-type]


def test_the_sglang_body_carries_the_string_and_its_match_comes_back():
    from agentrl.engine_pool.sglang_api import generate_request, parse_generate_request

    body = generate_request([1, 2], SamplingParams(stop=("</search>", "</answer>")), "r")
    assert body["sampling_params"]["stop"] == ["</search>", "</answer>"]
    assert body["sampling_params"]["no_stop_trim"] is True
    _, sampling, _, _ = parse_generate_request(json.loads(json.dumps(body)))
    assert sampling.stop == ("</search>", "</answer>")
    result = GenerateResult([5, 6], [-0.1, -0.2], "stop", 0, [0, 0], 2, "r", "</search>")
    response = generate_response(result, "r")
    assert response["meta_info"]["finish_reason"] == {"type": "stop", "matched": "</search>"}
    assert parse_generate_response(response, 2).matched_stop == "</search>"
    by_token = generate_response(GenerateResult([5, 6], [-0.1, -0.2], "stop", 0, [0, 0]), "r")
    assert by_token["meta_info"]["finish_reason"]["matched"] == 6
    assert parse_generate_response(by_token, 2).matched_stop is None


# -- where a request ends: ours against SGLang's scheduler -------------------------------------


def our_verdict(
    tokenizer, output_ids: list[int], stop: list[str], max_new_tokens: int, ignore_eos: bool = False
) -> dict:
    """Where the embedded engine's request state ends ``output_ids``, in the harness's terms."""
    sampling = SamplingParams(
        max_new_tokens=max_new_tokens, stop=tuple(stop), ignore_eos=ignore_eos
    )
    loop = asyncio.new_event_loop()
    try:
        state = RequestState(
            "case",
            None,
            [0],
            sampling,
            None,
            loop.create_future(),
            stop_tail_tokens=stop_tail_tokens(
                sampling.stop, lambda s: tokenizer.encode(s, add_special_tokens=False)
            ),
        )
        for token in output_ids:
            eos = frozenset([tokenizer.eos_token_id])
            if state.append(token, 0.0, 0, eos, None, tokenizer.decode):
                result = state.future.result()
                if result.finish_reason == "length":
                    reason: dict = {"type": "length", "length": max_new_tokens}
                else:
                    matched = result.matched_stop
                    reason = {
                        "type": "stop",
                        "matched": result.token_ids[-1] if matched is None else matched,
                    }
                return {"finished_len": len(result.token_ids), "finish_reason": reason}
        return {"finished_len": None, "finish_reason": None}
    finally:
        loop.close()


def sglang_verdicts(cases: list[dict]) -> list[dict]:
    tokenizer_dir = str(resolve_model(SMOLLM2).directory)
    done = subprocess.run(
        [str(SIDE_PYTHON), str(HARNESS), "stop-strings"],
        input=json.dumps({"tokenizer": tokenizer_dir, "cases": cases}),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def spelled(tokenizer, text: str) -> list[int]:
    """``text`` as one token per character (each character encoded on its own)."""
    return [t for ch in text for t in tokenizer.encode(ch, add_special_tokens=False)]


@pytest.mark.slow
@pytest.mark.usefixtures("side_python")
async def test_requests_end_where_sglangs_scheduler_ends_them(engine, tokenizer):
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    cases = []
    # What the model writes: greedy and sampled answers, stopped on words taken from them.
    for seed, question in enumerate(["Name three colours.", "What is 12 * 7? Think step by step."]):
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, return_dict=False
        )
        for temperature in (0.0, 1.0):
            sampling = SamplingParams(
                temperature=temperature, max_new_tokens=48, seed=seed, ignore_eos=True
            )
            ids = (await engine.generate(prompt, sampling)).token_ids
            words = tokenizer.decode(ids).split()
            picks = [words[len(words) // 2], words[-1][-3:], "no such text here"]
            for ignore_eos in (True, False):  # an eos the model wrote ends it first, or not
                case = {"output_ids": ids, "max_new_tokens": 48, "ignore_eos": ignore_eos}
                cases += [{**case, "stop": [pick]} for pick in picks]
                cases.append({**case, "stop": picks[::-1]})
    # Search-R1's tags, written plainly, after multi-byte text, and one character at a time
    # (longer than the string's own tokenization + 1: neither engine sees it).
    for text in [
        "I should look it up. <search> capital of Peru </search> more",
        "Réponse: 東京 🚀<answer> Lima </answer>",
        "<search>x</search>",
    ]:
        for stop in (["</search>"], ["</answer>", "</search>"], ["🚀"], ["東"]):
            cases.append({"output_ids": encode(text), "stop": stop, "max_new_tokens": 64})
    cases.append(
        {
            "output_ids": spelled(tokenizer, "go </search> on"),
            "stop": ["</search>"],
            "max_new_tokens": 64,
        }
    )
    # The token budget runs out on the very token that completes the match: the match wins.
    ids = encode("a b </search> c")
    end = next(i for i in range(1, len(ids) + 1) if "</search>" in tokenizer.decode(ids[:i]))
    cases.append({"output_ids": ids, "stop": ["</search>"], "max_new_tokens": end})
    cases.append({"output_ids": ids, "stop": ["</search>"], "max_new_tokens": end - 1})

    theirs = sglang_verdicts(cases)
    ours = [our_verdict(tokenizer, **case) for case in cases]
    assert ours == theirs
    stopped = [v for v in theirs if v["finish_reason"] and "matched" in v["finish_reason"]]
    assert len(stopped) >= len(cases) // 2  # the cases do exercise matches
    assert theirs[-2]["finish_reason"] == {"type": "stop", "matched": "</search>"}
    assert theirs[-1]["finish_reason"]["type"] == "length"
    assert theirs[-3] == {"finished_len": None, "finish_reason": None}  # spelled out: unseen


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    pieces=st.lists(
        st.sampled_from(["</search>", "<answer>", " the", "é", "東京", "🚀", "\n", "x", "</"]),
        max_size=12,
    ),
    stop=st.lists(st.sampled_from(["</search>", "東", "🚀", "the", "</"]), min_size=1, max_size=3),
)
def test_the_first_token_whose_text_completes_a_stop_string_ends_the_request(
    tokenizer, pieces, stop
):
    """On text the tokenizer itself produced, the request ends at the first token after which the
    decoded output contains a stop string, on the first such string in the order given."""
    ids = tokenizer.encode("".join(pieces), add_special_tokens=False)
    tail = stop_tail_tokens(stop, lambda s: tokenizer.encode(s, add_special_tokens=False))
    ours = next(
        (
            (i, m)
            for i in range(1, len(ids) + 1)
            if (m := completed_stop(ids[:i], stop, tail, tokenizer.decode)) is not None
        ),
        None,
    )
    whole = next(
        ((i, s) for i in range(1, len(ids) + 1) for s in stop if s in tokenizer.decode(ids[:i])),
        None,
    )
    assert ours == whole


# -- the engines ------------------------------------------------------------------------------


@pytest.mark.slow
async def test_the_embedded_engine_stops_on_the_completing_token_and_keeps_every_id(
    smollm2, tokenizer, chat_prompt
):
    async with LocalEngine(smollm2, tokenizer=tokenizer, prefix_cache_tokens=0) as engine:
        for sampling in (
            SamplingParams(temperature=0.0, max_new_tokens=40, ignore_eos=True),
            SamplingParams(temperature=1.0, max_new_tokens=40, seed=3, ignore_eos=True),
        ):
            free = await engine.generate(chat_prompt, sampling)
            text = tokenizer.decode(free.token_ids)
            word = text.split()[len(text.split()) // 2]
            stopped = await engine.generate(
                chat_prompt, dataclasses.replace(sampling, stop=(word,))
            )
            n = len(stopped.token_ids)
            assert stopped.finish_reason == "stop" and stopped.matched_stop == word
            assert stopped.token_ids == free.token_ids[:n]  # exactly what was sampled
            assert word in tokenizer.decode(stopped.token_ids)
            assert word not in tokenizer.decode(stopped.token_ids[:-1])
            assert len(stopped.logprobs) == n == len(stopped.token_weight_versions)
            never = await engine.generate(chat_prompt, dataclasses.replace(sampling, stop=("§§§",)))
            assert never.token_ids == free.token_ids and never.finish_reason == "length"
            assert never.matched_stop is None


async def test_an_engine_without_a_tokenizer_refuses_stop_strings(make_tiny_llama):
    async with LocalEngine(make_tiny_llama(), eos_token_ids=[0]) as engine:
        with pytest.raises(ValueError, match="stop strings need the engine's tokenizer"):
            await engine.generate([1, 2, 3], SamplingParams(stop=("x",), max_new_tokens=4))
        result = await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=2))
        assert len(result.token_ids) == 2  # the engine still serves
