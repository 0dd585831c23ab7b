"""LocalEngine.release_weights: the weights and prefix cache of an idle engine are freed, requests
wait, and an update that brings back every parameter makes it serve the same tokens again."""

from __future__ import annotations

import asyncio

import pytest
from engine_helpers import ZEROED, wait_until
from transformers import PreTrainedTokenizerBase

from agentrl.engine_pool.engine import EngineError, SamplingParams
from agentrl.engine_pool.local_engine import LocalEngine

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True)


async def test_released_weights_come_back_whole_and_requests_wait_for_them(
    tokenizer: PreTrainedTokenizerBase, chat_prompt: list[int]
) -> None:
    async with LocalEngine("smollm2", tokenizer=tokenizer, dtype="bfloat16") as engine:
        before = await engine.generate(chat_prompt, GREEDY)
        weights = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
        held = sum(t.numel() * t.element_size() for t in weights.values())
        cached = engine.prefix_cache.nbytes
        assert cached > 0  # the request's KV, kept when it left the batch

        assert await engine.release_weights() == held + cached
        assert engine.released and engine.prefix_cache.nbytes == 0
        assert all(p.untyped_storage().nbytes() == 0 for p in engine.model.parameters())
        with pytest.raises(EngineError, match="released"):
            await engine.get_weights_by_name(ZEROED)

        prefills = engine.stats.prefills
        waiting = asyncio.create_task(engine.generate(chat_prompt, GREEDY))
        names = list(weights)
        with pytest.raises(ValueError, match="nothing was changed"):  # a bad bucket loads nothing
            await engine.update_weights([(names[0], weights[names[0]].T)], version=1)
        await engine.update_weights([(n, weights[n]) for n in names[:-1]], version=1)
        await asyncio.sleep(0.5)  # ample time for a prefill, if the engine ran one
        assert engine.released and not waiting.done() and engine.stats.prefills == prefills

        await engine.update_weights([(names[-1], weights[names[-1]])], version=1)
        after = await waiting
        assert not engine.released and after.weight_version == 1
        assert after.token_ids == before.token_ids and after.logprobs == before.logprobs


async def test_an_engine_with_a_request_running_keeps_its_weights(
    tokenizer: PreTrainedTokenizerBase, chat_prompt: list[int]
) -> None:
    async with LocalEngine("smollm2", tokenizer=tokenizer, dtype="bfloat16") as engine:
        long = SamplingParams(temperature=0, max_new_tokens=64, ignore_eos=True)
        running = asyncio.create_task(engine.generate(chat_prompt, long))
        await wait_until(lambda: engine.stats.tokens_generated >= 1)
        with pytest.raises(EngineError, match="idle engine"):
            await engine.release_weights()
        assert not engine.released and len((await running).token_ids) == 64
