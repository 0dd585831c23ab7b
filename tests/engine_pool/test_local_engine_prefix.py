"""LocalEngine's prefix cache on the real SmolLM2-135M-Instruct: reuse, equivalence, invalidation.

Results are compared with the same requests on an engine without the cache (sharing the model), or
with a full-forward argmax loop: same tokens, and log-probs within float32 rounding
(``logprob_atol``: derived from the session's measurement of SmolLM2's float32 error,
tests/float_tolerance.py; about 3.5e-4 here). Greedy must match exactly. Seeded sampling is compared on one fixed case (seeds 11-13,
T=0.8, top-p 0.95, a three-turn conversation), checked to give identical tokens: there, cached and
fresh KV give log-probs within 4e-6 of each other (measured), far from any sampling boundary;
another case could in principle land on a boundary and diverge, as batching can.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence

import pytest
import torch
from engine_helpers import ZEROED, argmax_loop, wait_until
from float_tolerance import tolerance
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from agentrl.engine_pool.engine import GenerateResult, SamplingParams
from agentrl.engine_pool.local_engine import LocalEngine

pytestmark = pytest.mark.slow

N = 8  # tokens per turn
GREEDY = SamplingParams(temperature=0, max_new_tokens=N, ignore_eos=True)
SAMPLED = [
    SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=N, ignore_eos=True, seed=seed)
    for seed in (11, 12, 13)
]


@pytest.fixture
def cached(engine: LocalEngine) -> LocalEngine:
    """The shared engine fixture (prefix cache on by default), named against ``uncached``."""
    return engine


@pytest.fixture
async def uncached(
    smollm2: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> AsyncIterator[LocalEngine]:
    async with LocalEngine(
        smollm2, tokenizer=tokenizer, max_batch_size=16, prefix_cache_tokens=0
    ) as engine:
        yield engine


@pytest.fixture(scope="module")
def delta(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """What a chat template appends between two assistant turns (15 tokens)."""
    text = "<|im_end|>\n<|im_start|>user\nAnd two more?<|im_end|>\n<|im_start|>assistant\n"
    return tokenizer.encode(text, add_special_tokens=False)


def chat(tokenizer: PreTrainedTokenizerBase, question: str) -> list[int]:
    messages = [{"role": "user", "content": question}]
    return list(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    )


async def conversation(
    engine: LocalEngine,
    prompt: list[int],
    delta: list[int],
    turns: Sequence[SamplingParams],
    session_id: str,
) -> list[GenerateResult]:
    """Each turn's prompt is the previous prompt + its completion + ``delta``."""
    ids, results = list(prompt), []
    for sampling in turns:
        result = await engine.generate(ids, sampling, session_id=session_id)
        results.append(result)
        ids = ids + result.token_ids + delta
    return results


@pytest.fixture
def logprob_atol(smollm2_rounding: tuple[float, float, float]) -> float:
    """How far two float32 evaluations of a log-prob here may differ: from SmolLM2's float32 error
    at T = 1, divided by 0.8, the lowest temperature sampled here (greedy: log-probs at T = 1)."""
    error, _, magnitude = smollm2_rounding
    return tolerance(error / 0.8, magnitude / 0.8)


@pytest.fixture
def assert_same(
    logprob_atol: float,
) -> Callable[[list[GenerateResult], list[GenerateResult]], None]:
    def check(results: list[GenerateResult], references: list[GenerateResult]) -> None:
        for result, reference in zip(results, references, strict=True):
            assert result.token_ids == reference.token_ids
            assert result.logprobs == pytest.approx(reference.logprobs, abs=logprob_atol)

    return check


async def settle(engine: LocalEngine) -> None:
    """Wait for the iteration in progress: right after a ``generate`` returns, that is the one
    that moves the finished row into the prefix cache."""
    await engine.pause()
    await engine.resume()


