"""An evaluation: every task of each environment, ``k`` samples each, written as they finish.

What it does, for each environment of ``env`` (one, or each of ``env.mix``; weights do not matter
here): it asks the environment how many tasks it has (:attr:`AgentEnv.num_tasks`), takes the first
``eval.max_tasks`` of them in order, and runs ``k`` episodes of each, resetting with
``options={"index": i}`` and seed ``i``; the sampling seed of each turn derives from
``(eval.seed, i, sample, turn)``. Each finished episode is one line of ``episodes.jsonl`` (the
environment's label, the task index, the sample, whether it passed, and the whole trajectory
record), flushed at once.

Resuming: an output directory that already holds ``episodes.jsonl`` and the same config
(:meth:`EvalConfig.identity`, kept in ``eval_config.json``) is continued: episodes on record are
not run again, and a line cut short by a kill is dropped and its episode run. A different config
is refused (``ConfigError``), so no file mixes two evaluations.

The numbers (:mod:`agentrl.evaluation.report`) are computed from the file, so a resumed run
reports every episode. An episode the environment could not judge (an infrastructure fault) or
that ended in an error is counted apart and enters no mean and no pass@k.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.config import ConfigError
from agentrl.engine_pool import Engine, SamplingParams
from agentrl.envs import AgentEnv, AgentWrapper, make_env
from agentrl.evaluation.config import EvalConfig
from agentrl.rollout.mixture import EnvSpec
from agentrl.rollout.runner import EpisodeRunner, RolloutTask

EPISODES = "episodes.jsonl"
CONFIG = "eval_config.json"


@dataclass(frozen=True)
class EvalTask:
    """One episode to run: sample ``sample`` of task ``index`` of the environment ``label``."""

    label: str
    index: int
    sample: int


async def task_count(spec: EnvSpec) -> int:
    """How many tasks the environment ``spec`` makes enumerates (ValueError if it cannot)."""
    env = make_env(spec.id, **spec.kwargs)
    try:
        base = env.unwrapped
        count = await base.anum_tasks() if isinstance(base, AgentEnv) else None
    finally:
        await env.aclose()
    if count is None:
        raise ValueError(
            f"{spec.id} cannot enumerate its tasks (num_tasks is None), so it cannot be evaluated"
        )
    return count


async def planned_tasks(config: EvalConfig) -> list[EvalTask]:
    """Every episode of the evaluation, in order: environments, then tasks, then samples."""
    tasks = []
    for spec in config.env.specs():
        count = await task_count(spec)
        if config.eval.max_tasks is not None:
            count = min(count, config.eval.max_tasks)
        tasks += [
            EvalTask(spec.label, index, sample)
            for index in range(count)
            for sample in range(config.eval.k)
        ]
    return tasks


def read_episodes(path: Path) -> list[dict[str, Any]]:
    """The episodes on record in ``path``; a last line cut short by a kill is removed."""
    if not path.exists():
        return []
    rows, kept = [], 0
    with path.open("rb") as file:
        for line in file:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break  # only the last line can be incomplete: the writer appends whole lines
            kept += len(line)
    if kept < path.stat().st_size:
        with path.open("r+b") as file:
            file.truncate(kept)
    return rows


def prepare_output(config: EvalConfig) -> Path:
    """The output directory, with the config recorded; ConfigError if it holds another one."""
    out = Path(config.eval.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    recorded = out / CONFIG
    identity = config.identity()
    if recorded.exists() and (out / EPISODES).exists():
        before = json.loads(recorded.read_text())
        if before != identity:
            changed = sorted(_differences(before, identity))
            raise ConfigError(
                f"{out} holds an evaluation with another config (differs in {', '.join(changed)}):"
                " give another eval.output_dir, or remove that one to start over"
            )
    recorded.write_text(json.dumps(identity, indent=2) + "\n")
    return out


async def evaluate(
    config: EvalConfig,
    engine: Engine,
    tokenizer: Any,
    *,
    on_episode: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every planned episode not on record yet (see the module docstring); return all rows."""
    out = prepare_output(config)
    path = out / EPISODES
    rows = read_episodes(path)
    done = {(r["env"], r["index"], r["sample"]) for r in rows}
    todo = [t for t in await planned_tasks(config) if (t.label, t.index, t.sample) not in done]
    runners = {spec.label: _runner(config, spec, engine, tokenizer) for spec in config.env.specs()}
    limit = asyncio.Semaphore(config.eval.concurrency)

    async def run(task: EvalTask) -> dict[str, Any]:
        async with limit:
            rollout = RolloutTask(task.index, task.sample, task.index, {"index": task.index})
            trajectory = await runners[task.label].run(rollout)
        passed = trajectory.judged and trajectory.reward >= config.eval.pass_threshold
        return {
            "env": task.label,
            "index": task.index,
            "sample": task.sample,
            "passed": passed,
            **trajectory.to_record(),
        }

    with path.open("a", encoding="utf-8") as file:
        for finished in asyncio.as_completed([run(task) for task in todo]):
            row = await finished
            file.write(json.dumps(row, ensure_ascii=False) + "\n")
            file.flush()
            os.fsync(file.fileno())
            rows.append(row)
            if on_episode is not None:
                on_episode(row)
    return rows


def _runner(config: EvalConfig, spec: EnvSpec, engine: Engine, tokenizer: Any) -> EpisodeRunner:
    sampling = config.sampling

    def make() -> AgentEnv | AgentWrapper:
        return make_env(spec.id, **spec.kwargs)

    return EpisodeRunner(
        make,
        engine,
        tokenizer,
        SamplingParams(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            max_new_tokens=sampling.max_new_tokens,
            stop=tuple(sampling.stop),
            seed=config.eval.seed,
        ),
        env_id=spec.id,
        max_total_tokens=sampling.max_total_tokens,
    )


def _differences(before: dict[str, Any], now: dict[str, Any], prefix: str = "") -> list[str]:
    keys = set(before) | set(now)
    found = []
    for key in keys:
        a, b = before.get(key), now.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            found += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            found.append(f"{prefix}{key}")
    return found
