"""agentrl extend-context: SmolLM2 copied with its rotary embedding scaled past its 8,192 trained
positions, served and scored beyond them."""

import json
import subprocess
import sys

import pytest
import torch
from model_cuts import first_layers

from agentrl.context_extension import extend_context
from agentrl.engine_pool import LocalEngine, SamplingParams
from agentrl.models import load_model, load_tokenizer

PROMPT = "The capital of France is Paris. The capital of Peru is Lima. The capital of Japan is"


@pytest.fixture(scope="module")
def extended(tmp_path_factory):
    root = tmp_path_factory.mktemp("extended")
    return {
        method: extend_context("smollm2", root / method, 4, method) for method in ("yarn", "linear")
    }


def test_the_copy_has_the_weights_and_a_scaled_rotary_embedding(extended):
    config = json.loads((extended["yarn"] / "config.json").read_text())
    assert config["max_position_embeddings"] == 4 * 8192
    assert config["rope_parameters"] == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_theta": 100000.0,
    }
    original, copy = load_model("smollm2").state_dict(), load_model(extended["yarn"]).state_dict()
    assert original.keys() == copy.keys()
    assert all(torch.equal(original[name], copy[name]) for name in original)
    assert load_tokenizer(extended["yarn"]).chat_template == load_tokenizer("smollm2").chat_template


def test_yarn_changes_a_short_context_less_than_linear_interpolation(extended):
    """Both rotate every position differently; YaRN keeps the high frequencies as trained."""
    ids = load_tokenizer("smollm2")(PROMPT, return_tensors="pt")["input_ids"]

    def logprobs(model):
        with torch.no_grad():
            return load_model(model)(ids).logits[0].log_softmax(-1)

    base = logprobs("smollm2")
    kl = {
        method: (base.exp() * (base - logprobs(path))).sum(-1).mean().item()
        for method, path in extended.items()
    }
    assert 0 < kl["yarn"] < kl["linear"], kl


def short(model_ref):
    """The model with its first 2 decoder layers only: the positions are what is tested."""
    return first_layers(load_model(model_ref)).eval()


async def test_the_engine_serves_past_the_trained_context_what_the_trainer_scores(extended):
    prompt = torch.randint(0, 49152, (9000,), generator=torch.Generator().manual_seed(0)).tolist()
    sampling = SamplingParams(max_new_tokens=2, temperature=1.0, seed=0)
    async with LocalEngine(short("smollm2")) as engine:
        with pytest.raises(ValueError, match="the model's context holds 8192"):
            await engine.generate(prompt, sampling)
    model = short(extended["yarn"])
    async with LocalEngine(model) as engine:
        result = await engine.generate(prompt, sampling)
    assert len(result.token_ids) == 2
    ids = torch.tensor([prompt + result.token_ids])
    tokens = torch.tensor(result.token_ids)[:, None]

    def scores(model):
        with torch.no_grad():
            logprobs = model(ids).logits[0, len(prompt) - 1 : -1].log_softmax(-1)
        return logprobs.gather(1, tokens)[:, 0]

    engine = torch.tensor(result.logprobs)
    extended_gap = (scores(model) - engine).abs().max()
    unscaled_gap = (scores(short("smollm2")) - engine).abs().max()
    # the engine rotates by the copy's scaled embedding, not the trained one: its log-probs are
    # the copy's up to float32 rounding, far closer than to the unscaled model's
    assert extended_gap < unscaled_gap / 100, (extended_gap, unscaled_gap)


def test_the_command_writes_the_copy_and_refuses_what_it_cannot_extend(extended, tmp_path):
    def command(*args):
        run = [sys.executable, "-m", "agentrl.cli", "extend-context", *map(str, args)]
        return subprocess.run(run, capture_output=True, text=True, timeout=300)

    done = command("smollm2", tmp_path / "x2", "--factor", "2")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "max_position_embeddings 16384" in done.stdout
    refused = command("smollm2", tmp_path / "x2", "--factor", "2")
    assert refused.returncode == 2 and "exists; give a new directory" in refused.stdout
    for args, message in [
        (("smollm2", tmp_path / "y", 1), "factor must be above 1"),
        (("smollm2", tmp_path / "y", 2, "dynamic"), "method must be one of yarn, linear"),
        ((extended["yarn"], tmp_path / "z", 2), "only an unscaled rotary"),
    ]:
        with pytest.raises(ValueError, match=message):
            extend_context(*args)
    assert not (tmp_path / "y").exists() and not (tmp_path / "z").exists()
