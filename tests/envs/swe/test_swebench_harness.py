"""SWE-bench's own harness as a second judge of the shipped instances (issue 31, point 2).

``python -m swebench.harness.run_evaluation`` (swebench 5.0.2, in ``.venv-swebench``) runs, against
Podman's Docker API, on every shipped instance as a SWE-bench 5 row
(:mod:`agentrl.envs.swe.swebench_rows`) in its image in SWE-bench's layout
(``sweb.eval.x86_64.<id>:latest``, ``sandboxes/build.sh swe-testbed``): with gold predictions
every instance is resolved, with empty ones none is (the harness does not run an empty patch and
reports it unresolved), and SWE-v0's grader (bubblewrap) gives the same verdict on the same
patches, instance by instance. A missing venv, engine or image fails the test with the command
that makes it. The harness' own reports are read: each instance's ``report.json`` and the run's
``<model>.<run_id>.json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import docker
import gymnasium
import pytest
from test_swe_grading import grade_patch

from agentrl.engine_pool import GenerateResult
from agentrl.envs.swe import load_instances
from agentrl.envs.swe.env import SHIPPED_INSTANCES
from agentrl.envs.swe.swebench_rows import write_rows
from agentrl.envs.swe.testbed import swebench_images
from agentrl.evaluation import EvalConfig, evaluate
from agentrl.evaluation.report import write_reports

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
VENV_PYTHON = ROOT / ".venv-swebench" / "bin" / "python"
DOCKER_HOST = os.environ.get("DOCKER_HOST", "unix:///run/podman/podman.sock")
INSTANCES = load_instances(SHIPPED_INSTANCES)
PREDICTIONS = {"gold": lambda instance: instance.patch, "empty": lambda instance: ""}
EXPECTED = {"gold": True, "empty": False}
REPORT_WITHOUT_ENGINE = """
import json, sys
from swebench.harness.reporting import make_run_report
from swebench.harness.utils import load_swebench_dataset
predictions = {p["instance_id"]: p for p in map(json.loads, open(sys.argv[1]))}
make_run_report(predictions, load_swebench_dataset("rows.jsonl"), sys.argv[2], None, ".")
"""


def require_harness() -> None:
    """Fail (never skip) with the command that provides what is missing."""
    if not VENV_PYTHON.exists():
        pytest.fail(f"{VENV_PYTHON} is missing: run scripts/setup-swebench-env")
    if shutil.which("docker") is None:  # the harness stops and removes containers with it
        pytest.fail(
            "no `docker` CLI (SWE-bench's harness runs it): run sudo sandboxes/setup.sh all"
        )
    try:
        client = docker.DockerClient(base_url=DOCKER_HOST, timeout=30)
        client.ping()
    except docker.errors.DockerException as exc:
        pytest.fail(f"no engine answers at {DOCKER_HOST} ({exc}): run sudo sandboxes/setup.sh all")
    for image in swebench_images(INSTANCES):
        try:
            client.images.get(image.name)
        except docker.errors.ImageNotFound:
            pytest.fail(f"image {image.name} is missing: run {image.build_command}")


def run_harness(workdir: Path, kind: str) -> dict[str, bool]:
    """The harness's verdicts on ``kind`` predictions for every shipped instance."""
    rows = [
        {
            "instance_id": i.instance_id,
            "model_patch": PREDICTIONS[kind](i),
            "model_name_or_path": kind,
        }
        for i in INSTANCES
    ]
    return harness_on(workdir, rows, kind)


