"""SGLang's sampling penalties (issue 34, point 5): agentrl's logits against SGLang's own penalizers,
and the embedded engine sampling from them.

The conformance cases run SGLang 0.5.23's ``penaltylib`` and ``SamplingBatchInfo`` in the side venv
(``sglang_conformance/sglang_side.py penalties``) on the same logits and generated ids; the
penalized logits must be equal, bit for bit (both are float32 and take the same additions in the
same order). The engine test checks that LocalEngine feeds each request's own generated ids to
the penalties: its greedy tokens equal a loop of full forward passes over the penalized logits.
"""

from __future__ import annotations

import asyncio
import random

import pytest
import torch
from test_sglang_conformance import side, side_python  # noqa: F401
from transformers import DynamicCache, PreTrainedModel

from agentrl.engine_pool.engine import SamplingParams
from agentrl.engine_pool.local_engine import LocalEngine
from agentrl.engine_pool.penalties import penalized_logits

VOCAB = 64
EOS = 7


def conformance_cases() -> list[dict]:
    rng = random.Random(34)
    settings = [
        {"frequency_penalty": 0.3},
        {"frequency_penalty": -1.7},
        {"presence_penalty": 0.9},
        {"presence_penalty": -2.0},
        {"repetition_penalty": 1.3},
        {"repetition_penalty": 0.45},
        {"min_new_tokens": 6, "stop_token_ids": [5, 11]},
        {"min_new_tokens": 3},  # reached: nothing blocked
        {"frequency_penalty": 0.7, "presence_penalty": -0.4, "repetition_penalty": 1.9},
        {
            "frequency_penalty": 2.0,
            "presence_penalty": 2.0,
            "repetition_penalty": 2.0,
            "min_new_tokens": 9,
            "stop_token_ids": [0],
        },
        {},  # nothing set: the logits unchanged
    ]
    cases = []
    for sampling_params in settings:
        for generated in (0, 5, 40):  # 40 ids of a 12-token alphabet: many repeats
            logits = [rng.uniform(-6.0, 6.0) for _ in range(VOCAB)]
            logits[rng.randrange(VOCAB)] = 0.0
            cases.append(
                {
                    "logits": logits,
                    "sampling_params": {"max_new_tokens": 64, **sampling_params},
                    "output_ids": [rng.randrange(12) for _ in range(generated)],
                    "eos_token_ids": [EOS],
                }
            )
    return cases


def agentrl_logits(case: dict) -> torch.Tensor:
    raw = dict(case["sampling_params"])
    raw["stop_token_ids"] = tuple(raw.get("stop_token_ids", ()))
    sampling = SamplingParams(**raw)
    logits = torch.tensor([case["logits"]], dtype=torch.float32)
    return penalized_logits(logits, [(sampling, case["output_ids"])], {EOS})[0]


@pytest.mark.slow
async def test_the_penalized_logits_are_sglangs_bit_for_bit(side_python):  # noqa: F811
    cases = conformance_cases()
    judged = await asyncio.to_thread(
        side, side_python, "penalties", {"vocab_size": VOCAB, "cases": cases}
    )
    wrong = []
    for case, sglang in zip(cases, judged, strict=True):
        ours = agentrl_logits(case)
        theirs = torch.tensor(sglang, dtype=torch.float32)
        if not torch.equal(ours, theirs):
            worst = (ours - theirs).abs().nan_to_num(float("inf")).max()
            wrong.append(f"{case['sampling_params']} after {len(case['output_ids'])}: {worst}")
    assert not wrong, "\n".join(wrong)
    # the cases exercise what they name: blocked stop ids, and the logits changed or not
    blocked = agentrl_logits(cases[18])  # min_new_tokens 6 after 0 ids
    assert blocked[[5, 11, EOS]].isneginf().all() and blocked.isfinite().sum() == VOCAB - 3
    assert torch.equal(agentrl_logits(cases[-1]), torch.tensor(cases[-1]["logits"]))


