"""The actor: a Hugging Face causal LM sharded with FSDP2, its optimizer, and one training step.

Sharding. Every decoder layer (the classes the model lists in ``_no_split_modules``, e.g.
``LlamaDecoderLayer``) and then the root get ``fully_shard`` over a 1-D data-parallel mesh, so
each rank holds ``1 / world_size`` of every parameter as a ``DTensor`` and all-gathers one layer
at a time. Parameter names do not change (``model.layers.0.mlp.up_proj.weight``), nor does the
model's dtype: the loaded dtype is the optimizer's master copy, so load float32. With mixed
precision (``"bf16"``, the ``"auto"`` choice on GPUs) layers compute in bfloat16 and gradients are
reduced in float32. Activation checkpointing recomputes each decoder layer in the backward pass.

The step. ``train_step(micro_batches, loss_fn)`` accumulates gradients over this rank's
micro-batches and takes one optimizer step. A trainer step may take several (PPO mini-batches
and epochs): all but its last pass ``end_step=False``, so :attr:`Actor.step` (the trainer step,
the weight version) and the LR schedule advance once per trainer step. ``loss_fn(model, micro_batch)`` returns
``(loss_sum, denominator, metrics)``: a scalar that *sums* over the micro-batch's units (tokens,
sequences), how many units it covers, and extra sums to report. The step minimises
``sum(loss_sum over all micro-batches of all ranks) / D`` with ``D`` the ``global_denominator``
when given, else the sum of every ``denominator`` over all ranks. So the gradient depends on the
global batch only, not on how it is split into ranks and micro-batches: one process and two
processes give the same update, up to float rounding (tested).

Requirements (FSDP2 runs collectives inside forward and backward; breaking these hangs or fails):
every rank calls ``train_step`` with the same number of micro-batches (checked: a mismatch raises
``ValueError`` on every rank instead of hanging), and its ``loss_fn`` runs the model as many times
as on the other ranks and returns the same metric names. Callers balance micro-batches across
ranks (pad with a micro-batch whose loss and denominator are 0 if needed). An exception in ``loss_fn`` on one rank leaves the others
waiting in a collective; the launcher's timeout ends them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Literal, Self, TypeVar

import torch
import torch.distributed as dist
from pydantic import Field, model_validator
from torch import nn
from torch.distributed._composable import checkpoint
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor
from transformers import PreTrainedModel

from agentrl.config import Config
from agentrl.malloc import trim_heap
from agentrl.training.attention import use_trainer_attention
from agentrl.training.distributed import (
    DistInfo,
    all_reduce_sum,
    current_dist_info,
    group_backends,
)
from agentrl.training.distributed import data_parallel_mesh as make_mesh
from agentrl.training.fp8_training import (
    TOKEN_MULTIPLE,
    FP8Recipe,
    after_optimizer_step,
    convert_to_fp8_training,
)
from agentrl.training.optim import LRSchedule, build_adamw, build_lr_scheduler
from agentrl.training.packing import PackedMicroBatch, SequenceLike, pack_for_rank
from agentrl.training.sequence_parallel import SequenceParallel, sequence_parallel_layout

B = TypeVar("B")
Scalar = torch.Tensor | float
LossFn = Callable[[nn.Module, B], tuple[torch.Tensor, Scalar, Mapping[str, Scalar]]]
"""``loss_fn(model, micro_batch) -> (loss_sum, denominator, metric_sums)``; see the module doc."""
RESERVED_METRICS = frozenset({"loss", "denominator", "grad_norm", "lr", "micro_batches"})


class ActorConfig(Config):
    """Optimisation and sharding settings of :class:`Actor`."""

    lr: float = Field(1e-6, gt=0)
    """Peak learning rate of AdamW."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW's moment decay rates."""
    eps: float = Field(1e-8, gt=0)
    """AdamW's denominator epsilon."""
    weight_decay: float = Field(0.0, ge=0)
    """Decoupled weight decay, applied to matrices only (not to norm scales or biases)."""
    warmup_steps: int = Field(0, ge=0)
    """Trainer steps of linear warmup (the LR schedule counts trainer steps, not the optimizer
    steps of ``algorithm.mini_batches`` and ``algorithm.epochs``): step ``s < warmup_steps`` uses
    ``lr * (s + 1) / warmup_steps``."""
    lr_schedule: LRSchedule = "constant"
    """After warmup: ``"constant"``, or ``"cosine"`` / ``"linear"`` decay to ``min_lr_ratio * lr``."""
    total_steps: int | None = Field(None, gt=0)
    """Step at which a decaying schedule reaches its floor; required by ``"cosine"`` and ``"linear"``."""
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    """Floor of a decaying schedule, as a fraction of ``lr``."""
    max_grad_norm: float | None = Field(1.0, gt=0)
    """Clip the global gradient L2 norm to this value; ``None`` reports the norm without clipping."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward: less memory, about 1/3 more compute."""
    trim_heap: bool = True
    """Before each micro-batch and the optimizer step, hand the heap's free pages back to the
    system (`agentrl.malloc.trim_heap`, glibc only): freed activations, logits and gradients stop
    counting in the resident set (the demo's GRPO peak: 4.46 -> 3.93 GB), at the price of page
    faults when the next micro-batch allocates again (not measurable in the demo's step time,
    docs/performance.md). ``false``: glibc keeps them for reuse."""
    logprob_chunk_tokens: int | None = Field(1024, ge=0)
    """Log-probs and entropy from the final hidden states, this many tokens at a time
    (`agentrl.training.chunked_logprobs`): the LM head, temperature, log-sum-exp, picked token and
    entropy per chunk, each chunk's logits freed and recomputed in the backward, so a
    micro-batch's (tokens x vocabulary) logits never exist at once: memory ``O(chunk x V)``
    instead of several ``O(tokens x V)`` float32 copies (4,096 tokens x 49,152 x 4 bytes is
    0.8 GB each). Costs the LM head's forward once more in the backward (SmolLM2: about 7% of a
    step's FLOPs). The same numbers to rounding. ``0`` or ``null``: all at once (the unchunked
    path; needed for models whose logits are not ``lm_head(hidden)``, e.g. Gemma 2's
    soft-capping, which the chunked path refuses). Applies to the policy's loss (RL and SFT),
    the reference model's KL and the old log-probs; the critic's value head has no vocabulary."""
    sequence_parallel: int = Field(1, ge=1)
    """Ranks that share one packed micro-batch (`agentrl.training.sequence_parallel`): groups of
    this many consecutive ranks hold the same micro-batches of up to ``P x`` the per-rank token
    budget (``trainer.micro_batch_tokens``), each rank running the model on ``1 / P`` of every
    one of them and all-gathering the keys and values in each attention layer. Must divide the
    number of ranks; data parallelism is over the ``world / P`` groups. Costs: a collective per
    layer (forward and backward), the whole sequence's keys and values per rank, and a dense
    ``(T / P) x T`` attention mask; attention runs as torch sdpa. Only losses that sum over
    tokens split this way: the RL config refuses sequence-level aggregations, ratios and a
    critic with it. 1: off."""
    mixed_precision: Literal["auto", "bf16", "fp32"] = "auto"
    """``"bf16"``: bfloat16 compute, float32 master weights and gradient reduction; ``"fp32"``: float32
    throughout; ``"auto"``: ``"bf16"`` on CUDA, ``"fp32"`` on CPU."""
    offload: Literal["off", "cpu"] = "off"
    """``"cpu"``: the sharded parameters, their gradients and AdamW's state live in CPU memory
    (pinned) and the optimizer step runs on the CPU (FSDP2's ``CPUOffloadPolicy``); each layer's
    parameters are copied to the GPU for its forward and backward. GPU memory falls by about 16
    bytes per parameter (float32 weights, gradients and both moments) divided by the ranks, at
    the price of a host-device copy of every layer's weights and gradients each micro-batch and
    an optimizer step at CPU speed. The process group gets gloo for CPU tensors beside nccl
    (``cuda:nccl,cpu:gloo``). CUDA only: on the CPU everything is in CPU memory already."""
    reshard_after_forward: bool = True
    """Free each layer's gathered parameters after its forward (gather again in backward); ``False``
    keeps them, trading memory for one all-gather per layer less."""
    fp8: FP8Recipe = "off"
    """FP8 training (`agentrl.training.fp8_training`): torchao converts the linear layers chosen by
    ``fp8_exclude`` and ``fp8_min_features`` to float8 matmuls with dynamic scales per tensor
    (``tensorwise``: weights all-gathered in float8) or per row (``rowwise``: all-gathered in
    bf16). Needs torchao (``pip install 'agentrl[gpu]'``) and a CUDA GPU of compute capability
    8.9+ (H100, H200, L4, L40), unless ``fp8_emulate``."""
    fp8_emulate: bool = False
    """With ``fp8``: torchao's emulation (the float8 casts and scales, matmuls in high precision)
    instead of FP8 kernels; runs on any device, with no speed-up: for tests and debugging."""
    fp8_exclude: list[str] = Field(default_factory=lambda: ["lm_head"])
    """With ``fp8``: regular expressions; a linear layer whose module name matches one stays in
    bf16 (default: the LM head, whose logits make the log-probs). Embeddings are never converted."""
    fp8_min_features: int = Field(1024, ge=16)
    """With ``fp8``: a linear layer with fewer input or output features stays in bf16 (small
    matmuls gain less from FP8 than its casts cost); sizes must also be multiples of 16."""

    @model_validator(mode="after")
    def _check_fp8(self) -> Self:
        # a key away from its default (a dumped config.yaml sets every key to its value)
        fields = type(self).model_fields
        stray = [
            f"actor.{name}"
            for name in ("fp8_emulate", "fp8_exclude", "fp8_min_features")
            if getattr(self, name) != fields[name].get_default(call_default_factory=True)
        ]
        if self.fp8 == "off" and stray:
            raise ValueError(f"{' and '.join(stray)} set with actor.fp8=off")
        for pattern in self.fp8_exclude:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(
                    f"actor.fp8_exclude: {pattern!r} is no regular expression: {exc}"
                ) from None
        return self

    @model_validator(mode="after")
    def _check_schedule(self) -> Self:
        if self.lr_schedule != "constant" and (
            self.total_steps is None or self.total_steps <= self.warmup_steps
        ):
            raise ValueError(
                f"lr_schedule {self.lr_schedule!r} needs total_steps > warmup_steps "
                f"({self.warmup_steps}), got total_steps={self.total_steps}"
            )
        return self


