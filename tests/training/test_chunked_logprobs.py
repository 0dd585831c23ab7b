"""Chunked log-probs and entropy: the unchunked numbers, values and gradients, in O(chunk x V).

The property test draws chunk sizes (1, non-divisors, larger than the token count), token counts,
temperatures (greedy's ``T = 0`` scored at 1), vocabulary and hidden sizes, with and without a
bias and the entropy, on random float64 tensors: log-probs, entropy and the gradients with respect
to the hidden states, the head's weight and bias equal autograd of the unchunked formulas
(`temperature_logprobs`' and `entropy_from_logits`', kept in float64) to 1e-6. A tiny random Llama
(tied embeddings) checks the packed forward the trainer runs, every parameter's gradient included.
What is saved for the backward is checked to hold no (tokens x V) tensor, with the unchunked path
as the negative control. The slow test takes one real training step of SmolLM2 through the FSDP2
actor (RL objective with a KL to a reference, and SFT's loss) with the knob on and off: loss and
gradients agree within ``FACTOR`` times the float32 error of the same step against float64
(tests/float_tolerance.py), and the chunked step in float64 is the unchunked formulas' in float64.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from float_tolerance import assert_within, float32_tolerance, spacing, tolerance
from hypothesis import given, settings
from hypothesis import strategies as st
from model_cuts import first_layers
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from agentrl.rl.config import AlgorithmConfig
from agentrl.rl.objective import Objective
from agentrl.sft.trainer import nll_loss
from agentrl.training import packing
from agentrl.training.actor import Actor, ActorConfig
from agentrl.training.chunked_logprobs import chunked_token_scores, output_head
from agentrl.training.distributed import distributed
from agentrl.training.logprobs import token_logprobs
from agentrl.training.packing import PackedMicroBatch, pack, packed_scores

ATOL = 1e-6  # the bound for float64; the observed gaps are ~1e-15


def unchunked(
    hidden: torch.Tensor, head: nn.Linear, targets: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Today's formulas on the whole ``(N, V)`` logits ``head(hidden)`` (`unchunked_logits`)."""
    return unchunked_logits(head(hidden), targets, temperature)


