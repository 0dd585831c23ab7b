"""Time a few of TRL's GRPO steps on SmolLM2 and Math-v0 problems (run inside the TRL env).

    bash bench/setup_trl_env.sh
    .venv-trl/bin/python -m bench.run_trl_baseline [--prompts 4] [--num-generations 2] \
        [--max-completion-length 64] [--steps 3]

The prompts are Math-v0's own first observations (its system prompt and a generated problem,
``env.reset(options={"index": i})``), and the reward is Math-v0's grading of the completion
against that problem's gold answer. The first step includes warm-ups (the verifier pool's worker
processes start, first-call allocations), so all step times are printed.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import gymnasium
import torch

import agentrl  # noqa: F401  (registers agentrl/Math-v0)
from agentrl.models import load_model, load_tokenizer
from bench.trl_baseline import make_trl_reward, math_v0_grade, trl_grpo_step_times


def math_v0_prompts(count: int, answer_format: str) -> tuple[list[list[dict]], list[str]]:
    """Math-v0's first observation and gold answer for generated problems ``0 .. count - 1``."""
    env = gymnasium.make("agentrl/Math-v0", answer_format=answer_format)
    prompts, answers = [], []
    for index in range(count):
        messages, info = env.reset(seed=index, options={"index": index})
        prompts.append(messages)
        answers.append(info["gold_answer"])
    env.close()
    return prompts, answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--num-generations", type=int, default=2)
    parser.add_argument("--max-completion-length", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--learning-rate", type=float, default=1e-6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--answer-format", default="flexible")
    args = parser.parse_args()

    prompts, answers = math_v0_prompts(args.prompts, args.answer_format)
    model = load_model("smollm2", dtype="float32")
    tokenizer = load_tokenizer("smollm2")
    with tempfile.TemporaryDirectory() as output_dir:
        times = trl_grpo_step_times(
            model,
            tokenizer,
            prompts,
            make_trl_reward(math_v0_grade(args.answer_format)),
            answers=answers,
            num_generations=args.num_generations,
            max_completion_length=args.max_completion_length,
            temperature=args.temperature,
            learning_rate=args.learning_rate,
            steps=args.steps,
            seed=args.seed,
            output_dir=output_dir,
        )
    print(
        f"TRL GRPO, {args.prompts} prompts x {args.num_generations} generations, "
        f"<= {args.max_completion_length} new tokens, {torch.get_num_threads()} torch threads"
    )
    for step, seconds in enumerate(times):
        print(f"step {step}: {seconds:.2f} s" + (" (includes warm-up)" if step == 0 else ""))
    if len(times) > 1:
        print(f"median after the first: {statistics.median(times[1:]):.2f} s")


if __name__ == "__main__":  # the math verifier's worker processes use the spawn start method
    main()