def check_micro_batch_budget(
    micro_batch_tokens: int, sequence_parallel: int, longest: int, longest_key: str, unit: str
) -> None:
    """Raise ``ValueError`` unless a micro-batch (``trainer.micro_batch_tokens`` per rank, times
    the ``sequence_parallel`` ranks that share it) holds the longest ``unit`` (``longest`` tokens,
    the config key ``longest_key``): a sequence is never split across micro-batches."""
    if micro_batch_tokens * sequence_parallel < longest:
        times = (
            f" times actor.sequence_parallel ({sequence_parallel})" if sequence_parallel > 1 else ""
        )
        raise ValueError(
            f"trainer.micro_batch_tokens ({micro_batch_tokens}){times} must be at least "
            f"{longest_key} ({longest}): a {unit} cannot be split across micro-batches"
        )


def check_offload(config: ActorConfig, info: DistInfo) -> None:
    """Raise ``ValueError`` if ``actor.offload`` cannot work in this process group."""
    if config.offload == "off":
        return
    if info.device.type != "cuda":
        raise ValueError(
            "actor.offload='cpu' moves parameters, gradients and optimizer state from GPU to CPU "
            "memory; this trainer runs on the CPU, where they are in CPU memory already: leave "
            "it 'off'"
        )
    if "cpu" not in group_backends():
        raise ValueError(
            f"actor.offload='cpu' needs a process group that also runs CPU collectives; this "
            f"one is {dist.get_backend()!r}: make it with "
            "init_distributed(cpu_collectives=True) (agentrl train and sft do)"
        )


