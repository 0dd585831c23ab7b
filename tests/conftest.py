"""Fixtures shared by the whole suite.

The SmolLM2 model and its tokenizer are loaded once per session (about 1 s from the directory
``agentrl.models`` converts the GGUF into once per machine; the conversion takes about 25 s).
``AGENTRL_TEST_MODEL`` may name another model reference; it defaults to ``smollm2``.
"""

import sys
import warnings
from pathlib import Path

import pytest
import torch.distributed as dist
from model_ref import MODEL

from agentrl.models import load_model, load_tokenizer

# The example plugin package is importable in-tree for unit tests; test_registration also installs it
# for real to exercise entry-point discovery.
PLUGIN_DIR = Path(__file__).parent / "plugins" / "agentrl-echo"
sys.path.insert(0, str(PLUGIN_DIR))


@pytest.fixture(autouse=True)
def no_process_group_left_behind():
    """A test (or its function-scoped fixtures) leaves the default process group as it found it:
    a leftover group changes what every later test in the same worker process sees."""
    had_group = dist.is_initialized()
    yield
    if dist.is_initialized() and not had_group:
        dist.destroy_process_group()
        pytest.fail("the test left a default process group behind (destroyed now)")


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer(MODEL)


@pytest.fixture(scope="session")
def smollm2():
    """The shared float32 model. Tests that change its weights restore them before returning."""
    return load_model(MODEL, dtype="float32")


@pytest.fixture(scope="session")
def smollm2_rounding(smollm2, tokenizer):
    """How far SmolLM2's float32 log-probs are from float64 ones on this CPU, at ``T = 1``:
    ``(max, mean, magnitude)`` over every position of a fixed chat (`logprob_error`). The
    reference for comparing two float32 evaluations of its log-probs (tests/float_tolerance.py);
    at temperature ``T`` the logits' rounding is divided by ``T``. A float64 copy of the model and
    one forward: about 5 s, once per session."""
    from float_tolerance import logprob_error

    messages = [
        {"role": "user", "content": "Name three colours."},
        {"role": "assistant", "content": "Red, green and blue: the primary colours of light."},
    ]
    return logprob_error(smollm2, list(tokenizer.apply_chat_template(messages, return_dict=False)))


@pytest.fixture
async def engine(smollm2, tokenizer):
    """A fresh LocalEngine (own prefix cache and stats) over the shared SmolLM2 weights."""
    from agentrl.engine_pool import LocalEngine

    async with LocalEngine(smollm2, tokenizer=tokenizer, max_batch_size=16) as engine:
        yield engine


@pytest.fixture(scope="session")
def make_tiny_llama():
    """Build a small randomly initialised Llama (vocab 64, 2 layers) for tests that need no load."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    def make(**overrides):
        torch.manual_seed(0)
        config = dict(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
        )
        return LlamaForCausalLM(LlamaConfig(**{**config, **overrides})).eval()

    return make


@pytest.fixture
def strict_gymnasium_warnings():
    """Turn every warning (gymnasium's checker warns rather than fails) into an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


@pytest.fixture(scope="session")
def tiny_policy_dir(tmp_path_factory, tokenizer, make_tiny_llama):
    """A randomly initialised 2-layer Llama over SmolLM2's vocabulary, saved with SmolLM2's
    tokenizer as a Hugging Face directory: a whole training run in seconds (its text is noise)."""
    path = tmp_path_factory.mktemp("tiny-policy")
    model = make_tiny_llama(
        vocab_size=len(tokenizer),
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
