"""The skyrl-gym side of tests/envs/foreign/test_skyrl.py; runs in ``.venv-skyrl`` (skyrl-gym
0.4.0 beside the project's packages, made by ``scripts/setup-skyrl-env``).

``python skyrl_side.py export``: agentrl/Math-v0 (multi-turn) registered in skyrl-gym's registry
by ``register_skyrl_env`` and driven with the calls SkyRL's ``SkyRLGymGenerator.agent_loop``
makes (``skyrl_gym.make(env_class, env_config=, extras=)``, ``init``, ``step`` until done,
``get_metrics``, ``close``), once from a worker thread as with ``max_env_workers > 0`` and once on
a running event loop's thread as with ``max_env_workers=0``. Reads the actions (JSON list) on
stdin, prints what the environment returned as JSON.

``python skyrl_side.py rollout``: ``agentrl/SkyRL-v0`` on skyrl-gym's ``gsm8k_multi_turn`` rolled
out with SmolLM2 through agentrl's EpisodeRunner; prints the token-exactness verdict and the
episodes' messages and rewards as JSON.
"""

import asyncio
import concurrent.futures
import copy
import json
import sys
from pathlib import Path

import skyrl_gym
from omegaconf import DictConfig
from skyrl_gym.envs.base_text_env import BaseTextEnv

import agentrl  # noqa: F401  (registers agentrl's environments)

ROW = {
    "reward_spec": {"method": "rule", "ground_truth": "4"},
    "extra_info": {"index": 3, "seed": 0},
}
PROMPT = [{"role": "user", "content": "(the dataset's prompt: the environment's task replaces it)"}]
GSM8K_TASKS = [
    {
        "prompt": [{"role": "user", "content": f"What is {a} + {b}? End with '#### ANSWER'."}],
        "env_class": "gsm8k_multi_turn",
        "reward_spec": {"method": "rule", "ground_truth": str(a + b)},
        "max_turns": 2,
    }
    for a, b in [(2, 3), (7, 5)]
]


def agent_loop(actions: list[str], max_turns: int) -> dict:
    """SkyRL's generator's calls, in its order, on one environment."""
    extras = dict(copy.deepcopy(ROW), max_turns=max_turns)
    env = skyrl_gym.make("agentrl_math", env_config=DictConfig({}), extras=extras)
    assert isinstance(env, BaseTextEnv)
    chat_history, metadata = env.init(copy.deepcopy(PROMPT))
    steps, done = [], False
    for action in actions:
        if done:
            break
        output = env.step(action)
        done = output["done"]
        steps.append(dict(output))
    metrics = env.get_metrics()
    env.close()
    env.close()  # twice is harmless
    return {"init": chat_history, "metadata": metadata, "steps": steps, "metrics": metrics}


async def on_the_loop(actions: list[str], max_turns: int) -> dict:
    return agent_loop(actions, max_turns)  # blocking calls on the loop's thread, as SkyRL does


def export() -> dict:
    from agentrl.envs.foreign.skyrl_export import register_skyrl_env

    register_skyrl_env("agentrl_math", "agentrl/Math-v0", mode="multi", sandbox="subprocess")
    actions = json.load(sys.stdin)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        threaded = pool.submit(agent_loop, actions, 3).result()
    return {
        "threaded": threaded,
        "on_loop": asyncio.run(on_the_loop(actions, 3)),
        "one_turn": agent_loop(actions, 1),
        "aggregate": skyrl_gym.make("agentrl_math", extras=ROW).aggregate_metrics(
            [threaded["metrics"]]
        ),
    }


async def rollout() -> dict:
    import gymnasium

    from agentrl.engine_pool import LocalEngine, SamplingParams
    from agentrl.models import load_model, load_tokenizer
    from agentrl.rollout import EpisodeRunner, group_tasks

    sys.path.insert(0, str(Path(__file__).parent))
    from foreign_checks import assert_token_exact

    tokenizer = load_tokenizer("smollm2")
    model = load_model("smollm2")
    sampling = SamplingParams(temperature=1.0, max_new_tokens=16, seed=1)
    async with LocalEngine(model, tokenizer=tokenizer, max_batch_size=8) as engine:
        runner = EpisodeRunner(
            lambda: gymnasium.make("agentrl/SkyRL-v0", env="gsm8k_multi_turn", tasks=GSM8K_TASKS),
            engine,
            tokenizer,
            sampling,
            env_id="agentrl/SkyRL-v0",
        )
        trajectories = await runner.collect(group_tasks(2, group_size=2, seed=3), concurrency=4)
    for trajectory in trajectories:
        assert_token_exact(trajectory, tokenizer)
    return {
        "token_exact": True,
        "episodes": [
            {
                "messages": t.messages,
                "turn_rewards": [turn.reward for turn in t.turns],
                "reward": t.reward,
                "terminated": t.terminated,
            }
            for t in trajectories
        ],
    }


if __name__ == "__main__":
    command = sys.argv[1]
    result = export() if command == "export" else asyncio.run(rollout())
    print(json.dumps(result))