def mixed_precision_policy(config: ActorConfig, device: torch.device) -> MixedPrecisionPolicy:
    """The FSDP2 policy for ``config.mixed_precision`` on ``device`` (see :class:`ActorConfig`)."""
    mode = config.mixed_precision
    if mode == "auto":
        mode = "bf16" if device.type == "cuda" else "fp32"
    if mode == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def decoder_layers(model: PreTrainedModel) -> list[nn.Module]:
    """The model's repeated blocks: modules whose class is in ``model._no_split_modules``, also
    once ``fully_shard`` has given them its ``FSDP<name>`` subclasses."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if names & {c.__name__ for c in type(m).__mro__}]
    if not layers:
        raise ValueError(
            f"{type(model).__name__} lists no decoder-layer classes in _no_split_modules "
            f"({sorted(names)}); the actor shards one decoder layer at a time"
        )
    return layers


def shard_model(model: PreTrainedModel, mesh: DeviceMesh, config: ActorConfig) -> PreTrainedModel:
    """Apply activation checkpointing and ``fully_shard`` to each decoder layer, then the root.

    Works in place (the parameters become ``DTensor`` shards on the mesh's device) and returns
    ``model``. Every rank must start from the same weights.
    """
    device = torch.device(mesh.device_type)
    policy = mixed_precision_policy(config, device)
    offload = CPUOffloadPolicy() if config.offload == "cpu" else OffloadPolicy()
    convert_to_fp8_training(  # before sharding: torchao's requirement
        model,
        config.fp8,
        device,
        emulate=config.fp8_emulate,
        exclude=config.fp8_exclude,
        min_features=config.fp8_min_features,
    )
    for layer in decoder_layers(model):
        if config.activation_checkpointing:
            checkpoint(layer)  # composable form: parameter names stay unchanged
        fully_shard(
            layer,
            mesh=mesh,
            mp_policy=policy,
            offload_policy=offload,
            reshard_after_forward=config.reshard_after_forward,
        )
    # The root's own parameters (embeddings, final norm, lm_head) are needed right after the last
    # layer's forward anyway, so the root never reshards after forward.
    fully_shard(
        model, mesh=mesh, mp_policy=policy, offload_policy=offload, reshard_after_forward=False
    )
    return model


class Actor:
    """The policy under training: ``model`` sharded in place, AdamW, and the LR schedule.

    Needs a process group (`agentrl.training.distributed.init_distributed` or ``distributed()``);
    ``model`` must hold the same weights on every rank. ``model`` is changed in place and is the
    object ``loss_fn`` receives; batches are moved to :attr:`device` by the caller.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        config: ActorConfig | None = None,
        *,
        dist_info: DistInfo | None = None,
    ) -> None:
        self.config = config or ActorConfig()
        self.dist = dist_info or current_dist_info()
        check_offload(self.config, self.dist)
        self.mesh = make_mesh(self.dist)
        self.sequence_parallel: SequenceParallel = sequence_parallel_layout(
            self.dist, self.config.sequence_parallel
        )
        """Which share of each batch this rank trains on, and which slice of each micro-batch."""
        implementation = getattr(model.config, "_attn_implementation", None)
        if implementation == "sdpa" or self.sequence_parallel.size > 1:
            use_trainer_attention(model)  # one float mask per forward; the gather of SP
        self.model = shard_model(model, self.mesh, self.config)
        self.model.train()
        cfg = self.config
        self.optimizer = build_adamw(
            self.model, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay
        )
        self.scheduler = build_lr_scheduler(
            self.optimizer,
            warmup_steps=cfg.warmup_steps,
            schedule=cfg.lr_schedule,
            total_steps=cfg.total_steps,
            min_lr_ratio=cfg.min_lr_ratio,
        )
        self.step = 0
        """Trainer steps taken so far (each ends with a ``train_step(..., end_step=True)``)."""

    @property
    def device(self) -> torch.device:
        return self.dist.device

    @property
    def lr(self) -> float:
        """Learning rate the next optimizer step will use."""
        return float(self.optimizer.param_groups[0]["lr"])

    def micro_batches(
        self, sequences: Sequence[SequenceLike], max_tokens: int
    ) -> list[PackedMicroBatch]:
        """This rank's packed micro-batches of ``sequences`` (which every rank holds in full), on
        :attr:`device`: its data-parallel share (:func:`~agentrl.training.packing.pack_for_rank`
        over ``world / P`` shares, micro-batches of up to ``P x max_tokens`` tokens), each split
        for its sequence-parallel group (:meth:`PackedMicroBatch.split`; ``P =
        actor.sequence_parallel``). Every rank gets the same number. With ``actor.fp8`` each
        micro-batch is padded by a filler sequence to a multiple of ``P x``
        :data:`~agentrl.training.fp8_training.TOKEN_MULTIPLE` tokens, as FP8 matmuls need."""
        layout = self.sequence_parallel
        packed = pack_for_rank(
            sequences, layout.data_rank, layout.data_size, max_tokens * layout.size
        )
        multiple = layout.size * (TOKEN_MULTIPLE if self.config.fp8 != "off" else 1)
        return [
            micro_batch.padded_to(multiple).split(layout).to(self.device) for micro_batch in packed
        ]

    def train_step(
        self,
        micro_batches: Sequence[B],
        loss_fn: LossFn[B],
        *,
        global_denominator: float | None = None,
        end_step: bool = True,
    ) -> dict[str, float]:
        """Accumulate gradients over ``micro_batches``, clip, and take one optimizer step.

        ``end_step`` (the default) ends the trainer step: :attr:`step` and the LR schedule
        advance. ``False`` takes an optimizer step within the trainer step at the same LR.

        Returns, identical on every rank: ``loss`` (global loss sum / D), ``grad_norm`` (before
        clipping), ``lr`` (used by this step), ``denominator`` (sum of the ``loss_fn``
        denominators over all ranks), ``micro_batches`` (over all ranks), and each metric name
        from ``loss_fn`` as its global sum / D. ``global_denominator`` must be the same on every
        rank. A non-finite gradient norm raises ``FloatingPointError`` on every rank before the
        weights change. Gradients are cleared on every exit path.
        """
        self._check_micro_batch_count(len(micro_batches))
        if global_denominator is not None and not global_denominator > 0:
            raise ValueError(f"global_denominator must be > 0, got {global_denominator}")
        world = self.dist.world_size
        # FSDP2 averages gradients over ranks; the factor `world` turns that into a sum.
        scale = world / global_denominator if global_denominator is not None else float(world)
        sums: dict[str, torch.Tensor] = {}
        self.optimizer.zero_grad(set_to_none=True)
        try:
            for micro_batch in micro_batches:
                if self.config.trim_heap:
                    trim_heap()  # the last micro-batch's freed memory, before this one's peak
                loss_sum, denominator, metrics = loss_fn(self.model, micro_batch)
                (loss_sum * scale).backward()
                reserved = RESERVED_METRICS.intersection(metrics)
                if reserved:
                    raise ValueError(f"loss_fn metric names {sorted(reserved)} are reserved")
                parts = {"loss": loss_sum, "denominator": denominator, **metrics}
                for name, value in parts.items():
                    value = torch.as_tensor(value).detach().to(self.device, torch.float64)
                    sums[name] = sums[name] + value if name in sums else value
            names = sorted(sums)  # the same order on every rank
            summed = all_reduce_sum(torch.stack([sums[n] for n in names])).tolist()
            totals = dict(zip(names, summed, strict=True))
            norm_by = float(global_denominator or totals["denominator"])
            if not norm_by > 0:
                raise ValueError(
                    "the loss_fn denominators sum to 0 over all ranks: nothing to train"
                )
            if global_denominator is None:
                self._scale_grads(1.0 / norm_by)
            grad_norm = self._clip_grads()
            lr = self.lr
            if self.config.trim_heap:
                trim_heap()
            self.optimizer.step()
            after_optimizer_step(self.model, self.config.fp8)
            if end_step:
                self.scheduler.step()
                self.step += 1
        finally:
            self.optimizer.zero_grad(set_to_none=True)
        report = {n: float(v) / norm_by for n, v in totals.items() if n != "denominator"}
        return {
            **report,
            "grad_norm": grad_norm,
            "lr": lr,
            "denominator": float(totals["denominator"]),
            "micro_batches": float(len(micro_batches) * world),
        }

    def _check_micro_batch_count(self, count: int) -> None:
        """Raise on every rank unless all ranks got the same number (> 0) of micro-batches."""
        counts = torch.tensor([count, -count], dtype=torch.int64, device=self.device)
        if self.dist.world_size > 1:
            dist.all_reduce(counts, op=dist.ReduceOp.MAX)
        most, fewest = int(counts[0]), -int(counts[1])
        if most != fewest:
            raise ValueError(
                f"ranks got between {fewest} and {most} micro-batches (this rank: {count}); "
                "FSDP2 needs the same number on every rank"
            )
        if count == 0:
            raise ValueError("train_step got no micro-batches")

    def _grads(self) -> list[torch.Tensor]:
        return [p.grad for p in self.model.parameters() if p.grad is not None]

    def _scale_grads(self, factor: float) -> None:
        grads = self._grads()
        if grads:
            torch._foreach_mul_(grads, factor)

    def _clip_grads(self) -> float:
        """Global L2 norm of the gradients (before clipping); clip to ``max_grad_norm`` if set."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(self._grads(), foreach=True)
        if isinstance(norm, DTensor):  # per-shard norms: reduce over the mesh
            norm = norm.full_tensor()
        if not torch.isfinite(norm):  # the same global value on every rank: all raise
            raise FloatingPointError(f"gradient norm is {float(norm)}; the step was not taken")
        if self.config.max_grad_norm is not None:
            torch.nn.utils.clip_grads_with_norm_(
                params, self.config.max_grad_norm, norm, foreach=True
            )
        return float(norm)
