"""The critic of PPO with GAE (``algorithm.advantage=gae``): a value model, its advantages, its loss.

The value model is a Hugging Face token-classification model with one label
(``AutoModelForTokenClassification``, e.g. ``LlamaForTokenClassification``: the decoder and a
``score`` head ``hidden -> 1``), as verl's and TRL's critics are. It starts from the policy's
weights (the same backbone, a zero head, so every first value is 0) or from ``critic.path``, and is
sharded and optimised by its own :class:`~agentrl.training.actor.Actor` (FSDP2, AdamW, LR schedule;
the ``critic`` section takes the ``actor`` section's keys).

Values are aligned with log-probs: :func:`packed_values` gives entry ``t`` the value of the state
*before* token ``t`` (the head at position ``t - 1``), the state in which the policy chose token
``t``; the first token of each sequence gets 0.

One trainer step (:func:`agentrl.rl.loop.train_on_batch` with a :class:`Critic`):

1. :meth:`Critic.prepare`: the current critic's values at every token of every micro-batch (no
   grad); each trajectory's reward on its last loss token (``token_rewards``, placed by
   :func:`~agentrl.rl.batch.build_batch`); advantages and returns by the chunked GAE
   (:func:`~agentrl.algorithms.gae.gae`), which steps over the loss tokens only, so the prompt, tool
   results and every other environment token of a multi-turn trajectory are skipped, neither
   discounted nor valued; then the advantages are whitened over every loss token of the batch on
   every rank (mean and Bessel-corrected variance, as verl's ``masked_whiten``). They replace the
   micro-batches' ``advantages``; ``values`` (the old values) and ``returns`` are stored beside them.
2. Each PPO update of the policy (every mini-batch of every epoch) is followed by one of the
   critic on the same micro-batches (:meth:`Critic.update`): PPO's clipped value loss
   (:func:`~agentrl.algorithms.losses.value_loss`, token-mean) against ``returns``, clipped around
   the old values.

Metrics: ``critic/loss``, ``critic/grad_norm``, ``critic/lr``, ``critic/clip_fraction``,
``critic/values_mean`` (the updates'), and from step 1 ``critic/old_values_mean``,
``critic/returns_mean``, ``critic/explained_variance`` (``1 - Var(R - V) / Var(R)`` over loss
tokens: how much of the returns the critic explains) and ``advantage/mean``,
``advantage/abs_mean`` (before whitening).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from pydantic import Field
from torch import nn
from transformers import AutoConfig, AutoModelForTokenClassification, PreTrainedModel

from agentrl.algorithms.gae import gae
from agentrl.algorithms.losses import loss_denominator, value_loss
from agentrl.models import resolve_model
from agentrl.training.actor import Actor, ActorConfig
from agentrl.training.distributed import all_reduce_sum
from agentrl.training.packing import PACKED_ATTENTION, PackedMicroBatch

# The value head's output is a view (a linear layer over a 3-D input); nothing here changes it in
# place, which is all FSDP2 warns about at every forward.
warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(FSDP\w+ForTokenClassification\)")

TOKEN_REWARDS = "token_rewards"
"""The micro-batch field of per-token rewards (a trajectory's reward on its last loss token)."""
VALUES, RETURNS, ADVANTAGES = "values", "returns", "advantages"
WHITEN_EPS = 1e-8


class CriticConfig(ActorConfig):
    """The critic of ``algorithm.advantage=gae``: its model, value clip, and optimiser (the
    ``actor`` section's keys, applied to the value model)."""

    path: str | None = None
    """Where the value model comes from: ``null`` starts from the policy's weights with a zero
    value head; a Hugging Face directory (a critic saved by an earlier run's ``hf_critic/``, or a
    causal LM, whose head then starts at zero) or ``smollm2``."""
    lr: float = Field(1e-5, gt=0)
    """Peak learning rate of the critic's AdamW (verl's default for critics)."""
    value_clip: float | None = Field(0.5, gt=0)
    """PPO's value clip: an update may move a prediction at most this far from its value when
    the advantages were computed, to lower its loss (verl's ``cliprange_value``); ``null``: the
    plain squared error."""


def value_model_config(config: object, attn_implementation: str | None = None) -> object:
    """A copy of a causal LM's ``config`` for a one-label token-classification model, without
    dropout on the head (transformers would default it to 0.1, noise in a regression)."""
    config = copy.deepcopy(config)
    config.num_labels = 1  # type: ignore[attr-defined]
    config.classifier_dropout = 0.0  # type: ignore[attr-defined]
    if attn_implementation is not None:
        config._attn_implementation = attn_implementation  # type: ignore[attr-defined]
    return config


def value_model_from_policy(
    policy: PreTrainedModel, attn_implementation: str | None = None
) -> PreTrainedModel:
    """A value model over a copy of ``policy``'s backbone weights, its head zero (float32)."""
    config = value_model_config(
        policy.config, attn_implementation or policy.config._attn_implementation
    )
    model = AutoModelForTokenClassification.from_config(config, dtype=torch.float32)
    model.base_model.load_state_dict(policy.base_model.state_dict())
    _zero_head(model)
    return model


def load_value_model(path: str | Path, attn_implementation: str | None = None) -> PreTrainedModel:
    """Load a value model (float32) from a directory, a ``.gguf`` or ``smollm2``; a head the files
    do not hold (a causal LM's) starts at zero."""
    source = resolve_model(path)
    kwargs = source.from_pretrained_kwargs()
    config = value_model_config(
        AutoConfig.from_pretrained(str(source.directory), **kwargs), attn_implementation
    )
    model, info = AutoModelForTokenClassification.from_pretrained(
        str(source.directory),
        config=config,
        dtype=torch.float32,
        output_loading_info=True,
        **kwargs,
    )
    if any(name.startswith("score.") for name in info["missing_keys"]):
        _zero_head(model)
    return model


def _zero_head(model: PreTrainedModel) -> None:
    head = getattr(model, "score", None)  # the token-classification head
    if not isinstance(head, nn.Linear):
        raise ValueError(f"{type(model).__name__} has no linear value head to initialise")
    with torch.no_grad():
        head.weight.zero_()
        if head.bias is not None:
            head.bias.zero_()


def packed_values(model: nn.Module, batch: PackedMicroBatch) -> torch.Tensor:
    """Values ``(1, T)`` float32 from one packed forward of a value model: entry ``t`` is the
    head's output at position ``t - 1`` of its own sequence (the state token ``t`` was chosen
    in), 0 at each sequence's first token. Differentiable; runs the model as the caller left it."""
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if implementation not in PACKED_ATTENTION:
        raise ValueError(
            f"attention implementation {implementation!r} is not known to keep packed sequences "
            f"apart; use one of {sorted(PACKED_ATTENTION)}"
        )
    out = model(
        input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False
    ).logits  # (1, T, 1)
    head = out[..., 0].float()  # (1, T)
    shifted = torch.cat([head.new_zeros(1, 1), head[:, :-1]], dim=1)  # (1, T)
    return torch.where(batch.position_ids != 0, shifted, 0.0)


def from_rows(batch: PackedMicroBatch, rows: torch.Tensor) -> torch.Tensor:
    """The inverse of :meth:`PackedMicroBatch.as_rows` for ``(S, L)`` rows: ``(1, T)``."""
    parts = [rows[i, :length] for i, length in enumerate(batch.seq_lens)]
    return torch.cat(parts)[None]


def whitening(values: Sequence[torch.Tensor], masks: Sequence[torch.Tensor]) -> tuple[float, float]:
    """``(mean, 1 / sqrt(var + 1e-8))`` of ``values`` over every position where its mask is
    nonzero, in every pair of the lists and on every rank (a collective), with the
    Bessel-corrected variance: ``(x - mean) * scale`` is verl's ``masked_whiten``. Lists of
    tensors of any (matching) shapes; values off the masks must be 0. Without a process group,
    over this process's lists."""
    zero = torch.zeros((), dtype=torch.float64)
    sums = [
        sum((m.double().sum().cpu() for m in masks), zero),
        sum((v.double().sum().cpu() for v in values), zero),
        sum((v.double().square().sum().cpu() for v in values), zero),
    ]
    stacked = torch.stack(sums)
    if dist.is_initialized():  # else one process without a group: its sums are the totals
        stacked = all_reduce_sum(stacked)
    n, total, squares = stacked.tolist()
    mean = total / n if n else 0.0
    variance = (squares - n * mean**2) / (n - 1) if n > 1 else 0.0
    return mean, 1.0 / math.sqrt(max(variance, 0.0) + WHITEN_EPS)


class ValueObjective:
    """``loss_fn(model, micro_batch)`` of the critic's :meth:`Actor.train_step`: the clipped
    value loss over the loss tokens, token-mean, and its metric sums (token-weighted, with a
    ``tokens`` count, as :class:`~agentrl.rl.objective.Objective` reports)."""

    def __init__(self, value_clip: float | None) -> None:
        self.value_clip = value_clip

    def __call__(
        self, model: nn.Module, batch: PackedMicroBatch
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        rows = batch.as_rows
        values = rows(packed_values(model, batch))  # (S, L)
        mask = rows(batch.loss_mask.float())
        old = rows(batch.fields[VALUES].float())
        returns = rows(batch.fields[RETURNS].float())
        loss, metrics = value_loss(
            values, old, returns, mask, clip=self.value_clip, agg="token-mean", denominator=1
        )
        tokens = mask.sum()
        sums = {f"critic/{name}": value * tokens for name, value in metrics.items()}
        return loss, loss_denominator(mask, "token-mean"), {**sums, "tokens": tokens}


@dataclasses.dataclass
class Critic:
    """The value model's :class:`Actor` and what PPO with GAE needs of it (see the module doc)."""

    actor: Actor
    gamma: float
    lam: float
    value_clip: float | None = 0.5

    def __post_init__(self) -> None:
        self.objective = ValueObjective(self.value_clip)

    def prepare(
        self, parts: Sequence[Sequence[PackedMicroBatch]]
    ) -> tuple[list[list[PackedMicroBatch]], dict[str, float]]:
        """Micro-batches with GAE ``advantages`` (whitened), old ``values`` and ``returns``, and
        the metrics of step 1 of the module doc. A collective: every rank calls it with the same
        number of micro-batches per part (one critic forward each)."""
        model = self.actor.model
        computed = []
        with torch.no_grad():
            for part in parts:
                for batch in part:
                    values = packed_values(model, batch)  # (1, T)
                    rows = batch.as_rows
                    mask = rows(batch.loss_mask.double())  # (S, L)
                    v = rows(values.double())
                    rewards = rows(batch.fields[TOKEN_REWARDS].double())
                    advantages, returns = gae(
                        rewards, v, mask, gamma=self.gamma, lam=self.lam
                    )  # (S, L) float64, 0 off the mask
                    computed.append((batch, values, advantages, returns, v, mask))
        advantages_rows = [a for _, _, a, *_ in computed]
        masks = [m for *_, m in computed]
        errors = [(r - v) * m for _, _, _, r, v, m in computed]  # (S, L) each: R - V
        mean, scale = whitening(advantages_rows, masks)
        zero = torch.zeros((), dtype=torch.float64, device=self.actor.device)
        stats = torch.stack(
            [
                sum((m.sum() for m in masks), zero),
                sum((a.abs().sum() for a in advantages_rows), zero),
                sum((r.sum() for _, _, _, r, _, _ in computed), zero),
                sum((r.square().sum() for _, _, _, r, _, _ in computed), zero),
                sum((e.sum() for e in errors), zero),
                sum((e.square().sum() for e in errors), zero),
                sum(((v * m).sum() for _, _, _, _, v, m in computed), zero),
            ]
        )
        n, a_abs, r_sum, r_sq, e_sum, e_sq, v_sum = all_reduce_sum(stats).tolist()
        prepared: list[list[PackedMicroBatch]] = []
        index = 0
        for part in parts:
            out = []
            for _ in part:
                batch, values, advantages, returns, _, mask = computed[index]
                index += 1
                whitened = (advantages - mean) * scale * mask
                fields = {
                    **batch.fields,
                    ADVANTAGES: from_rows(batch, whitened).float(),
                    VALUES: values,
                    RETURNS: from_rows(batch, returns).float(),
                }
                out.append(dataclasses.replace(batch, fields=fields))
            prepared.append(out)
        r_var = r_sq / n - (r_sum / n) ** 2 if n else 0.0
        e_var = e_sq / n - (e_sum / n) ** 2 if n else 0.0
        metrics = {
            "advantage/mean": mean,
            "advantage/abs_mean": a_abs / n if n else 0.0,
            "critic/old_values_mean": v_sum / n if n else 0.0,
            "critic/returns_mean": r_sum / n if n else 0.0,
            "critic/explained_variance": 1.0 - e_var / r_var if r_var > 0 else math.nan,
        }
        return prepared, metrics

    def update(
        self, micro_batches: Sequence[PackedMicroBatch], *, end_step: bool
    ) -> dict[str, float]:
        """One optimizer step of the critic on ``micro_batches`` (prepared); its metrics."""
        reported = self.actor.train_step(micro_batches, self.objective, end_step=end_step)
        return critic_report(reported)


def critic_report(reported: Mapping[str, float]) -> dict[str, float]:
    """:meth:`Actor.train_step`'s report of a critic step as ``critic/*`` metrics (token means)."""
    tokens = reported.get("tokens", 0.0)
    out = {
        "critic/loss": reported["loss"],
        "critic/grad_norm": reported["grad_norm"],
        "critic/lr": reported["lr"],
    }
    for name, value in reported.items():
        if name.startswith("critic/"):
            out[name] = value / tokens if tokens else 0.0
    return out