def test_rows_without_penalties_are_left_alone_and_bad_values_refused():
    logits = torch.randn(2, VOCAB, dtype=torch.bfloat16)
    plain = [(SamplingParams(), [1, 2]), (SamplingParams(temperature=0), [3])]
    assert penalized_logits(logits, plain, {EOS}) is logits  # nothing to do: no copy
    mixed = penalized_logits(
        logits, [(SamplingParams(presence_penalty=1.0), [1, 1]), plain[1]], {EOS}
    )
    assert mixed.dtype == torch.float32 and torch.equal(mixed[1], logits[1].float())
    assert mixed[0, 1] == logits[0, 1].float() - 1.0
    for bad, match in [
        ({"frequency_penalty": 2.5}, r"frequency_penalty must be in \[-2, 2\]"),
        ({"presence_penalty": float("nan")}, r"presence_penalty must be in \[-2, 2\]"),
        ({"repetition_penalty": 0.0}, r"repetition_penalty must be in \(0, 2\]"),
        ({"min_new_tokens": 9, "max_new_tokens": 8}, r"min_new_tokens must be an int in \[0, max"),
        ({"min_new_tokens": 1.5}, "min_new_tokens must be an int"),
    ]:
        with pytest.raises(ValueError, match=match):
            SamplingParams(**bad)


def test_a_continuation_keeps_the_minimum_still_owed():
    sampling = SamplingParams(max_new_tokens=20, min_new_tokens=8, repetition_penalty=1.2)
    after_five = sampling.continuation(1, 15)  # the aborted piece generated 5 tokens
    assert after_five.min_new_tokens == 3 and after_five.repetition_penalty == 1.2
    assert after_five.continuation(2, 4).min_new_tokens == 0  # 11 more generated


def penalized_argmax_loop(
    model: PreTrainedModel, prompt: list[int], sampling: SamplingParams, eos: set[int]
) -> list[int]:
    """Greedy reference over the penalized logits: one request, Hugging Face's own KV cache
    (no batching, no prefix cache: none of the engine's machinery)."""
    ids: list[int] = []
    step, cache = torch.tensor([prompt]), DynamicCache()
    with torch.inference_mode():
        while len(ids) < sampling.max_new_tokens:
            out = model(step, cache=cache, use_cache=True)  # fills ``cache`` in place
            token = int(penalized_logits(out.logits[:, -1], [(sampling, ids)], eos)[0].argmax())
            ids.append(token)
            if token in eos or token in sampling.stop_token_ids:
                break
            step = torch.tensor([[token]])
    return ids


@pytest.mark.slow
async def test_the_engine_samples_each_request_from_its_own_penalized_logits(
    smollm2: PreTrainedModel, chat_prompt: list[int]
) -> None:
    async with LocalEngine(smollm2) as engine:
        plain = await engine.generate(chat_prompt, SamplingParams(temperature=0, max_new_tokens=12))
        stop = plain.token_ids[3]  # a stop id the plain reply would end on at its 4th token
        cases = [
            SamplingParams(temperature=0, max_new_tokens=12, repetition_penalty=1.6),
            SamplingParams(
                temperature=0, max_new_tokens=12, frequency_penalty=0.8, presence_penalty=0.5
            ),
            SamplingParams(
                temperature=0, max_new_tokens=12, min_new_tokens=8, stop_token_ids=(stop,)
            ),
        ]
        results = await asyncio.gather(*(engine.generate(chat_prompt, s) for s in cases))
        eos = set(engine.eos_token_ids)
    for sampling, result in zip(cases, results, strict=True):
        assert result.token_ids == penalized_argmax_loop(smollm2, chat_prompt, sampling, eos)
    # the stop id was blocked for 8 tokens, so the reply went another way at the 4th
    assert stop not in results[2].token_ids[:8] and len(results[2].token_ids) >= 8
