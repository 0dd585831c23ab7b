"""`agentrl serve` as the SGLang server of verl 0.9.1's own HTTP client (issue 34, point 5).

A real ``agentrl serve`` subprocess of SmolLM2 on loopback; verl's ``AsyncHttpServerAdapter``
(``verl/workers/rollout/sglang_rollout/http_server_engine.py``, from PyPI) drives it from the side
script ``verl_client/verl_side.py`` (in ``.venv-sglang`` with ``.venv-verl``'s verl: the module
imports SGLang). The sampling params are the dict verl's agent loop builds
(``verl/experimental/agent_loop/agent_loop.py``: temperature, top_p, top_k, ``repetition_penalty=1.0``;
greedy validation sets ``temperature=0, top_k=-1, top_p=1``) plus the ``max_new_tokens`` its SGLang
server adds. Checked: the tokens equal agentrl's own SGLang client's on the same server, ``text`` is
the decoded output as SGLang's detokenizer returns it (stop token and stop string trimmed unless
``no_stop_trim``; ``skip_special_tokens`` honoured), the penalties and ``min_new_tokens`` are
honoured (verl's request gives the tokens agentrl's client gets with the same keys), and the
control calls verl makes (flush_cache, abort_request, v1/models, begin/end_weight_update) and the
read-only routes (v1/loads, get_weight_version) answer.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import test_sglang_http
import torch
from test_sglang_conformance import run_process

from agentrl.engine_pool.engine import SamplingParams
from agentrl.engine_pool.sglang_engine import SGLangEngine

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SIDE_PYTHON = ROOT / ".venv-sglang" / "bin" / "python"
SIDE = Path(__file__).parent / "verl_client" / "verl_side.py"

VERL_ROLLOUT = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0}
VERL_GREEDY = {**VERL_ROLLOUT, "temperature": 0, "top_k": -1, "top_p": 1.0}


model_dir = test_sglang_http.model_dir  # SmolLM2 saved as a Hugging Face directory


@pytest.fixture(scope="module")
def serve_url(model_dir, tmp_path_factory):
    with test_sglang_http.running_server(
        model_dir, tmp_path_factory.mktemp("serve") / "serve.log"
    ) as url:
        yield url


@pytest.fixture(scope="module")
def side_venvs() -> None:
    """``.venv-verl`` (verl 0.9.1) made if missing by ``bench/setup_verl_env.sh`` (idempotent; the
    verl reference test runs it too), ``.venv-sglang`` (SGLang 0.5.23) by make test's
    ``scripts/setup-sglang-env``; missing after that, the test fails (CI must not skip it)."""
    made = subprocess.run(["bash", str(ROOT / "bench" / "setup_verl_env.sh")], capture_output=True)
    if made.returncode != 0 or not SIDE_PYTHON.exists():
        pytest.fail(
            f"the side venvs are missing ({SIDE_PYTHON}: run scripts/setup-sglang-env; "
            f"bench/setup_verl_env.sh exited {made.returncode}: {made.stderr[-1000:]!r})",
            pytrace=False,
        )


def verl(url: str, model: Path, input_ids: list[int], calls: list[dict]) -> list[dict]:
    spec = {"url": url, "model_path": str(model), "input_ids": input_ids, "calls": calls}
    out = json.loads(run_process([str(SIDE_PYTHON), str(SIDE)], json.dumps(spec), 600))
    assert out["verl"] == "0.9.1"
    return out["results"]


async def test_verl_sglang_client_drives_agentrl_serve(
    side_venvs, serve_url, model_dir, tokenizer, chat_prompt
):
    async with SGLangEngine(serve_url) as ours:
        greedy = await ours.generate(
            chat_prompt, SamplingParams(temperature=0.0, max_new_tokens=200)
        )
        assert greedy.finish_reason == "stop" and greedy.token_ids[-1] == tokenizer.eos_token_id
        # penalties, and end-of-sequence blocked past where the plain reply ended
        length = len(greedy.token_ids)
        penalties = {"repetition_penalty": 1.3, "frequency_penalty": 0.2}
        lengths = {"max_new_tokens": length + 6, "min_new_tokens": length + 2}
        penalized = await ours.generate(
            chat_prompt, SamplingParams(temperature=0.0, **penalties, **lengths)
        )
    words = tokenizer.decode(greedy.token_ids, skip_special_tokens=True).split()
    stop = f" {words[len(words) // 2]}"  # a word in the middle of the greedy reply
    calls = [
        {"op": "generate", "sampling_params": {**VERL_ROLLOUT, "max_new_tokens": 8}},
        {"op": "generate", "sampling_params": {**VERL_GREEDY, "max_new_tokens": 200}},
        {
            "op": "generate",
            "sampling_params": {
                **VERL_GREEDY,
                "max_new_tokens": 200,
                "skip_special_tokens": False,
                "no_stop_trim": True,
            },
        },
        {
            "op": "generate",
            "sampling_params": {**VERL_GREEDY, "max_new_tokens": 200, "stop": [stop]},
        },
        {"op": "generate", "sampling_params": {**VERL_GREEDY, **penalties, **lengths}},
        {"op": "get", "endpoint": "v1/loads"},
        {"op": "get", "endpoint": "get_weight_version"},
        {"op": "get", "endpoint": "model_info"},
        {"op": "available_models"},
        {"op": "flush_cache"},
        {"op": "abort_all"},
        {"op": "begin_weight_update"},
        {"op": "end_weight_update"},
    ]
    sampled, greedy_verl, special, stopped, penalty, loads, version, info, models, *control = verl(
        serve_url, model_dir, chat_prompt, calls
    )
    # a rollout sample: ids, log-probs for each, and the text of the ids
    body = sampled["response"]
    assert sampled["ok"] and 1 <= len(body["output_ids"]) <= 8
    assert [pair[1] for pair in body["meta_info"]["output_token_logprobs"]] == body["output_ids"]
    ids = body["output_ids"]
    trimmed = ids[:-1] if body["meta_info"]["finish_reason"]["type"] == "stop" else ids
    assert body["text"] == tokenizer.decode(trimmed, skip_special_tokens=True)
    # greedy: the same tokens as agentrl's own client; the stop token is not in the text
    body = greedy_verl["response"]
    assert body["output_ids"] == greedy.token_ids
    assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": tokenizer.eos_token_id}
    assert body["text"] == tokenizer.decode(greedy.token_ids[:-1], skip_special_tokens=True)
    # skip_special_tokens=False and no_stop_trim keep the stop token, as text
    assert special["response"]["text"] == tokenizer.decode(greedy.token_ids)
    assert special["response"]["text"].endswith(tokenizer.eos_token)
    # a stop string: the text ends before it, the ids run to the token that completed it
    body = stopped["response"]
    assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert stop not in body["text"] and tokenizer.decode(body["output_ids"]).startswith(
        body["text"]
    )
    assert body["output_ids"] == greedy.token_ids[: len(body["output_ids"])]
    # penalties and min_new_tokens honoured: verl's body gives the tokens agentrl's own client
    # (which sends the same keys) gets, and no end-of-sequence before min_new_tokens
    body = penalty["response"]
    assert penalty["ok"] and body["output_ids"] == penalized.token_ids
    assert len(body["output_ids"]) >= length + 2
    assert tokenizer.eos_token_id not in body["output_ids"][: length + 2]
    # the read-only routes
    (load,) = loads["response"]["loads"]
    assert (
        load["dp_rank"] == 0 and load["num_running_reqs"] == 0 and load["max_running_requests"] > 0
    )
    assert (
        version["response"]
        == {"weight_version": "0"}
        == {"weight_version": info["response"]["weight_version"]}
    )
    assert models["ok"] and models["response"]["data"]
    flushed, aborted, begun, ended = control
    assert flushed["ok"] and aborted == {"op": "abort_all", "ok": True, "response": {}}
    assert begun["response"]["success"] and ended["response"]["success"]


async def test_verl_weight_sync_by_reference_loads_into_agentrl_serve(
    side_venvs, serve_url, model_dir, smollm2
):
    """verl's weight sync as it calls SGLang's (``sglang.srt.weight_sync.utils.update_weights``
    over verl's adapter: nested per-tensor dumps in shared memory) and slime's flattened bucket
    (SGLang's ``FlattenedTensorBucket``) load into `agentrl serve` (tensor_refs)."""
    names = ["model.norm.weight", "model.layers.0.self_attn.q_proj.weight"]
    state = smollm2.state_dict()

    def read_back() -> list[dict]:
        return [
            {
                "op": "post",
                "endpoint": "get_weights_by_name",
                "payload": {"name": n, "truncate_size": 2},
            }
            for n in names
        ]

    calls = [
        {"op": "begin_weight_update"},
        {"op": "update_weights", "names": names, "scale": 0.5},
        *read_back(),
        {"op": "update_weights", "names": names, "scale": 1.0, "load_format": "flattened_bucket"},
        *read_back(),
        {"op": "end_weight_update"},
    ]
    begun, halved, *rest = verl(serve_url, model_dir, [1], calls)
    halved_weights, restored, restored_weights, ended = rest[:2], rest[2], rest[3:5], rest[5]
    assert begun["ok"] and ended["ok"] and ended["response"]["success"]
    assert halved["ok"] and halved["response"]["success"], halved
    assert restored["ok"] and restored["response"]["success"], restored
    for scale, answers in ((0.5, halved_weights), (1.0, restored_weights)):
        for name, answer in zip(names, answers, strict=True):
            expected = (state[name] * scale)[:2]
            assert torch.equal(torch.tensor(answer["response"]), expected), (name, scale)
