"""LocalEngine on the real SmolLM2-135M-Instruct (one shared load; short generations)."""

from __future__ import annotations

import asyncio

import pytest
import torch
from engine_helpers import ZEROED, argmax_loop, wait_until
from float_tolerance import tolerance
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from agentrl.engine_pool.engine import Engine, EngineError, SamplingParams
from agentrl.engine_pool.local_engine import LocalEngine

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True)


async def test_engine_satisfies_the_protocol(engine: LocalEngine) -> None:
    assert isinstance(engine, Engine)
    assert engine.weight_version == 0
    assert engine.eos_token_ids == frozenset({2})


async def test_greedy_matches_a_full_forward_argmax_loop_even_when_batched(
    engine: LocalEngine, smollm2: PreTrainedModel, chat_prompt: list[int]
) -> None:
    other = SamplingParams(temperature=1.0, max_new_tokens=5, seed=1)
    greedy, *_ = await asyncio.gather(
        engine.generate(chat_prompt, GREEDY),
        engine.generate(chat_prompt[:9], other),
        engine.generate([*chat_prompt, 30, 40, 50], other),
    )
    assert engine.stats.max_rows == 3
    assert greedy.token_ids == argmax_loop(smollm2, chat_prompt, 8)
    assert greedy.finish_reason == "length"
    assert len(greedy.logprobs) == 8 and all(lp <= 0 for lp in greedy.logprobs)
    assert greedy.token_weight_versions == [0] * 8 and greedy.prompt_tokens == len(chat_prompt)


async def test_same_seed_gives_same_tokens_alone_and_in_a_mixed_batch(
    engine: LocalEngine, chat_prompt: list[int], smollm2_rounding: tuple[float, float, float]
) -> None:
    sampling = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, max_new_tokens=10, seed=7)
    alone = await engine.generate(chat_prompt, sampling)
    mixed = [
        engine.generate(
            chat_prompt[:12], SamplingParams(temperature=1.2, max_new_tokens=4, seed=1)
        ),
        engine.generate(chat_prompt, sampling),
        engine.generate([*chat_prompt, 11, 12], GREEDY),
        engine.generate(chat_prompt, SamplingParams(top_k=5, max_new_tokens=12, seed=8)),
    ]
    batched = (await asyncio.gather(*mixed))[1]
    assert batched.token_ids == alone.token_ids
    # two float32 evaluations of the same log-probs, in batches of other shapes: rounding apart
    error, _, magnitude = smollm2_rounding  # at T = 1; T = 0.9 divides the logits' rounding by 0.9
    atol = tolerance(error / 0.9, magnitude / 0.9)
    assert batched.logprobs == pytest.approx(alone.logprobs, abs=atol)


async def test_stops_on_eos_and_on_stop_ids_and_respects_max_new_tokens(
    engine: LocalEngine, tokenizer: PreTrainedTokenizerBase
) -> None:
    messages = [{"role": "user", "content": "What is 2+2?"}]
    prompt = list(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    )
    eos = await engine.generate(prompt, SamplingParams(temperature=0, max_new_tokens=40))
    assert eos.finish_reason == "stop" and eos.token_ids[-1] == 2 and 2 not in eos.token_ids[:-1]
    past = await engine.generate(
        prompt,
        SamplingParams(temperature=0, max_new_tokens=len(eos.token_ids) + 2, ignore_eos=True),
    )
    assert past.finish_reason == "length" and past.token_ids[: len(eos.token_ids)] == eos.token_ids
    assert len(past.token_ids) == len(eos.token_ids) + 2
    third = eos.token_ids[2]
    stopped = await engine.generate(
        prompt, SamplingParams(temperature=0, max_new_tokens=40, stop_token_ids=(third,))
    )
    first_hit = eos.token_ids.index(third)
    assert stopped.finish_reason == "stop" and stopped.token_ids == eos.token_ids[: first_hit + 1]


async def test_sixteen_concurrent_requests_share_one_batch(
    engine: LocalEngine, chat_prompt: list[int]
) -> None:
    sampling = [SamplingParams(max_new_tokens=4, ignore_eos=True, seed=i) for i in range(16)]
    results = await asyncio.gather(*(engine.generate(chat_prompt, s) for s in sampling))
    assert [len(r.token_ids) for r in results] == [4] * 16
    # all 16 were queued before the scheduler ran: one prefill, then every step carries all rows
    assert (engine.stats.prefills, engine.stats.steps, engine.stats.max_rows) == (1, 4, 16)
    assert engine.stats.tokens_generated == 64