def unchunked_logits(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`temperature_logprobs`' and `entropy_from_logits`' formulas in the logits' dtype (float64
    here, where those two compute in float32): ``log_softmax(z / T)[y]`` and ``-sum p log p``,
    ``T = 1`` for greedy."""
    scaled = logits / (temperature if temperature > 0 else 1.0)  # (N, V)
    picked = scaled.gather(-1, targets[:, None])[:, 0] - torch.logsumexp(scaled, -1)
    log_p = torch.log_softmax(scaled, -1)
    return picked, -(log_p.exp() * log_p).sum(-1)


def gradients(
    run: Callable[[], tuple[torch.Tensor, torch.Tensor | None]],
    leaves: list[torch.Tensor],
    weights: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor]]:
    """Values of ``run()`` and the gradients of ``sum(w_lp * logprobs + w_H * entropy)``."""
    for leaf in leaves:
        leaf.grad = None
    logprobs, entropy = run()
    loss = (weights[0] * logprobs).sum()
    if entropy is not None:
        loss = loss + (weights[1] * entropy).sum()
    loss.backward()
    return logprobs.detach(), entropy, [leaf.grad.clone() for leaf in leaves]


@settings(deadline=None, max_examples=150)
@given(
    tokens=st.integers(1, 33),
    chunk=st.one_of(st.just(1), st.integers(1, 48)),
    temperature=st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.2, 3.0)),
    vocab=st.integers(2, 97),
    width=st.integers(1, 12),
    scale=st.floats(0.1, 10.0),
    bias=st.booleans(),
    with_entropy=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_chunked_equals_unchunked_values_and_gradients(
    tokens: int,
    chunk: int,
    temperature: float,
    vocab: int,
    width: int,
    scale: float,
    bias: bool,
    with_entropy: bool,
    seed: int,
) -> None:
    generator = torch.Generator().manual_seed(seed)
    head = nn.Linear(width, vocab, bias=bias).double()
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, width, generator=generator, dtype=torch.float64))
    hidden = scale * torch.randn(tokens, width, generator=generator, dtype=torch.float64)
    hidden.requires_grad_(True)
    targets = torch.randint(0, vocab, (tokens,), generator=generator)
    weights = (
        torch.randn(tokens, generator=generator, dtype=torch.float64),
        torch.randn(tokens, generator=generator, dtype=torch.float64),
    )
    leaves = [hidden, *head.parameters()]

    def chunked() -> tuple[torch.Tensor, torch.Tensor | None]:
        scores = chunked_token_scores(
            hidden, head, targets, temperature, chunk, entropy=with_entropy, argmax=True
        )
        assert (scores.entropy is not None) == with_entropy
        assert torch.equal(scores.argmax, head(hidden).argmax(-1))
        return scores.logprobs, scores.entropy

    def plain() -> tuple[torch.Tensor, torch.Tensor | None]:
        logprobs, entropy = unchunked(hidden, head, targets, temperature)
        return logprobs, entropy if with_entropy else None

    got, got_entropy, got_grads = gradients(chunked, leaves, weights)
    want, want_entropy, want_grads = gradients(plain, leaves, weights)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    if with_entropy:
        torch.testing.assert_close(got_entropy, want_entropy, atol=ATOL, rtol=0)
    for name, a, b in zip(["hidden", "weight", "bias"], got_grads, want_grads, strict=False):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0, msg=lambda m, n=name: f"{n}: {m}")


def test_backward_holds_no_tokens_by_vocabulary_tensor() -> None:
    """Saved for the backward: nothing with ``tokens x V`` elements; the unchunked path saves
    such tensors (the negative control)."""
    tokens, vocab, width = 64, 1000, 8
    head = nn.Linear(width, vocab)
    hidden = torch.randn(tokens, width, requires_grad=True)
    targets = torch.randint(0, vocab, (tokens,))

    def largest_saved(run: Callable[[], Any]) -> int:
        sizes: list[int] = []

        def pack_hook(tensor: torch.Tensor) -> torch.Tensor:
            sizes.append(tensor.numel())
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack_hook, lambda t: t):
            run()
        return max(sizes)

    chunked = largest_saved(
        lambda: chunked_token_scores(hidden, head, targets, 0.7, 16, entropy=True)
    )
    plain = largest_saved(lambda: unchunked(hidden, head, targets, 0.7))
    assert chunked == vocab * width  # the head's weight, by reference
    assert plain >= tokens * vocab


def test_no_tokens_give_empty_scores_and_zero_gradients() -> None:
    head = nn.Linear(4, 7)
    hidden = torch.zeros(0, 4, requires_grad=True)
    scores = chunked_token_scores(hidden, head, torch.zeros(0, dtype=torch.long), 1.0, 8)
    scores.logprobs.sum().backward()
    assert scores.logprobs.shape == (0,) and float(head.weight.grad.abs().sum()) == 0.0


def test_bad_inputs_are_refused_with_what_is_wrong() -> None:
    head = nn.Linear(4, 7)
    hidden, targets = torch.zeros(3, 4), torch.zeros(3, dtype=torch.long)
    with pytest.raises(ValueError, match="chunk_tokens must be at least 1"):
        chunked_token_scores(hidden, head, targets, 1.0, 0)
    with pytest.raises(ValueError, match=r"hidden must be \(N, 4\)"):
        chunked_token_scores(torch.zeros(3, 5), head, targets, 1.0, 2)
    with pytest.raises(ValueError, match="targets must be"):
        chunked_token_scores(hidden, head, targets[:2], 1.0, 2)
    with pytest.raises(ValueError, match=r"nn\.Linear"):
        chunked_token_scores(hidden, nn.Identity(), targets, 1.0, 2)  # type: ignore[arg-type]
    capped = tiny_llama(final_logit_softcapping=30.0)
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        output_head(capped)


def tiny_llama(**overrides: Any) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        **overrides,
    )
    model = LlamaForCausalLM(config).train()
    model.set_attn_implementation("sdpa")
    return model


def packed_batch(vocab: int, lengths: tuple[int, ...] = (9, 5, 12, 7)) -> PackedMicroBatch:
    generator = torch.Generator().manual_seed(3)
    rows = [
        {
            "input_ids": torch.randint(0, vocab, (n,), generator=generator).tolist(),
            "loss_mask": [0, 0, 0, *[1] * (n - 3)],
        }
        for n in lengths
    ]
    (batch,) = pack(rows, sum(lengths))
    return batch


@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 5, 1000])
def test_packed_scores_of_a_tiny_llama_equal_the_unchunked_path(
    temperature: float, chunk: int
) -> None:
    """The trainer's packed forward on a float64 model with tied embeddings. Chunked: log-probs,
    entropy and every parameter's gradient equal the unchunked formulas kept in float64 to 1e-6
    (the outputs are float32, as the unchunked path's are: plus their rounding, one spacing).
    The unchunked path itself takes its log-softmax in float32 (`temperature_logprobs`,
    `entropy_from_logits`), so it agrees within float32 rounding of the values (``tolerance``)."""
    model = tiny_llama().double()
    batch = packed_batch(model.config.vocab_size)
    upstream = torch.linspace(-1, 2, batch.n_tokens)[None]  # (1, T) weights of the log-probs

    def exact() -> tuple[torch.Tensor, torch.Tensor]:
        scored = ((batch.position_ids[0] != 0) & batch.loss_mask[0]).nonzero()[:, 0]
        logits = model(
            input_ids=batch.input_ids,
            position_ids=batch.position_ids,
            use_cache=False,
            logits_to_keep=scored - 1,
        ).logits[0]  # (K, V) float64
        logprobs, entropy = unchunked_logits(logits, batch.input_ids[0, scored], temperature)
        (logprobs * upstream[0, scored]).sum().backward()
        return logprobs.detach(), entropy.detach()

    def packed(chunk_tokens: int | None) -> Any:
        scores = packed_scores(
            model,
            batch,
            temperature,
            loss_tokens_only=True,
            chunk_tokens=chunk_tokens,
            entropy=True,
            argmax=True,
        )
        (scores.logprobs * upstream).sum().backward()
        return scores

    runs: dict[str, Any] = {}
    for name, run in [
        ("exact", exact),
        ("plain", lambda: packed(None)),
        ("chunked", lambda: packed(chunk)),
    ]:
        model.zero_grad()
        runs[name] = (run(), {n: p.grad.clone() for n, p in model.named_parameters()})
    (exact_lp, exact_entropy), exact_grads = runs["exact"]
    chunked, chunked_grads = runs["chunked"]
    plain = runs["plain"][0]
    scored = chunked.scored
    assert torch.equal(scored, plain.scored) and torch.equal(chunked.argmax, plain.argmax)
    for got, want in [
        (chunked.logprobs[0, scored], exact_lp),
        (chunked.entropy[0, scored], exact_entropy),
    ]:
        atol = ATOL + spacing(float(want.abs().max()))
        torch.testing.assert_close(got.double(), want, atol=atol, rtol=0)
    for name, grad in exact_grads.items():
        torch.testing.assert_close(chunked_grads[name], grad, atol=ATOL, rtol=0, msg=name)
    assert chunked.entropy is not None and not chunked.entropy.requires_grad
    for got, want in [(chunked.logprobs, plain.logprobs), (chunked.entropy, plain.entropy)]:
        atol = tolerance(0.0, float(want.detach().abs().max()))  # float32 rounding only
        torch.testing.assert_close(got, want, atol=atol, rtol=0)


def test_token_logprobs_chunked_with_padding_equal_unchunked() -> None:
    model = tiny_llama().double()
    ids = torch.randint(0, 97, (2, 11), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding
    with torch.no_grad():
        plain = token_logprobs(model, ids, 0.0, attention_mask=mask)
        chunked = token_logprobs(model, ids, 0.0, attention_mask=mask, chunk_tokens=3)
    torch.testing.assert_close(chunked, plain, atol=ATOL, rtol=0)


# --- one real step of SmolLM2 through the FSDP2 actor, knob on and off ---------------------------


def smollm2_batches(tokenizer: Any, vocab: int) -> list[PackedMicroBatch]:
    """Two packed micro-batches of chats with assistant loss tokens, engine log-probs and
    advantages (the RL objective's fields; SFT's loss ignores them)."""
    rows = []
    for i, (question, answer) in enumerate(
        [
            ("What is 6 * 7?", "6 * 7 = 42, so the answer is 42."),
            ("Name a colour.", "Blue, the colour of a clear sky."),
            ("What is 2 + 2?", "Two plus two is four."),
            ("Say hello.", "Hello! How can I help you today?"),
        ]
    ):
        chat = [{"role": "user", "content": question}]
        prompt = list(
            tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=False)
        )
        full = list(
            tokenizer.apply_chat_template(
                [*chat, {"role": "assistant", "content": answer}], return_dict=False
            )
        )
        mask = [0] * len(prompt) + [1] * (len(full) - len(prompt))
        rows.append(
            {
                "input_ids": full,
                "loss_mask": mask,
                "logprobs": [-1.0 * m for m in mask],
                "versions": [0] * len(full),
                "advantages": [1.0, -1.0, 0.5, -0.5][i],
            }
        )
    assert max(max(r["input_ids"]) for r in rows) < vocab
    return pack(rows, 2 * max(len(r["input_ids"]) for r in rows))


def rl_loss(chunk_tokens: int | None, reference: nn.Module) -> Callable[..., Any]:
    config = AlgorithmConfig(kl_coef=0.1)
    return Objective(config, temperature=0.7, reference=reference, chunk_tokens=chunk_tokens)


def sft_loss(chunk_tokens: int | None, reference: nn.Module) -> Callable[..., Any]:
    return functools.partial(nll_loss, chunk_tokens=chunk_tokens)


def plain_step(
    model: nn.Module, loss: Callable[..., Any], batches: list[PackedMicroBatch]
) -> tuple[float, dict[str, torch.Tensor]]:
    """The loss (sum / denominator) and gradients of one step without FSDP."""
    model.zero_grad()
    outputs = [loss(model, batch) for batch in batches]
    total = sum(o[0] for o in outputs) / float(sum(o[1] for o in outputs))
    total.backward()
    return float(total.detach()), {n: p.grad.clone() for n, p in model.named_parameters()}


def actor_step(
    model: nn.Module, loss: Callable[..., Any], batches: list[PackedMicroBatch]
) -> tuple[float, dict[str, torch.Tensor]]:
    """The loss and the full gradients the optimizer sees after one FSDP2 actor step."""
    actor = Actor(copy.deepcopy(model), ActorConfig(lr=1e-3, max_grad_norm=None))
    grads: dict[str, torch.Tensor] = {}

    def capture(*_: Any) -> None:
        for name, param in actor.model.named_parameters():
            grads[name] = param.grad.full_tensor().clone()

    actor.optimizer.register_step_pre_hook(capture)
    return actor.train_step(batches, loss)["loss"], grads


@pytest.mark.slow
@pytest.mark.parametrize("make_loss", [rl_loss, sft_loss], ids=["rl-objective", "sft-nll"])
def test_smollm2_step_with_the_knob_on_equals_it_off(
    smollm2: nn.Module, tokenizer: Any, make_loss: Callable[..., Any], monkeypatch: Any
) -> None:
    """One step of SmolLM2 (its first 2 layers: the knob changes the LM head and the loss over
    its whole vocabulary, not the layers below), chunked (7 tokens a chunk: several per
    micro-batch) and not.

    References in float64: ``exact``, the unchunked formulas kept in float64 (which owes nothing
    to the chunked code), and the chunked path run in float64. Tolerance, per parameter:
    ``FACTOR`` x the larger float32 rounding error of the two computations, each against its own
    float64 run (so a mistake in the chunked code, the same in both precisions, does not widen
    it). Both errors are needed: on this CPU's BLAS a chunk of fewer than 8 rows reduces over the
    vocabulary in a less accurate order (about 15x the rounding in the hidden states' gradient;
    the default chunk of 1024 and the near-equal chunk sizes avoid that in training). Checked
    within it: the chunked float64 step against ``exact`` (the chunked numbers are the unchunked
    ones on the real model), and the FSDP2 actor's step with the knob on against off."""
    model = first_layers(copy.deepcopy(smollm2)).train()
    reference = first_layers(copy.deepcopy(smollm2)).eval().requires_grad_(False)
    batches = smollm2_batches(tokenizer, model.config.vocab_size)
    model64, reference64 = copy.deepcopy(model).double(), copy.deepcopy(reference).double()
    chunked64 = plain_step(model64, make_loss(7, reference64), batches)
    with monkeypatch.context() as patch:  # temperature_logprobs rounds to float32 by definition
        patch.setattr(packing, "temperature_logprobs", float64_logprobs)
        exact = plain_step(model64, make_loss(None, reference64), batches)
    del model64, reference64
    plain32 = {
        chunk: plain_step(model, make_loss(chunk, reference), batches) for chunk in (None, 7)
    }
    own64 = {None: exact, 7: chunked64}  # each float32 run against its own computation
    with distributed():
        off = actor_step(model, make_loss(None, reference), batches)
        on = actor_step(model, make_loss(7, reference), batches)
    loss_atol = tolerance(max(abs(plain32[c][0] - own64[c][0]) for c in own64), exact[0])
    assert chunked64[0] == pytest.approx(exact[0], abs=loss_atol)
    assert on[0] == pytest.approx(off[0], abs=loss_atol)
    for name, grad in exact[1].items():
        atol = max(float32_tolerance(plain32[c][1][name], own64[c][1][name]) for c in own64)
        assert_within(chunked64[1][name], grad, atol, f"{name} (float64, chunked vs exact)")
        assert_within(on[1][name], off[1][name], atol, name)
    assert any(float(g.abs().max()) > 0 for g in on[1].values())


def float64_logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, temperature: float
) -> torch.Tensor:
    """``temperature_logprobs``' formula in the logits' dtype (it computes in float32)."""
    return unchunked_logits(logits, token_ids, temperature)[0]
