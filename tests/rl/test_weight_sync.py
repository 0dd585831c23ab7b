"""Weight sync from the FSDP2 actor into LocalEngines, in a one-process group.

The two-process sync (rank 0 holds the engine, rank 1 only gathers) runs in test_actor.py's
torchrun job. Engine-vs-trainer log-probs are compared within float32 rounding: the engine decodes
over a KV cache, the trainer runs one full forward, so their rounding differs (measured about
1e-6 for the tiny Llama); the tolerance is derived from the model's float32 error against float64
on this CPU (tests/float_tolerance.py).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import torch
from float_tolerance import logprob_error, tolerance
from fsdp_worker import global_batch, nll_loss, one_process_group, tiny_llama
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from agentrl.engine_pool.engine import SamplingParams
from agentrl.engine_pool.local_engine import LocalEngine
from agentrl.engine_pool.weights import apply_named_tensors
from agentrl.fp8_weights import fp8_weight_names, round_trip, scale_name
from agentrl.rl.weight_sync import WeightSyncError, sync_weights
from agentrl.training.actor import Actor, ActorConfig
from agentrl.training.distributed import DistInfo
from agentrl.training.full_state import engine_parameter_name, iter_full_state_dict_buckets
from agentrl.training.logprobs import token_logprobs

PROMPT = [1, 5, 9, 14, 2, 7, 30, 11]


@pytest.fixture(scope="module")
def dist_info() -> Iterator[DistInfo]:
    with one_process_group() as info:
        yield info


def test_buckets_hold_every_fp32_parameter_once_under_hf_names(dist_info: DistInfo) -> None:
    config = ActorConfig(mixed_precision="bf16", activation_checkpointing=True)
    actor = Actor(tiny_llama(), config)
    with torch.no_grad():  # leaves the root's bf16 parameters gathered (no reshard after forward)
        actor.model(torch.tensor([PROMPT]))
    buckets = list(iter_full_state_dict_buckets(actor.model, bucket_bytes=4096))

    reference = dict(tiny_llama().named_parameters())  # tied: lm_head.weight is not listed
    sent = [name for bucket in buckets for name, _ in bucket]
    assert sent == list(reference)
    for bucket in buckets:
        assert len(bucket) == 1 or sum(t.numel() * t.element_size() for _, t in bucket) <= 4096
        for name, tensor in bucket:
            assert tensor.dtype == torch.float32  # the master weights, not the bf16 copies
            torch.testing.assert_close(tensor, reference[name].detach(), rtol=0, atol=0)
        assert apply_named_tensors(tiny_llama(), bucket) == len(bucket)

    cast = list(iter_full_state_dict_buckets(actor.model, dtype=torch.bfloat16))
    assert len(cast) == 1 and {t.dtype for _, t in cast[0]} == {torch.bfloat16}


def test_wrapper_segments_are_stripped_from_names() -> None:
    wrapped = "model.layers.0._checkpoint_wrapped_module.mlp._orig_mod.up_proj.weight"
    assert engine_parameter_name(wrapped) == "model.layers.0.mlp.up_proj.weight"


def load(model: str, smollm2: PreTrainedModel | None) -> PreTrainedModel:
    return tiny_llama() if model == "tiny" else copy.deepcopy(smollm2)


@pytest.mark.parametrize("model", ["tiny", pytest.param("smollm2", marks=pytest.mark.slow)])
async def test_synced_engine_matches_the_trained_model(
    dist_info: DistInfo, request: pytest.FixtureRequest, model: str
) -> None:
    smollm2 = request.getfixturevalue("smollm2") if model == "smollm2" else None
    actor = Actor(load(model, smollm2), ActorConfig(lr=1e-3))
    vocab = actor.model.config.vocab_size
    actor.train_step(global_batch(vocab)[:2], nll_loss)
    async with LocalEngine(load(model, smollm2), eos_token_ids=[0]) as engine:
        report = await sync_weights(actor.model, [engine], version=1, bucket_bytes=2**24)
        assert engine.weight_version == 1 and report.version == 1 and report.engines == 1
        trained = {n: t for b in iter_full_state_dict_buckets(actor.model) for n, t in b}
        engine_params = engine.model.state_dict()
        assert report.tensors == len(trained) and report.buckets >= 1
        for name, tensor in trained.items():
            assert torch.equal(engine_params[name], tensor), name
        if model == "smollm2":  # tied: the engine's lm_head is the synced embedding
            assert torch.equal(
                engine_params["lm_head.weight"], trained["model.embed_tokens.weight"]
            )

        greedy = SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True)
        result = await engine.generate(PROMPT, greedy)
        if model == "smollm2":  # measured once per session on the untrained weights
            error, _, magnitude = request.getfixturevalue("smollm2_rounding")
        else:  # the engine holds exactly the trained weights (above)
            error, _, magnitude = logprob_error(engine.model, PROMPT + result.token_ids)
    assert result.token_weight_versions == [1] * 6
    ids = torch.tensor([PROMPT + result.token_ids])
    with torch.no_grad():
        expected = token_logprobs(actor.model, ids, 0.0)[0, len(PROMPT) - 1 :]
    atol = tolerance(error, magnitude)
    torch.testing.assert_close(torch.tensor(result.logprobs), expected, atol=atol, rtol=0)


async def test_an_engine_that_rejects_a_bucket_is_named_and_the_others_updated(
    dist_info: DistInfo,
) -> None:
    actor = Actor(tiny_llama(), ActorConfig(lr=1e-3))
    actor.train_step(global_batch(64)[:1], nll_loss)
    wider = LlamaForCausalLM(
        LlamaConfig(vocab_size=64, hidden_size=48, num_hidden_layers=2, num_attention_heads=4)
    )
    before = copy.deepcopy(wider.state_dict())
    async with (
        LocalEngine(tiny_llama(), eos_token_ids=[0]) as good,
        LocalEngine(wider, eos_token_ids=[0]) as bad,
    ):
        with pytest.raises(WeightSyncError, match="reached 1 of 2 engines") as caught:
            await sync_weights(actor.model, [good, bad], version=3)
        assert "engine 1" in str(caught.value) and "the model expects" in str(caught.value)
        assert isinstance(caught.value.__cause__, ValueError)
        assert (good.weight_version, bad.weight_version) == (3, 0)
        for name, tensor in bad.model.state_dict().items():
            assert torch.equal(tensor, before[name]), name  # all-or-nothing per bucket
        result = await good.generate(PROMPT, SamplingParams(temperature=0, max_new_tokens=2))
        assert result.token_weight_versions == [3, 3]  # resumed, serving the new weights


async def test_fp8_sync_sends_sglang_pairs_and_the_engine_holds_the_rounded_weights(
    dist_info: DistInfo,
) -> None:
    actor = Actor(tiny_llama(), ActorConfig(lr=1e-3))
    actor.train_step(global_batch(64)[:2], nll_loss)
    names = fp8_weight_names(actor.model)
    assert names == fp8_weight_names(tiny_llama()) and len(names) == 14
    received: list[tuple[str, torch.Tensor]] = []
    async with LocalEngine(tiny_llama(), eos_token_ids=[0], fp8_weights=True) as engine:
        real_update = engine.update_weights

        async def recording_update(bucket: list[tuple[str, torch.Tensor]], version: int) -> None:
            received.extend(bucket)
            await real_update(bucket, version)

        engine.update_weights = recording_update  # type: ignore[method-assign]
        report = await sync_weights(actor.model, [engine], version=1, fp8_names=names)
        trained = {n: t for b in iter_full_state_dict_buckets(actor.model) for n, t in b}
        assert report.tensors == len(trained) + len(names)
        sent = dict(received)
        for name, tensor in trained.items():
            if name in names:
                assert sent[name].dtype == torch.float8_e4m3fn
                assert sent[scale_name(name)].dtype == torch.float32
                expected = round_trip(tensor)
            else:
                assert sent[name].dtype == torch.float32
                expected = tensor
            assert torch.equal(engine.model.state_dict()[name], expected), name
        assert report.bytes < sum(t.numel() * 4 for t in trained.values()) * 0.75