@pytest.mark.parametrize("turns", [[GREEDY] * 3, SAMPLED], ids=["greedy", "seeded"])
async def test_later_turns_prefill_only_their_new_tokens_and_match_no_cache(
    cached: LocalEngine,
    uncached: LocalEngine,
    chat_prompt: list[int],
    delta: list[int],
    turns: list[SamplingParams],
    assert_same: Callable[..., None],
) -> None:
    results = await conversation(cached, chat_prompt, delta, turns, "s")
    assert_same(results, await conversation(uncached, chat_prompt, delta, turns, "s"))
    # turn 1 computes its prompt; turns 2 and 3 only the last sampled token and the delta
    turn_2 = len(chat_prompt) + N + len(delta)
    assert cached.stats.prefill_tokens == len(chat_prompt) + 2 * (1 + len(delta))
    assert cached.stats.prefix_hit_tokens == (turn_2 - len(delta) - 1) + (turn_2 + N - 1)
    assert uncached.stats.prefill_tokens == len(chat_prompt) + turn_2 + turn_2 + N + len(delta)
    assert uncached.stats.prefix_hit_tokens == 0 and len(uncached.prefix_cache) == 0
    await settle(cached)
    everything = chat_prompt + [t for r in results for t in [*r.token_ids, *delta]]
    assert cached.prefix_cache.sequences() == [tuple(everything[: -len(delta) - 1])]


async def test_a_partial_prefix_is_reused_and_misses_are_computed(
    cached: LocalEngine,
    uncached: LocalEngine,
    tokenizer: PreTrainedTokenizerBase,
    chat_prompt: list[int],
    delta: list[int],
    assert_same: Callable[..., None],
) -> None:
    first = await cached.generate(chat_prompt, GREEDY, session_id="a")
    branch = chat_prompt + delta  # leaves the cached sequence right after the prompt
    story = tokenizer.encode("Once upon a time", add_special_tokens=False)
    assert first.token_ids[0] != delta[0] and story[0] != chat_prompt[0]
    branched = await cached.generate(branch, GREEDY, session_id="b")
    assert (cached.stats.prefix_hit_tokens, cached.stats.prefill_tokens) == (
        len(chat_prompt),
        len(chat_prompt) + len(delta),
    )
    missed = await cached.generate(story, GREEDY, session_id="a")  # the hint does not match
    assert cached.stats.prefix_hit_tokens == len(chat_prompt)
    await cached.flush_cache()
    flushed = await cached.generate(branch, GREEDY, session_id="b")
    assert cached.stats.prefix_hit_tokens == len(chat_prompt)
    references = [await uncached.generate(ids, GREEDY) for ids in (branch, story, branch)]
    assert_same([branched, missed, flushed], references)


async def test_a_tiny_budget_evicts_the_least_recently_used_entry(
    smollm2: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    uncached: LocalEngine,
    chat_prompt: list[int],
    delta: list[int],
    assert_same: Callable[..., None],
) -> None:
    story = tokenizer.encode("Once upon a time", add_special_tokens=False)
    budget = len(chat_prompt) + N  # holds the first entry (prompt + N - 1 tokens), not two
    async with LocalEngine(smollm2, tokenizer=tokenizer, prefix_cache_tokens=budget) as engine:
        first = await engine.generate(chat_prompt, GREEDY, session_id="a")
        second = await engine.generate(story, GREEDY, session_id="b")
        await settle(engine)
        story_entry = tuple(story + second.token_ids[:-1])
        assert engine.prefix_cache.sequences() == [story_entry]
        next_turn = chat_prompt + first.token_ids + delta
        again = await engine.generate(next_turn, GREEDY, session_id="a")
        assert engine.stats.prefix_hit_tokens == 0
        assert_same([again], [await uncached.generate(next_turn, GREEDY)])
        await settle(engine)  # this turn's entry is longer than the whole budget: not stored
        assert engine.prefix_cache.sequences() == [story_entry]
        assert engine.prefix_cache.tokens <= budget


async def test_a_weight_update_empties_the_cache(
    cached: LocalEngine, smollm2: PreTrainedModel, chat_prompt: list[int], delta: list[int]
) -> None:
    original = smollm2.state_dict()[ZEROED].clone()
    first = await cached.generate(chat_prompt, GREEDY, session_id="s")
    await settle(cached)
    assert len(cached.prefix_cache) == 1
    try:
        await cached.update_weights([(ZEROED, torch.zeros_like(original))], version=1)
        assert len(cached.prefix_cache) == 0
        next_turn = chat_prompt + first.token_ids + delta
        second = await cached.generate(next_turn, GREEDY, session_id="s")
        assert cached.stats.prefix_hit_tokens == 0
        assert second.token_ids == argmax_loop(smollm2, next_turn, N)
    finally:
        await cached.update_weights([(ZEROED, original)], version=2)