async def test_a_late_request_joins_the_running_batch_at_the_next_step(
    engine: LocalEngine, chat_prompt: list[int]
) -> None:
    long = asyncio.create_task(
        engine.generate(
            chat_prompt, SamplingParams(temperature=0, max_new_tokens=24, ignore_eos=True)
        )
    )
    await wait_until(lambda: engine.stats.tokens_generated >= 2)
    short = await engine.generate(chat_prompt[:10], SamplingParams(temperature=0, max_new_tokens=3))
    assert not long.done(), "the short request had to wait for the long one to finish"
    assert len(short.token_ids) == 3 and engine.stats.max_rows == 2
    assert len((await long).token_ids) == 24


async def test_pause_holds_running_requests_until_resume(
    engine: LocalEngine, chat_prompt: list[int]
) -> None:
    task = asyncio.create_task(
        engine.generate(
            chat_prompt, SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True)
        )
    )
    await wait_until(lambda: engine.stats.tokens_generated >= 1)
    await engine.pause()
    held = engine.stats.tokens_generated
    queued = asyncio.create_task(engine.generate(chat_prompt, GREEDY))
    await asyncio.sleep(0.3)
    assert engine.stats.tokens_generated == held and not task.done() and not queued.done()
    await engine.resume()
    running, waiting = await asyncio.gather(task, queued)
    assert len(running.token_ids) == 12 and len(waiting.token_ids) == 8


async def test_abort_returns_the_partial_tokens_of_that_session_only(
    engine: LocalEngine, chat_prompt: list[int]
) -> None:
    long = SamplingParams(temperature=0.8, max_new_tokens=200, ignore_eos=True, seed=3)
    victim = asyncio.create_task(engine.generate(chat_prompt, long, session_id="a"))
    bystander = asyncio.create_task(engine.generate(chat_prompt, GREEDY, session_id="b"))
    await wait_until(lambda: engine.stats.tokens_generated >= 6)
    await engine.abort("a")
    aborted = await victim
    assert aborted.finish_reason == "abort"
    assert 3 <= len(aborted.token_ids) < 200
    assert len(aborted.logprobs) == len(aborted.token_weight_versions) == len(aborted.token_ids)
    assert (await bystander).finish_reason == "length"

    await engine.pause()  # a queued request aborts with no tokens
    queued = asyncio.create_task(engine.generate(chat_prompt, GREEDY, session_id="c"))
    await asyncio.sleep(0)
    await engine.abort()
    assert (await queued).token_ids == [] and (await queued).finish_reason == "abort"


async def test_cancelling_a_generate_call_frees_its_row(
    engine: LocalEngine, chat_prompt: list[int]
) -> None:
    long = SamplingParams(temperature=0, max_new_tokens=200, ignore_eos=True)
    task = asyncio.create_task(engine.generate(chat_prompt, long))
    await wait_until(lambda: engine.stats.tokens_generated >= 2)
    task.cancel()
    assert len((await engine.generate(chat_prompt, GREEDY)).token_ids) == 8
    assert engine.stats.max_rows == 1, "the cancelled request still occupied a row"


async def test_a_partial_rollout_continues_from_its_partial_tokens(
    engine: LocalEngine, chat_prompt: list[int]
) -> None:
    full = await engine.generate(chat_prompt, GREEDY)
    first = asyncio.create_task(engine.generate(chat_prompt, GREEDY, session_id="p"))
    await wait_until(lambda: engine.stats.tokens_generated >= 8 + 3)
    await engine.abort("p")
    partial = await first
    assert partial.finish_reason == "abort" and 3 <= len(partial.token_ids) < 8
    rest = SamplingParams(temperature=0, max_new_tokens=8 - len(partial.token_ids), ignore_eos=True)
    resumed = await engine.generate(chat_prompt + partial.token_ids, rest)
    assert partial.token_ids + resumed.token_ids == full.token_ids


async def test_update_weights_bumps_the_version_and_changes_outputs(
    engine: LocalEngine, smollm2: PreTrainedModel, chat_prompt: list[int]
) -> None:
    original = smollm2.state_dict()[ZEROED].clone()
    baseline = await engine.generate(chat_prompt, GREEDY)
    try:
        await engine.pause()
        await engine.update_weights([(ZEROED, torch.zeros_like(original))], version=1)
        await engine.resume()
        changed = await engine.generate(chat_prompt, GREEDY)
        assert engine.weight_version == 1 and changed.weight_version == 1
        assert changed.token_weight_versions == [1] * 8
        assert changed.token_ids != baseline.token_ids
        assert changed.token_ids == argmax_loop(smollm2, chat_prompt, 8)
    finally:
        await engine.update_weights([(ZEROED, original)], version=2)
    restored = await engine.generate(chat_prompt, GREEDY)
    assert restored.token_ids == baseline.token_ids and restored.weight_version == 2


