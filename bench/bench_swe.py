"""agentrl/SWE-v0: image build (cold and cached), episode start and grading time.

* **Image build**: ``sandboxes/build.sh swe-project PROJECT.json`` of one shipped project under a
  temporary tag (``SWE_IMAGE`` kept, so the SWE base image is reused): *cold* after removing the
  temporary image (build cache off, ``--force`` is not used because it would rebuild the Debian base
  too), then *cached* (the image is up to date: the script only compares the recipe label). Needs
  root with Podman, as the build script does.
* **Episode start**: ``env.areset`` (a fresh container from the project's image, the base tree
  written in and committed, its sha checked) against the baseline of starting and closing a bare
  container sandbox of the same image and limits; the ratio is the cost of the repository setup.
* **Grading**: :func:`agentrl.envs.swe.grading.grade` of the gold patch (fresh sandbox, checkout,
  both patches, the tests with the report plugin, hashes and cross-checks) against the baseline of
  what SWE-bench's harness does at minimum: in a fresh sandbox with the same tree and patches, run
  the same test command on the same tests and read the log, without the extra evidence.

* **Layouts** (``--layouts``): the same shipped instances (one per project) in SWE-bench's
  official layout, as SWE-bench 5 rows on their ``sweb.eval.x86_64.<id>`` images, and in
  R2E-Gym's, as R2E-Gym rows on their ``agentrl-r2e/<name>_final:<commit>`` images
  (:mod:`agentrl.envs.swe.image_harness`), against today's generated path, all on the container
  backend, in one process: episode start (``areset`` of an environment already made and reset
  once, until the first tool call can run) and grading of the gold patch (fresh container, the
  patch, the tests, the verdict).

Each measurement is repeated ``--repeat`` times per shipped project, paths alternating; prints
median seconds and the ratio ours/baseline. Wall-clock numbers on a small machine (2 cores here)
move with whatever else runs on it.

    DOCKER_HOST=unix:///run/podman/podman.sock python -m bench.bench_swe [--repeat 3] [--layouts]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shlex
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import gymnasium

import agentrl  # noqa: F401
from agentrl.envs.swe import r2e_rows, swebench_rows
from agentrl.envs.swe.env import SHIPPED_INSTANCES
from agentrl.envs.swe.grading import grade
from agentrl.envs.swe.image_harness import ImageRepos, grade_in_image
from agentrl.envs.swe.instances import load_instances
from agentrl.envs.swe.projects import BUILD_SCRIPT, load_projects, project_of
from agentrl.envs.swe.workspace import REPO_DIR, BaseTrees, checkout
from agentrl.tools import SandboxLimits, sandbox_factory

LIMITS = SandboxLimits(memory_mb=1024, pids=256, cpus=1.0, disk_mb=512)


def cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    return platform.processor()


def build_times(project_file: Path) -> tuple[float, float]:
    """Seconds to build a project's image from the Debian base without the layer cache (the SWE
    base under a temporary tag, then the project), and to find it up to date."""
    base = "localhost/agentrl-swe-bench-base:cold"
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / project_file.name
        copy.write_text(project_file.read_text().replace('"version": "', '"version": "bench-', 1))
        image = next(iter(load_projects(scratch).values())).image
        remove = ["podman", "rmi", "-f", image, base]
        subprocess.run(remove, capture_output=True)
        command = [str(BUILD_SCRIPT), "swe-project", str(copy), "--no-cache"]
        times = []
        try:
            for _ in range(2):
                start = time.perf_counter()
                subprocess.run(
                    command, check=True, capture_output=True, env=os.environ | {"SWE_IMAGE": base}
                )
                times.append(time.perf_counter() - start)
        finally:
            subprocess.run(remove, capture_output=True)
    return times[0], times[1]


async def episode_start(instance_id: str) -> float:
    env = gymnasium.make("agentrl/SWE-v0", instance_ids=[instance_id])
    start = time.perf_counter()
    await env.unwrapped.areset(seed=0)
    elapsed = time.perf_counter() - start
    await env.unwrapped.aclose()
    return elapsed


async def bare_start(image: str) -> float:
    start = time.perf_counter()
    sandbox = await sandbox_factory("container", LIMITS, image=image)()
    elapsed = time.perf_counter() - start
    await sandbox.close()
    return elapsed


async def grade_ours(instance, project, trees: BaseTrees) -> float:
    start = time.perf_counter()
    result = await grade(
        instance,
        instance.patch,
        sandboxes=sandbox_factory("container", LIMITS, image=project.image),
        archive=trees.archive(instance, project.sdist),
        test_command=project.spec.test_command,
        test_env=project.spec.test_env,
    )
    assert result.resolved, result
    return time.perf_counter() - start


async def grade_baseline(instance, project, trees: BaseTrees) -> float:
    """Fresh sandbox, checkout, both patches, the tests, the log: nothing more."""
    start = time.perf_counter()
    async with await sandbox_factory("container", LIMITS, image=project.image)() as sandbox:
        await checkout(sandbox, instance, trees.archive(instance, project.sdist))
        await sandbox.write_file("/tmp/p", instance.patch + instance.test_patch)
        env = " ".join(f"{k}={v}" for k, v in project.spec.test_env.items())
        tests = " ".join(shlex.quote(t) for t in (*instance.FAIL_TO_PASS, *instance.PASS_TO_PASS))
        script = (
            f"cd {REPO_DIR} && git apply /tmp/p && env {env} {project.spec.test_command} {tests}"
        )
        result = await sandbox.exec(["sh", "-c", script], timeout=600, max_output_bytes=8 << 20)
        assert result.exit_code == 0, result.stdout[-2000:]
    return time.perf_counter() - start


async def measure(repeat: int) -> None:
    instances = load_instances(SHIPPED_INSTANCES)
    projects = load_projects()
    trees = BaseTrees()
    print(f"CPU: {cpu()}")
    print(f"{'project':<12} {'what':<14} {'ours s':>8} {'baseline s':>11} {'ratio':>6}")
    for project in projects.values():
        instance = next(i for i in instances if project_of(i, projects) == project)
        trees.archive(instance, project.sdist)  # built once per process, as in training
        starts, bares, ours, base = [], [], [], []
        for _ in range(repeat):
            starts.append(await episode_start(instance.instance_id))
            bares.append(await bare_start(project.image))
            ours.append(await grade_ours(instance, project, trees))
            base.append(await grade_baseline(instance, project, trees))
        for what, a, b in (("episode start", starts, bares), ("grading", ours, base)):
            a_s, b_s = statistics.median(a), statistics.median(b)
            print(f"{project.spec.name:<12} {what:<14} {a_s:>8.2f} {b_s:>11.2f} {a_s / b_s:>6.2f}")


async def resets(env, repeat: int) -> list[float]:
    """Seconds of each of ``repeat`` resets of ``env`` after one untimed (caches filled)."""
    times = []
    try:
        for attempt in range(repeat + 1):
            start = time.perf_counter()
            await env.unwrapped.areset(seed=0)
            if attempt:
                times.append(time.perf_counter() - start)
    finally:
        await env.unwrapped.aclose()
    return times


LAYOUTS = {
    "SWE-bench": (swebench_rows.write_rows, "swebench5"),
    "R2E-Gym": (r2e_rows.write_rows, "r2e-gym"),
}
"""The benchmark layouts timed against today's: their rows writer and row format."""


