"""Tolerances for comparing float32 results, derived in the test that compares them (imported as
``float_tolerance``: tests/ is on ``sys.path`` for its conftest.py).

Two float32 evaluations of one quantity (an engine's cached decode and a trainer's full forward,
one process and two, a packed batch and its rows alone) agree only up to rounding, and how much
rounding depends on the CPU: its kernels block, vectorise and thread every reduction in their own
order. A tolerance written down as a number fits the CPU it was tuned on (issue 29). Here it is
measured where it is used instead:

* the *reference error*: how far a float32 computation lies from the same computation in float64
  (exact for this purpose), on this CPU, for the model and inputs at hand (`error`,
  `float32_tolerance`, and `logprob_error` for a model's log-probs);
* float32's *spacing* at the magnitude computed at: a result rounded to float32 moves by up to
  half of it, so no comparison of float32 results can ask for less (`spacing`). For a log-prob,
  ``logit / T - logsumexp``, that magnitude is the larger operand's, however small the log-prob;
* `tolerance` = ``FACTOR`` times the larger of the two.

``FACTOR = 8``: two float32 evaluations each lie within their own error of the exact value, so
within the sum of the two of each other (2x the reference when both errors are alike); the one
not measured is the same operations on the same values in another order: an error of the same
kind, but another draw. Measured on a 2-core AMD EPYC with AVX512-BF16, SmolLM2's engine and
trainer log-probs of 24-token completions against float64: 1.2e-5 and 0.9e-5 (T = 1), 1.8e-5 and
3.3e-5 (T = 0.7), 1.2e-5 and 1.2e-5 (greedy); the remaining 4x covers a larger ratio between the
two, on another CPU or over other tokens. What a tolerance guards against is orders of magnitude
above it: one optimizer step of the tests' tiny policy at lr 1e-3 moves its log-probs by about
2e-2 (tests/rl/test_loop.py measures it), a bfloat16 engine by 1e-3, a temperature applied on
one side only or an off-by-one position by 0.1.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
from transformers import PreTrainedModel

FACTOR = 8.0


def spacing(magnitude: float) -> float:
    """float32's spacing at ``|magnitude|``: the gap from it to the next larger float32."""
    return float(np.spacing(np.float32(abs(magnitude))))


def error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """``max |approx - exact|``, computed in float64 (0 for empty tensors)."""
    if approx.numel() == 0:
        return 0.0
    return float((approx.detach().double() - exact.detach().double()).abs().max())


def tolerance(reference: float, magnitude: float) -> float:
    """``FACTOR * max(reference, spacing(magnitude))``: how far another float32 evaluation may be
    from one whose error is ``reference``, computed at values up to ``|magnitude|``."""
    return FACTOR * max(reference, spacing(magnitude))


def float32_tolerance(float32: torch.Tensor, float64: torch.Tensor) -> float:
    """The tolerance for any float32 evaluation of ``float64``, from the error of ``float32``."""
    magnitude = float(float64.detach().abs().max()) if float64.numel() else 0.0
    return tolerance(error(float32, float64), magnitude)


def assert_within(
    actual: torch.Tensor, expected: torch.Tensor, atol: float, what: str = ""
) -> None:
    """Elementwise ``|actual - expected| <= atol``, compared in float64."""
    torch.testing.assert_close(
        actual.detach().double(),
        expected.detach().double(),
        rtol=0,
        atol=atol,
        msg=lambda m: f"{what} (tolerance {atol:.3g}): {m}",
    )


def logprobs64(
    model64: PreTrainedModel, input_ids: list[int], temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``log_softmax(logits / T)`` of ``input_ids[1:]`` given their prefixes (``T = 1``
    for greedy), from a float64 copy of a model: the exact values float32 log-probs round. And
    per position the magnitude a float32 evaluation computes them at: the larger of the largest
    ``|logit / T|`` and ``|logsumexp|``."""
    ids = torch.tensor([input_ids])
    with torch.no_grad():
        logits = model64(input_ids=ids, use_cache=False).logits[0, :-1].double()
    scaled = logits / (temperature if temperature > 0 else 1.0)
    lse = torch.logsumexp(scaled, -1)
    magnitude = torch.maximum(scaled.abs().amax(-1), lse.abs())
    return scaled.gather(-1, ids[0, 1:, None])[:, 0] - lse, magnitude


def logprob_error(
    model: PreTrainedModel,
    input_ids: list[int],
    temperature: float = 1.0,
    loss_mask: list[int] | None = None,
) -> tuple[float, float, float]:
    """How far ``model``'s float32 log-probs (`agentrl.training.logprobs.token_logprobs`) of
    ``input_ids[1:]`` (those where ``loss_mask`` is 1, if given) are from float64 ones on this
    CPU: ``(max, mean, magnitude)``, the magnitude as `logprobs64` gives it. Makes a float64
    copy of the model (small models; `logprob_error_with` takes one made already)."""
    model64 = copy.deepcopy(model).double()
    return logprob_error_with(model, model64, input_ids, temperature, loss_mask)


def logprob_error_with(
    model: PreTrainedModel,
    model64: PreTrainedModel,
    input_ids: list[int],
    temperature: float = 1.0,
    loss_mask: list[int] | None = None,
) -> tuple[float, float, float]:
    """`logprob_error` with the float64 copy given."""
    from agentrl.training.logprobs import token_logprobs

    with torch.no_grad():
        got = token_logprobs(model, torch.tensor([input_ids]), temperature)[0].double()
    exact, magnitude = logprobs64(model64, input_ids, temperature)
    diff = (got - exact).abs()
    if loss_mask is not None:
        on = torch.tensor(loss_mask[1:]).bool()
        diff, magnitude = diff[on], magnitude[on]
    return float(diff.max()), float(diff.mean()), float(magnitude.max())


def logprob_ceiling(vocab_size: int, max_abs_logit: float) -> float:
    """An upper bound on the magnitude a log-prob at ``T = 1`` is computed at when every logit
    lies within ``max_abs_logit`` of 0: ``log(V) + max_abs_logit`` bounds ``|logsumexp|``, and
    ``log(V) + 2 * max_abs_logit`` (returned) the log-prob's ``|logit - logsumexp|``."""
    return math.log(vocab_size) + 2 * max_abs_logit
