"""The TRL side of tests/envs/foreign/test_trl.py; runs in ``.venv-trl`` (trl 1.16.0, made by
``bench/setup_trl_env.sh``). ``python trl_side.py OUTPUT_DIR``: agentrl/Math-v0 (multi-turn,
Hermes tool calls) through ``trl_environment``, checked against TRL's own tool machinery, then
one step of TRL's real ``GRPOTrainer`` on SmolLM2 with it as ``environment_factory``, after a
warm-up that teaches SmolLM2 to open with a tool call (:func:`warm_up_to_call_the_tool`). Prints
a JSON summary."""

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
WARMUP_STEPS = 12
WARMUP_LR = 1e-4


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
            self.episode["turns"] = len(self._rewards)  # each tool call is a turn before it
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
    warm_up_to_call_the_tool(model, tokenizer, Math, rows)
    config = GRPOConfig(
        output_dir=output_dir,
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=48,
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
                "tool_calls": logs[-1].get("tools/call_frequency") if logs else None,
                "tool_failures": logs[-1].get("tools/failure_frequency") if logs else None,
                "episodes": episodes,
            }
        )
    )


def warm_up_to_call_the_tool(model, tokenizer, Math, rows, steps=WARMUP_STEPS):
    """A few steps of supervised training on each row's prompt, exactly as GRPOTrainer renders
    it (the environment's reset text in the user message, its tools in the template), followed by
    one Hermes call of the python tool: SmolLM2-135M does not call a tool from TRL's prompt
    unprompted (it answers in text, or writes a <tool_response>), so without this the step
    would never exercise the tool loop. Loss on the call's tokens only."""
    import torch

    call = {"name": "python", "arguments": {"code": "print(6 * 7)"}}
    examples = []
    for index, seed in zip(rows["index"], rows["seed"], strict=True):
        environment = Math()
        task = environment.reset(index=index, seed=seed)
        user = [{"role": "user", "content": task}]
        tools = [environment.python]
        prompt = tokenizer.apply_chat_template(user, tools=tools, add_generation_prompt=True)
        reply = {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": call}],
        }
        full = tokenizer.apply_chat_template([*user, reply], tools=tools)
        prompt, full = _ids(prompt), _ids(full)
        assert full[: len(prompt)] == prompt, "the template is not append-only"
        labels = [-100] * len(prompt) + full[len(prompt) :]
        examples.append((torch.tensor([full]), torch.tensor([labels])))
    optimizer = torch.optim.AdamW(model.parameters(), lr=WARMUP_LR)
    model.train()
    for step in range(steps):
        ids, labels = examples[step % len(examples)]
        model(input_ids=ids, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()


def _ids(rendered):
    """apply_chat_template's ids: a list, or a mapping holding them (transformers 5)."""
    return list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)


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
