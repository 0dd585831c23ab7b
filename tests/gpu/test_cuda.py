"""The CUDA paths, on a GPU only: the embedded engine, FSDP2 with NCCL, weight sync, FP8 training,
CUDA-IPC weight payloads.

These tests are skipped where ``torch.cuda.is_available()`` is false (every CI machine of this
project); they are what a session with a lent GPU runs first (``pytest tests/gpu``). They use
randomly initialised models, since the GPU machines cannot fetch SmolLM2's weights. The CPU
versions of each property are tested elsewhere (tests/engine_pool, tests/training, tests/rl).
"""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from agentrl.engine_pool.engine import SamplingParams
from agentrl.engine_pool.local_engine import LocalEngine
from agentrl.engine_pool.tensor_refs import read_sglang_payload
from agentrl.rl.weight_sync import sync_weights
from agentrl.training.actor import Actor, ActorConfig
from agentrl.training.distributed import distributed, group_backends
from agentrl.training.logprobs import token_logprobs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPT = list(range(5, 37))


def llama(hidden: int = 256, layers: int = 2) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 128,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM(config)


def nll(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, float, dict]:
    logprobs = token_logprobs(model, ids, 1.0)
    return -logprobs.sum(), float(logprobs.numel()), {}


async def test_the_engine_runs_on_the_gpu_and_agrees_with_a_full_forward() -> None:
    model = llama()
    async with LocalEngine(copy.deepcopy(model), eos_token_ids=[0], device="cuda") as engine:
        assert engine.model.device.type == "cuda"
        sampling = SamplingParams(temperature=1.0, max_new_tokens=16, seed=3, ignore_eos=True)
        result, again = [await engine.generate(PROMPT, sampling) for _ in range(2)]
    assert result.token_ids == again.token_ids  # the same seed, the same tokens on the GPU
    ids = torch.tensor([PROMPT + result.token_ids])
    with torch.no_grad():
        expected = token_logprobs(model.eval(), ids, 1.0)[0, len(PROMPT) - 1 :]
    torch.testing.assert_close(torch.tensor(result.logprobs), expected, atol=1e-3, rtol=0)


async def test_fsdp2_on_nccl_trains_and_syncs_into_a_gpu_engine() -> None:
    with distributed() as info:
        assert info.backend == "nccl" and info.device.type == "cuda"
        actor = Actor(llama(), ActorConfig(lr=1e-3))
        batch = torch.tensor([PROMPT * 2], device=info.device)

        losses = [actor.train_step([batch], nll)["loss"] for _ in range(5)]
        assert losses[-1] < losses[0]
        async with LocalEngine(llama(), eos_token_ids=[0], device="cuda") as engine:
            await sync_weights(actor.model, [engine], version=1)
            trained = {n: p.full_tensor() for n, p in actor.model.named_parameters()}
            for name, tensor in engine.model.named_parameters():
                torch.testing.assert_close(tensor, trained[name], rtol=0, atol=0)


async def test_cpu_offload_keeps_shards_and_adam_state_in_cpu_memory_and_trains() -> None:
    """actor.offload='cpu': FSDP2's CPUOffloadPolicy over a cuda:nccl,cpu:gloo group; the norm
    of CPU gradients and the weight sync's gather of CPU shards go over gloo."""
    with distributed(cpu_collectives=True) as info:
        assert group_backends() == {"cuda": "nccl", "cpu": "gloo"}
        actor = Actor(llama(), ActorConfig(lr=1e-3, offload="cpu"))
        assert {p.to_local().device.type for p in actor.model.parameters()} == {"cpu"}
        batch = torch.tensor([PROMPT * 2], device=info.device)

        losses = [actor.train_step([batch], nll)["loss"] for _ in range(5)]
        assert losses[-1] < losses[0]
        moments = [
            value.to_local() if hasattr(value, "to_local") else value
            for state in actor.optimizer.state.values()
            for value in state.values()
            if isinstance(value, torch.Tensor) and value.dim() > 0
        ]
        assert moments and {m.device.type for m in moments} == {"cpu"}
        async with LocalEngine(llama(), eos_token_ids=[0], device="cuda") as engine:
            await sync_weights(actor.model, [engine], version=1)
            trained = {n: p.full_tensor() for n, p in actor.model.named_parameters()}
            for name, tensor in engine.model.named_parameters():
                torch.testing.assert_close(tensor.cpu(), trained[name].cpu(), rtol=0, atol=0)


def test_fp8_training_runs_on_an_fp8_gpu() -> None:
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 matmuls need compute capability 8.9+")
    pytest.importorskip("torchao", reason="pip install 'agentrl[gpu]'")
    with distributed() as info:
        config = ActorConfig(
            lr=1e-3, mixed_precision="bf16", fp8="tensorwise", fp8_min_features=256
        )
        actor = Actor(llama(hidden=512), config)
        assert {type(m).__name__ for m in actor.model.modules()} >= {"Float8Linear"}
        batch = torch.tensor([PROMPT * 4], device=info.device)

        losses = [actor.train_step([batch], nll)["loss"] for _ in range(5)]
        assert losses[-1] < losses[0]


_SEND_CUDA = """
import sys, torch
from agentrl.engine_pool.sglang_api import sglang_tensor_payloads
t = torch.arange(12.0, device="cuda").reshape(3, 4)
print(sglang_tensor_payloads([("w", t)])[0], flush=True)
sys.stdin.readline()  # the tensor lives until the reader is done
"""


def test_cuda_tensors_travel_by_ipc_handle_from_an_unrelated_process() -> None:
    """SGLang's by-reference payload of a CUDA tensor (device named by UUID) read by another
    process, as `agentrl serve` on a GPU reads a colocated trainer's weights (tensor_refs)."""
    sender = subprocess.Popen(
        [sys.executable, "-c", _SEND_CUDA], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert sender.stdout is not None and sender.stdin is not None
        ((name, tensor),) = read_sglang_payload(sender.stdout.readline().strip())
        assert name == "w" and tensor.is_cuda
        assert torch.equal(tensor.cpu(), torch.arange(12.0).reshape(3, 4))
        del tensor
        sender.stdin.write("done\n")
        sender.stdin.flush()
    finally:
        assert sender.wait(60) == 0
