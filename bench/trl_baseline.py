"""The TRL side of the GRPO-step benchmark: wall time of each of TRL's ``GRPOTrainer`` steps.

Runs only in the TRL env (``bench/setup_trl_env.sh``, trl 1.16.0 over torch 2.13.0+cpu and
transformers 5.23.0); the project's own env has no trl. :func:`trl_grpo_step_times` trains the
model it is given for ``steps`` optimizer steps and returns each step's wall time, measured by a
``TrainerCallback`` from ``on_step_begin`` to ``on_step_end``.

**What one timed TRL step includes** (trl 1.16.0, ``GRPOTrainer._prepare_inputs`` and
``_compute_loss``), in order:

1. render every prompt with the tokenizer's chat template (``add_generation_prompt=True``), tokenize;
2. one ``model.generate`` call over all ``prompts x num_generations`` rows (each prompt repeated
   ``num_generations`` times), left-padded to the longest prompt, sampling with ``temperature``,
   ``top_p=1``, ``top_k=0``, a dynamic KV cache, until every row has hit an EOS token or
   ``max_completion_length`` new tokens. It runs under ``torch.no_grad`` with the model still in
   **train mode** (harmless for SmolLM2: its dropout is 0);
3. decode the completions and score them with the reward function (ours is async, so TRL awaits it
   on its own event-loop thread); group advantages ``(r - mean_g) / (std_g + 1e-4)`` with the
   Bessel-corrected std (``scale_rewards="group"``, TRL's default);
4. no old-log-prob forward: with ``num_iterations=1`` and one generation per optimizer step, TRL
   uses ``old = logp.detach()``, so the ratio is exactly 1 and clipping never fires;
5. one forward + backward per micro-batch over ``[prompt | completion]`` (prompt left-padded,
   completion right-padded to the longest completion, attention mask given, no position ids: RoPE
   is shift-invariant, so the left padding only costs compute) through TRL's fused LM head, which
   never materialises ``(B, T, vocab)`` logits but, on the CPU (no Triton), applies the head and a
   log-softmax to *every* position, prompt and padding included, and computes per-token entropies
   too (they only feed a metric);
6. loss ``loss_type="dapo"`` (TRL's default): token-mean over all completion tokens of the step
   (up to and including the first EOS); gradient clipping to norm 1.0; AdamW
   (``adamw_torch_fused``, TRL's default on torch >= 2.8), weight decay 0, constant lr; zero grad.

Also inside the step, all cheap: TRL's metric bookkeeping (lengths, reward stats, clip ratios,
entropy, ``.item()`` syncs). Not timed: trainer construction (it patches ``model.forward`` with the
fused head, so pass a model nobody else uses), the dataloader's fetch of the prompt rows, logging
(off). On 2 cores a step of 4 prompts x 2 x 64 tokens split about 8 s generation, 5 s loss
forward, 6 s backward, 0.05 s optimizer, 0.02 s reward (after the first step).

**Settings matched to a plain GRPO step**: float32 on the CPU (``use_cpu=True``, ``bf16=False``:
TRL's default is bf16), no activation checkpointing (TRL's default is on), ``beta=0`` (no reference
model, no KL), ``num_iterations=1``, one optimizer step per ``len(prompts) x num_generations``
completions (``generation_batch_size`` equals the step's batch, so each step generates afresh),
one micro-batch per step unless ``micro_batch_size`` is given, no vLLM, no logging integrations, no
checkpoints, no completion logging.

**Differences our step must mirror or report**: generation is HF ``generate`` with static batching
(finished rows keep computing padding until the longest finishes; there is no continuous batching
or prefix cache); the loss forward pads instead of packing; TRL computes per-token entropies in the
loss forward; the optimizer is fused AdamW rather than foreach. SmolLM2's chat template inserts
its default system prompt when the prompt has none, so give both sides the same messages
(``prompts`` may be full message lists, e.g. Math-v0's system + user observation).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import datasets
from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from agentrl.envs.math import MathEnv, MathProblem

Message = dict[str, str]
Grade = Callable[[str, str], Awaitable[float]]
"""``await grade(completion_text, gold_answer) -> reward``."""
TRLReward = Callable[..., Awaitable[list[float]]]
"""TRL's reward-function protocol: ``await reward(prompts=, completions=, **dataset_columns)``."""