async def test_rows_computed_before_a_weight_update_are_never_cached(
    cached: LocalEngine, smollm2: PreTrainedModel, chat_prompt: list[int]
) -> None:
    """A request aborted while paused leaves the batch only after the update that follows."""
    original = smollm2.state_dict()[ZEROED].clone()
    long = SamplingParams(temperature=0, max_new_tokens=200, ignore_eos=True)
    task = asyncio.create_task(cached.generate(chat_prompt, long, session_id="a"))
    await wait_until(lambda: cached.stats.tokens_generated >= 3)
    await cached.pause()
    await cached.abort("a")
    partial = await task
    try:
        await cached.update_weights([(ZEROED, torch.zeros_like(original))], version=1)
        await cached.resume()
        resumed_ids = chat_prompt + partial.token_ids
        resumed = await cached.generate(resumed_ids, GREEDY, session_id="a")
        assert cached.stats.prefix_hit_tokens == 0, "KV from the old weights was reused"
        assert resumed.token_ids == argmax_loop(smollm2, resumed_ids, N)
    finally:
        await cached.update_weights([(ZEROED, original)], version=2)


async def test_an_aborted_partial_rollout_resumes_from_its_cached_kv(
    cached: LocalEngine, uncached: LocalEngine, chat_prompt: list[int], logprob_atol: float
) -> None:
    total = 16
    full = await uncached.generate(
        chat_prompt, SamplingParams(temperature=0, max_new_tokens=total, ignore_eos=True)
    )
    long = SamplingParams(temperature=0, max_new_tokens=200, ignore_eos=True)
    task = asyncio.create_task(cached.generate(chat_prompt, long, session_id="p"))
    await wait_until(lambda: cached.stats.tokens_generated >= 4)
    await cached.abort("p")
    partial = await task
    done = len(partial.token_ids)
    assert partial.finish_reason == "abort" and 4 <= done < total
    rest = SamplingParams(temperature=0, max_new_tokens=total - done, ignore_eos=True)
    resumed = await cached.generate(chat_prompt + partial.token_ids, rest, session_id="p")
    assert cached.stats.prefix_hit_tokens == len(chat_prompt) + done - 1
    assert partial.token_ids + resumed.token_ids == full.token_ids
    assert partial.logprobs + resumed.logprobs == pytest.approx(full.logprobs, abs=logprob_atol)


async def test_interleaved_sessions_join_a_running_batch_and_match_no_cache(
    cached: LocalEngine,
    uncached: LocalEngine,
    tokenizer: PreTrainedTokenizerBase,
    delta: list[int],
    assert_same: Callable[..., None],
) -> None:
    prompts = [chat(tokenizer, q) for q in ("Name three colours.", "What is 2+2?", "Say hi.")]
    turn = SamplingParams(temperature=0, max_new_tokens=5, ignore_eos=True)
    background = SamplingParams(temperature=0, max_new_tokens=30, ignore_eos=True)

    async def workload(engine: LocalEngine) -> list[GenerateResult]:
        long = asyncio.create_task(
            engine.generate(chat(tokenizer, "Count to twenty."), background, session_id="bg")
        )
        sessions = await asyncio.gather(
            *(conversation(engine, p, delta, [turn] * 3, f"s{i}") for i, p in enumerate(prompts))
        )
        assert not long.done(), "the later turns did not join a running batch"
        return [await long] + [result for session in sessions for result in session]

    assert_same(await workload(cached), await workload(uncached))
    assert cached.stats.max_rows == 4
    # turns 2 and 3 of every session reuse everything but the last token of the previous turn
    turn_2 = [len(p) + 5 + len(delta) for p in prompts]
    expected = sum((t - len(delta) - 1) + (t + 5 - 1) for t in turn_2)
    assert cached.stats.prefix_hit_tokens == expected