async def layouts(repeat: int) -> None:
    """Benchmark layouts (SWE-bench 5 and R2E-Gym rows on their images) vs generated instances,
    on the container backend."""
    instances = load_instances(SHIPPED_INSTANCES)
    projects = load_projects()
    trees = BaseTrees()
    repos = ImageRepos(LIMITS)
    print(f"CPU: {cpu()}")
    print(
        f"{'project':<12} {'layout':<10} {'what':<14} {'layout s':>8} {'today s':>8} {'ratio':>6}"
    )
    with tempfile.TemporaryDirectory() as scratch:
        for project in projects.values():
            instance = next(i for i in instances if project_of(i, projects) == project)
            kwargs = {"sandbox": "container"}
            today = await resets(
                gymnasium.make("agentrl/SWE-v0", instance_ids=[instance.instance_id], **kwargs),
                repeat,
            )
            graded_today = [await grade_ours(instance, project, trees) for _ in range(repeat)]
            for layout, (write, row_format) in LAYOUTS.items():
                rows = Path(scratch) / f"{project.spec.name}-{row_format}.jsonl"
                write([instance], rows)
                (row,) = load_instances(rows, format=row_format)
                env = gymnasium.make(
                    "agentrl/SWE-v0",
                    instances=str(rows),
                    instance_format=row_format,
                    instance_ids=[row.instance_id],
                    **kwargs,
                )
                started = await resets(env, repeat)
                graded = []
                for _ in range(repeat):
                    start = time.perf_counter()
                    verdict = await grade_in_image(row, row.patch, repos=repos, timeout=600)
                    assert verdict.resolved, verdict
                    graded.append(time.perf_counter() - start)
                for what, a, b in (
                    ("episode start", started, today),
                    ("grading", graded, graded_today),
                ):
                    a_s, b_s = statistics.median(a), statistics.median(b)
                    print(
                        f"{project.spec.name:<12} {layout:<10} {what:<14} "
                        f"{a_s:>8.2f} {b_s:>8.2f} {a_s / b_s:>6.2f}"
                    )
    repos.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-build", action="store_true", help="do not time image builds")
    parser.add_argument(
        "--layouts", action="store_true", help="only official layout vs today's (see above)"
    )
    args = parser.parse_args()
    if args.layouts:
        asyncio.run(layouts(args.repeat))
        return
    if not args.skip_build:
        project_file = next(iter(load_projects().values())).path
        cold, cached = build_times(project_file)
        print(
            f"image build of {project_file.stem} (SWE base + project, no layer cache): "
            f"cold {cold:.1f} s, cached {cached:.2f} s (cold/cached {cold / cached:.0f}x)"
        )
    asyncio.run(measure(args.repeat))


if __name__ == "__main__":
    main()