async def test_bad_weight_updates_are_rejected_and_change_nothing(
    engine: LocalEngine, smollm2: PreTrainedModel
) -> None:
    before = smollm2.state_dict()[ZEROED].clone()
    with pytest.raises(ValueError, match=r"unknown name 'model\.layers\.3\.mlp\.down_prj\.weight'"):
        await engine.update_weights([("model.layers.3.mlp.down_prj.weight", before)], version=1)
    with pytest.raises(ValueError, match="shape"):
        await engine.update_weights([(ZEROED, before.T)], version=1)
    with pytest.raises(ValueError, match="older"):
        await engine.update_weights([(ZEROED, before)], version=-1)
    assert engine.weight_version == 0 and torch.equal(smollm2.state_dict()[ZEROED], before)


async def test_a_weight_update_mid_generation_recomputes_the_cache(
    engine: LocalEngine, smollm2: PreTrainedModel, chat_prompt: list[int]
) -> None:
    """Tokens after the update equal greedy decoding under the new weights from the same ids."""
    original = smollm2.state_dict()[ZEROED].clone()
    sampling = SamplingParams(temperature=0, max_new_tokens=10, ignore_eos=True)
    task = asyncio.create_task(engine.generate(chat_prompt, sampling))
    await wait_until(lambda: engine.stats.tokens_generated >= 3)
    try:  # not paused: the update lands between two steps
        await engine.update_weights([(ZEROED, torch.zeros_like(original))], version=1)
        result = await task
        before = result.token_weight_versions.count(0)
        assert before >= 3 and result.token_weight_versions == [0] * before + [1] * (10 - before)
        reference = argmax_loop(smollm2, chat_prompt + result.token_ids[:before], 10 - before)
        assert result.token_ids[before:] == reference
    finally:
        await engine.update_weights([(ZEROED, original)], version=2)


@pytest.mark.parametrize(
    ("bad_ids", "error", "message"),
    [
        ([], ValueError, "empty"),
        ([1, 2, 49152], ValueError, r"outside the vocabulary \[0, 49152\): \[49152\]"),
        ([1, -3, 2], ValueError, "outside the vocabulary"),
        ([1] * 8192, ValueError, "context holds 8192"),
        ([1, 2.5], TypeError, "ints"),
    ],
)
async def test_bad_input_ids_fail_that_request_only(
    engine: LocalEngine, chat_prompt: list[int], bad_ids: list, error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        await engine.generate(bad_ids, GREEDY)
    assert len((await engine.generate(chat_prompt, GREEDY)).token_ids) == 8


async def test_a_failing_forward_fails_its_batch_and_the_engine_keeps_serving(
    engine: LocalEngine, smollm2: PreTrainedModel, chat_prompt: list[int]
) -> None:
    def explode(*args: object) -> None:
        raise RuntimeError("simulated device failure")

    hook = smollm2.model.layers[0].register_forward_hook(explode)
    try:
        with pytest.raises(EngineError, match="simulated device failure"):
            await engine.generate(chat_prompt, GREEDY)
    finally:
        hook.remove()
    assert len((await engine.generate(chat_prompt, GREEDY)).token_ids) == 8


async def test_a_dead_scheduler_fails_pending_and_later_requests(
    engine: LocalEngine, chat_prompt: list[int]
) -> None:
    await engine.pause()
    pending = asyncio.create_task(engine.generate(chat_prompt, GREEDY))
    await asyncio.sleep(0)
    engine._task.cancel()  # white-box: stands in for a bug that kills the scheduler
    with pytest.raises(EngineError, match="scheduler died"):
        await pending
    with pytest.raises(EngineError, match="scheduler died"):
        await engine.generate(chat_prompt, GREEDY)


async def test_lifecycle_errors_are_clear(smollm2: PreTrainedModel, chat_prompt: list[int]) -> None:
    engine = LocalEngine(smollm2)
    with pytest.raises(EngineError, match="not started"):
        await engine.generate(chat_prompt, GREEDY)
    async with engine:
        running = asyncio.create_task(
            engine.generate(chat_prompt, SamplingParams(max_new_tokens=500, ignore_eos=True))
        )
        await wait_until(lambda: engine.stats.tokens_generated >= 1)
    assert (await running).finish_reason == "abort"  # closing aborts what is in flight
    with pytest.raises(EngineError, match="closed"):
        await engine.generate(chat_prompt, GREEDY)