class StepTimer(TrainerCallback):
    """Wall time of each optimizer step: generation, reward, loss, backward and optimizer step."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._start = 0.0

    def on_step_begin(self, args, state, control, **kwargs) -> None:
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs) -> None:
        self.times.append(time.perf_counter() - self._start)


def math_v0_grade(answer_format: str = "either") -> Grade:
    """The project's ``agentrl/Math-v0`` single-turn grading (answer extraction, then math-verify in
    the shared verifier process pool), against a gold answer given per call."""

    async def grade(completion: str, gold: str) -> float:
        env = MathEnv(answer_format=answer_format)
        env.problem = MathProblem("trl-baseline", "", gold)
        _, reward, *_ = await env.astep(completion)
        return reward

    return grade


def make_trl_reward(grade: Grade) -> TRLReward:
    """A TRL reward function grading each completion against its row's ``answer`` column, all
    completions of the batch concurrently."""

    async def math_reward(prompts: list, completions: list, answer: list[str], **_: Any) -> list:
        # Conversational prompts give completions as [{"role": "assistant", "content": ...}].
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return list(await asyncio.gather(*map(grade, texts, answer)))

    return math_reward


def grpo_config(
    *,
    batch_size: int,
    micro_batch_size: int,
    num_generations: int,
    max_completion_length: int,
    temperature: float,
    learning_rate: float,
    steps: int,
    seed: int,
    output_dir: str,
) -> GRPOConfig:
    """A plain GRPO step in TRL terms (see the module docstring); ``batch_size`` completions a step."""
    if batch_size % micro_batch_size:
        raise ValueError(f"micro_batch_size {micro_batch_size} must divide {batch_size}")
    return GRPOConfig(
        output_dir=output_dir,
        use_cpu=True,
        bf16=False,
        fp16=False,
        activation_checkpointing=False,  # TRL turns it on by default (as gradient_checkpointing)
        # The generation batch (per_device * steps_per_generation, the latter defaulting to the
        # accumulation steps) is then exactly one optimizer step's completions.
        per_device_train_batch_size=micro_batch_size,
        gradient_accumulation_steps=batch_size // micro_batch_size,
        num_generations=num_generations,
        num_iterations=1,
        max_completion_length=max_completion_length,
        temperature=temperature,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        loss_type="dapo",  # TRL's default, stated: token-mean over the whole step
        scale_rewards="group",  # TRL's default, stated: divide by the group's std
        epsilon=0.2,
        mask_truncated_completions=False,
        learning_rate=learning_rate,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=steps,
        seed=seed,
        shuffle_dataset=False,
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        disable_tqdm=True,
        log_completions=False,
        dataloader_num_workers=0,
    )


def trl_grpo_step_times(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str | list[Message]],
    reward_fn: TRLReward,
    *,
    num_generations: int,
    max_completion_length: int,
    temperature: float,
    learning_rate: float,
    steps: int,
    seed: int,
    output_dir: str,
    answers: Sequence[str] | None = None,
    micro_batch_size: int | None = None,
) -> list[float]:
    """Train ``model`` with TRL's GRPOTrainer for ``steps`` steps; the wall time of each, in seconds.

    ``prompts`` is one step's batch (a string is one user message; a message list is used as is),
    reused by every step. ``answers[i]`` reaches ``reward_fn`` as the ``answer`` column of the
    completions of ``prompts[i]``. ``micro_batch_size`` completions per forward/backward; default:
    the whole step in one. ``model`` is modified (trained, and its forward patched by TRL).
    """
    rows: dict[str, list] = {
        "prompt": [[{"role": "user", "content": p}] if isinstance(p, str) else p for p in prompts]
    }
    if answers is not None:
        rows["answer"] = list(answers)
    batch_size = len(prompts) * num_generations
    config = grpo_config(
        batch_size=batch_size,
        micro_batch_size=micro_batch_size or batch_size,
        num_generations=num_generations,
        max_completion_length=max_completion_length,
        temperature=temperature,
        learning_rate=learning_rate,
        steps=steps,
        seed=seed,
        output_dir=output_dir,
    )
    if getattr(model, "hf_quantizer", None) is not None:
        # A GGUF model is dequantised to float32 on load, but transformers still marks it quantized
        # and Trainer refuses to train it; dropping the mark changes no weight.
        model.hf_quantizer.remove_quantization_config(model)
    timer = StepTimer()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_fn,
        args=config,
        train_dataset=datasets.Dataset.from_dict(rows),
        processing_class=tokenizer,
        callbacks=[timer],
    )
    trainer.train()
    return timer.times