def harness_on(workdir: Path, rows: list[dict], kind: str) -> dict[str, bool]:
    """Run the harness on prediction ``rows`` (``workdir`` holds ``rows.jsonl``, the dataset;
    ``kind`` is the run id and every row's model name); each instance's verdict, read from its
    ``report.json`` (or, for an instance the harness did not run, the run report)."""
    predictions = workdir / f"{kind}.jsonl"
    predictions.write_text("".join(json.dumps(row) + "\n" for row in rows))
    instances = [i for i in INSTANCES if i.instance_id in {r["instance_id"] for r in rows}]
    command = [
        str(VENV_PYTHON), "-m", "swebench.harness.run_evaluation",
        "--dataset_name", "rows.jsonl", "--predictions_path", predictions.name,
        "--max_workers", "2", "--run_id", kind, "--timeout", "300",
    ]  # fmt: skip
    env = {**os.environ, "DOCKER_HOST": DOCKER_HOST}
    result = subprocess.run(
        command, cwd=workdir, env=env, capture_output=True, text=True, timeout=1200
    )
    run_report = workdir / f"{kind}.{kind}.json"
    if result.returncode != 0 and "make_run_report" in result.stderr:
        # The run report lists every container on the engine, which fails while another
        # test's container is being removed ("container not known"): the same report
        # without that list, from swebench's own function.
        result = subprocess.run(
            [str(VENV_PYTHON), "-c", REPORT_WITHOUT_ENGINE, predictions.name, kind],
            cwd=workdir, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    if result.returncode != 0 or not run_report.exists():
        pytest.fail(f"the harness failed ({result.returncode}):\n{result.stderr[-4000:]}")
    summary = json.loads(run_report.read_text())
    verdicts = {}
    for instance in instances:
        report = workdir / "logs" / "run_evaluation" / kind / kind / instance.instance_id
        if (report / "report.json").exists():
            data = json.loads((report / "report.json").read_text())
            verdicts[instance.instance_id] = data[instance.instance_id]["resolved"]
        else:
            assert instance.instance_id in summary["empty_patch_ids"], instance.instance_id
            verdicts[instance.instance_id] = instance.instance_id in summary["resolved_ids"]
    assert summary["error_ids"] == [], summary["error_ids"]
    return verdicts


@pytest.fixture(scope="module")
def harness_verdicts(tmp_path_factory) -> dict[str, dict[str, bool]]:
    require_harness()
    workdir = tmp_path_factory.mktemp("swebench")
    write_rows(INSTANCES, workdir / "rows.jsonl")
    start = time.monotonic()
    verdicts = {kind: run_harness(workdir, kind) for kind in PREDICTIONS}
    print(f"swebench harness, {len(INSTANCES)} instances x 2: {time.monotonic() - start:.0f} s")
    return verdicts


async def swe_v0_verdicts(kind: str) -> dict[str, bool]:
    gate = asyncio.Semaphore(2)

    async def one(instance):
        async with gate:
            result = await grade_patch(instance, PREDICTIONS[kind](instance), "bwrap")
        assert result.infra_error is None, (instance.instance_id, result.infra_error)
        return instance.instance_id, result.resolved

    return dict(await asyncio.gather(*map(one, INSTANCES)))


@pytest.mark.parametrize("kind", sorted(PREDICTIONS))
async def test_the_harness_and_swe_v0_agree_instance_by_instance(kind, harness_verdicts):
    harness = harness_verdicts[kind]
    start = time.monotonic()
    ours = await swe_v0_verdicts(kind)
    print(f"SWE-v0 (bwrap), {len(INSTANCES)} {kind} patches: {time.monotonic() - start:.0f} s")
    expected = dict.fromkeys(harness, EXPECTED[kind])
    assert harness == expected, f"the harness on {kind} predictions"
    assert ours == harness, f"SWE-v0 and the harness on {kind} predictions"


class ScriptedSWEPolicy:
    """A scripted policy for SWE-v0 through its Hermes tools: per instance, apply the gold patch
    (``"gold"``), append a comment to the buggy file (``"wrong"``: a non-empty patch that leaves
    the bug), or change nothing (``"none"``); then submit. The task index comes from the
    runner's session id (``env:task:sample:seed``)."""

    weight_version = 0

    def __init__(self, tokenizer, instances, plans):
        self.tokenizer, self.instances, self.plans = tokenizer, instances, plans
        self.end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.turns: dict[str, int] = {}

    def command(self, instance) -> str:
        plan = self.plans[instance.instance_id]
        if plan == "gold":
            return f"git apply <<'AGENTRL_EOF'\n{instance.patch}AGENTRL_EOF"
        if plan == "wrong":
            return f"echo '# looked at this' >> {instance.agentrl_taskgen.file}"
        return "git status --short"

    async def end_session(self, session_id):
        """Nothing is kept per session."""

    async def generate(self, input_ids, sampling, session_id=None):
        index = int(session_id.rsplit(":", 3)[1])
        turn = self.turns[session_id] = self.turns.get(session_id, -1) + 1
        call = (
            {"name": "bash", "arguments": {"command": self.command(self.instances[index])}}
            if turn == 0
            else {"name": "submit", "arguments": {}}
        )
        text = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.end_of_turn]
        return GenerateResult(ids, [0.0] * len(ids), "stop", 0, [0] * len(ids), len(input_ids))


async def test_agentrl_eval_writes_predictions_the_harness_grades_as_swe_v0_did(
    tokenizer, tmp_path
):
    """issue 32, point 2: ``agentrl eval`` on SWE-v0 writes SWE-bench's predictions file, the
    harness accepts it, and its verdicts are SWE-v0's."""
    require_harness()
    by_project = {}
    for instance in INSTANCES:
        by_project.setdefault(instance.agentrl_taskgen.project, instance)
    chosen = list(by_project.values())[:3]
    plans = dict(zip([i.instance_id for i in chosen], ["gold", "wrong", "none"], strict=False))
    config = EvalConfig.build(
        "test config",
        {
            "env": {
                "id": "agentrl/SWE-v0",
                "kwargs": {"sandbox": "bwrap", "instance_ids": list(plans)},
            },
            "eval": {"k": 1, "output_dir": str(tmp_path / "eval"), "concurrency": 2},
        },
    )
    order = gymnasium.make("agentrl/SWE-v0", instance_ids=list(plans)).unwrapped.instances
    rows = await evaluate(config, ScriptedSWEPolicy(tokenizer, order, plans), tokenizer)
    write_reports(rows, [1], tmp_path / "eval", "scripted-policy")
    ours = {json.loads(r["submission"])["instance_id"]: r["passed"] for r in rows}
    assert ours == {i: plans[i] == "gold" for i in plans}, rows

    predictions = tmp_path / "eval" / "submissions" / "SWE-v0.jsonl"
    submitted = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert {p["model_name_or_path"] for p in submitted} == {"scripted-policy"}
    assert all(sorted(p) == ["instance_id", "model_name_or_path", "model_patch"] for p in submitted)
    workdir = tmp_path / "harness"
    workdir.mkdir()
    write_rows([i for i in INSTANCES if i.instance_id in plans], workdir / "rows.jsonl")
    verdicts = harness_on(workdir, submitted, "scripted-policy")
    assert verdicts == ours
