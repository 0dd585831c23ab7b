"""The TRL side of tests/envs/foreign/test_trl.py; runs in ``.venv-trl`` (trl 1.16.0, made by
``bench/setup_trl_env.sh``). ``python trl_side.py OUTPUT_DIR``: agentrl/Math-v0 (multi-turn,
Hermes tool calls) through ``trl_environment``, checked against TRL's own tool machinery, then
one step of TRL's real ``GRPOTrainer`` on SmolLM2 with it as ``environment_factory``. Prints a
JSON summary."""

import json
import math
import os
import signal
import sys

import datasets
from transformers.utils import get_json_schema
from trl import GRPOConfig, GRPOTrainer
from trl.chat_template_utils import qwen2_5_chat_template

from agentrl.envs.foreign.trl_export import trl_environment, trl_reward
from agentrl.envs.math.verifier import shared_pool
from agentrl.models import load_model, load_tokenizer

KWARGS = {
    "mode": "multi",
    "tool_format": "hermes",
    "sandbox": "subprocess",
    "answer_format": "flexible",
    "max_turns": 3,
}


def main() -> None:
    output_dir = sys.argv[1]
    Math = trl_environment("agentrl/Math-v0", **KWARGS)
    episodes = []

    class Recorded(Math):  # records what TRL asks of each instance
        def reset(self, **row):
            self.episode = {"row": {k: v for k, v in row.items() if k != "prompt"}}
            episodes.append(self.episode)
            return super().reset(**row)

        def _finish(self, text):
            self.episode["reward"] = super()._finish(text)
            return self.episode["reward"]

    probe = Math()
    schema = get_json_schema(probe.python)  # what TRL renders into the prompt
    task = probe.reset(index=3, seed=0)
    tool_output = probe.python(code="print(6 * 7)")  # as TRL's tool loop calls it
    reward = trl_reward([[{"role": "assistant", "content": "So she has 4."}]], [probe])
    unjudged = dead_verifier_reward(Math)

    tokenizer = load_tokenizer("smollm2")
    tokenizer.chat_template = qwen2_5_chat_template  # a tool-calling template TRL can parse
    model = load_model("smollm2", dtype="float32")
    if getattr(model, "hf_quantizer", None) is not None:
        # the GGUF is dequantised to float32 on load, but transformers still marks it quantized
        # and Trainer refuses it; dropping the mark changes no weight (as bench/trl_baseline.py)
        model.hf_quantizer.remove_quantization_config(model)
    rows = {"prompt": [[{"role": "user", "content": ""}]] * 2, "index": [3, 5], "seed": [0, 0]}
    config = GRPOConfig(
        output_dir=output_dir,
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=16,
        max_tool_calling_iterations=2,
        max_steps=1,
        learning_rate=1e-6,
        beta=0.0,
        seed=0,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=trl_reward,
        args=config,
        train_dataset=datasets.Dataset.from_dict(rows),
        processing_class=tokenizer,
        environment_factory=Recorded,
    )
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    print(
        json.dumps(
            {
                "schema": schema,
                "task": task,
                "tool_output": tool_output,
                "reward": reward,
                "unjudged_reward": unjudged,
                "steps": trainer.state.global_step,
                "loss_finite": bool(logs) and all(math.isfinite(e["loss"]) for e in logs),
                "logged_reward": logs[-1].get("reward") if logs else None,
                "episodes": episodes,
            }
        )
    )


def dead_verifier_reward(Math):
    """trl_reward for an answer graded while Math-v0's verifier workers are killed: the episode's
    info carries an infra_error, and the reward is None (TRL's unscorable completion)."""
    probe = Math()
    probe.reset(index=3, seed=0)
    executor = shared_pool.executor()
    executor.submit(os.getpid).result()  # the workers are up
    for pid in list(executor._processes):
        os.kill(pid, signal.SIGKILL)
    reward = trl_reward([[{"role": "assistant", "content": "So she has 4."}]], [probe])
    assert probe.last_info.get("infra_error"), probe.last_info
    return reward


if __name__ == "__main__":
    main()
