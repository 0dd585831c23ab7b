"""The generation pipeline: an sdist in, verified SWE-bench instances out.

For one project (:func:`generate_project`):

1. unpack the sdist: the *clean tree*; commit a copy of it (``environment_setup_commit``);
2. run the suite twice, the first time traced (:mod:`~agentrl.envs.swe.taskgen.baseline`): the
   *passing* tests, and which of them run each source line;
3. list every rewrite the mutators can make in the source modules and order them with the seed
   (each kind shuffled, kinds interleaved, those whose tests are all in files small enough to
   hide first);
4. for each candidate, in that order, ``jobs`` at a time in worker trees: apply it, run the test
   files whose tests run the changed lines (all of them when the lines run at import), stopping
   after ``max_fail`` failures; keep it when ``min_fail``..``max_fail`` passing tests fail
   (FAIL_TO_PASS), all in test modules of ``max_hidden_bytes`` at most; one bug per function;
5. for a kept bug, build the *base tree* (clean + bug - the test files of FAIL_TO_PASS), write
   ``patch`` (the fix) and ``test_patch`` (adding the hidden files back) with ``git diff``, and
   verify them on copies of the base tree: both pass ``git apply --check`` and ``patch -p1
   --dry-run``; the base tree's whole suite collects and its PASS_TO_PASS tests pass; with
   ``test_patch`` the whole suite's failing passing tests are exactly FAIL_TO_PASS and
   PASS_TO_PASS pass; with ``patch`` too, all of them pass;
6. commit the base tree with the instance id as message (``base_commit``) and write the problem
   statement from the failures of step 5.

PASS_TO_PASS is a sample, drawn with the seed, of at most ``p2p_max`` of the tests that pass with
and without the bug: half from the hidden test files (which ``test_patch`` brings back), the rest
from the other files; ``p2p_max=-1`` keeps them all.

Deterministic for a seed and a configuration while the time budget is not reached and no test is
flaky: candidates are decided in order, whatever order the workers finish in.
"""

from __future__ import annotations

import itertools
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from queue import Queue

from agentrl.envs.swe.instances import SWEInstance, TaskgenInfo, write_instances
from agentrl.envs.swe.repo import (
    ENVIRONMENT_MESSAGE,
    SdistProject,
    commit_tree,
    git_apply,
    sha256_file,
    unpack_sdist,
)
from agentrl.envs.swe.taskgen.baseline import measure_baseline
from agentrl.envs.swe.taskgen.candidates import Candidate, MutationError, find_candidates, mutate
from agentrl.envs.swe.taskgen.config import TaskgenConfig
from agentrl.envs.swe.taskgen.mutators import MUTATORS
from agentrl.envs.swe.taskgen.patches import check_applies, write_patches
from agentrl.envs.swe.taskgen.project import SdistInfo, is_test_file, read_sdist, source_modules
from agentrl.envs.swe.taskgen.statement import problem_statement
from agentrl.envs.swe.taskgen.testrun import (
    TEST_COMMAND,
    TEST_ENV,
    Failure,
    SuiteError,
    SuiteRun,
    SuiteRunner,
)

CREATED_AT = "2000-01-01T00:00:00Z"
REPO_OWNER = "agentrl-taskgen"


@dataclass
class Tally:
    """Progress of one project, passed to the progress callback after each candidate."""

    project: str
    candidates: int = 0
    tried: int = 0
    kept: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    done: bool = False


@dataclass(frozen=True)
class _Draft:
    """A bug that passed verification, before it has an id."""

    candidate: Candidate
    file: str
    base: Path
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    failures: dict[str, Failure]
    patch: str
    test_patch: str
    hidden: list[str]


class _Rejected(Exception):
    """A candidate is not kept; the message is the reason, counted in the tally."""


def generate(
    sdists: list[Path],
    out: Path,
    config: TaskgenConfig,
    on_progress: Callable[[Tally], None] | None = None,
) -> list[SWEInstance]:
    """Generate instances for each sdist and write ``out/instances.jsonl`` (replaced), and for
    each project ``out/projects/<sdist>`` and ``out/projects/<sdist stem>.json``."""
    projects_dir = out / "projects"
    projects_dir.mkdir(parents=True, exist_ok=True)
    instances: list[SWEInstance] = []
    for sdist in sdists:
        project, made = generate_project(sdist, config, on_progress)
        instances += made
        if sdist.resolve() != (projects_dir / sdist.name).resolve():
            shutil.copyfile(sdist, projects_dir / sdist.name)
        stem = sdist.name.removesuffix(".tar.gz")
        (projects_dir / f"{stem}.json").write_text(project.model_dump_json(indent=2) + "\n")
    write_instances(instances, out / "instances.jsonl")
    return instances


def generate_project(
    sdist: Path, config: TaskgenConfig, on_progress: Callable[[Tally], None] | None = None
) -> tuple[SdistProject, list[SWEInstance]]:
    """The project's description and its verified instances (see the module's docstring)."""
    info = read_sdist(sdist)
    with tempfile.TemporaryDirectory(prefix=f"taskgen-{info.name}-") as work:
        return _ProjectRun(info, Path(work), config, on_progress).run()


class _ProjectRun:
    def __init__(
        self,
        info: SdistInfo,
        work: Path,
        config: TaskgenConfig,
        on_progress: Callable[[Tally], None] | None,
    ) -> None:
        self.info, self.work, self.config = info, work, config
        self.on_progress = on_progress or (lambda tally: None)
        self.tally = Tally(info.name)
        self.clean = work / "clean"
        self._serials = itertools.count()

    def run(self) -> tuple[SdistProject, list[SWEInstance]]:
        unpack_sdist(self.info.path, self.clean)
        environment_commit = commit_tree(self._copy(self.clean), ENVIRONMENT_MESSAGE)
        self.modules = source_modules(self.clean, self.config.source)
        with SuiteRunner(self.config.python, self.config.test_timeout or 600) as runner:
            self.baseline = measure_baseline(runner, lambda: self._copy(self.clean), self.modules)
            if not self.baseline.passing:
                raise RuntimeError(f"{self.info.path.name}: no test passes on the clean tree")
            runner.timeout = self.config.test_timeout or max(10.0, 10 * self.baseline.seconds)
            self.runner = runner
            drafts = self._search()
        project = SdistProject(
            name=self.info.name,
            version=self.info.version,
            sdist=self.info.path.name,
            sha256=sha256_file(self.info.path),
            license=self.info.license,
            source_url=self.info.source_url,
            pypi_url=self.info.pypi_url,
            test_command=TEST_COMMAND,
            test_env=TEST_ENV,
            environment_setup_commit=environment_commit,
            passing_tests=len(self.baseline.passing),
        )
        instances = [
            self._instance(n, draft, environment_commit) for n, draft in enumerate(drafts, 1)
        ]
        return project, instances

    def _copy(self, tree: Path) -> Path:
        dest = self.work / f"t{next(self._serials)}"
        shutil.copytree(tree, dest, symlinks=True)
        return dest

    # --- search --------------------------------------------------------------------------------

    def _ordered_candidates(self) -> list[tuple[str, Candidate]]:
        """Each kind's candidates shuffled with the seed, kinds interleaved; those that no test
        file over ``max_hidden_bytes`` runs come first (any other may be rejected for the size
        of the files it would hide)."""
        by_kind: dict[str, list[tuple[str, Candidate]]] = {}
        for path in self.modules:
            text = (self.clean / path).read_text(encoding="utf-8")
            for candidate in find_candidates(text, self.config.kinds):
                by_kind.setdefault(candidate.kind, []).append((path, candidate))
        rng = random.Random(self.config.seed)
        for group in by_kind.values():
            rng.shuffle(group)
        groups = [by_kind[kind] for kind in MUTATORS if kind in by_kind]
        interleaved = [
            group[i]
            for i in range(max(map(len, groups), default=0))
            for group in groups
            if i < len(group)
        ]
        return sorted(interleaved, key=lambda item: not self._hides_small_files(*item))

    def _hides_small_files(self, path: str, candidate: Candidate) -> bool:
        running = self.baseline.tests_running(path, candidate.line, candidate.end_line)
        return running is not None and not any(self._too_large([_file(t)]) for t in running)

    def _search(self) -> list[_Draft]:
        candidates = self._ordered_candidates()
        self.tally.candidates = len(candidates)
        self.on_progress(self.tally)
        trees: Queue[Path] = Queue()
        for _ in range(self.config.jobs):
            trees.put(self._copy(self.clean))
        deadline = time.monotonic() + self.config.time_budget
        used: set[tuple[str, str]] = set()
        drafts: list[_Draft] = []
        pending: list[tuple[tuple[str, str], Future[_Draft]]] = []
        queue: Iterator[tuple[str, Candidate]] = iter(candidates)
        with ThreadPoolExecutor(self.config.jobs) as pool:
            while True:
                while len(pending) < self.config.jobs and time.monotonic() < deadline:
                    item = next(queue, None)
                    if item is None:
                        break
                    path, candidate = item
                    key = (path, candidate.function)
                    if key in used or any(key == k for k, _ in pending):
                        self._reject("function already has a bug", tried=False)
                        continue
                    pending.append((key, pool.submit(self._evaluate, path, candidate, trees)))
                if not pending:
                    self.tally.done = True
                    self.on_progress(self.tally)
                    return drafts
                key, future = pending.pop(0)
                try:
                    draft = future.result()
                except _Rejected as reason:
                    self._reject(str(reason))
                    continue
                if len(drafts) < self.config.max_instances:
                    drafts.append(draft)
                    used.add(key)
                    self.tally.kept += 1
                self.tally.tried += 1
                self.on_progress(self.tally)
                if len(drafts) == self.config.max_instances:
                    deadline = 0.0

    def _reject(self, reason: str, tried: bool = True) -> None:
        self.tally.tried += tried
        self.tally.rejected[reason] += 1
        self.on_progress(self.tally)

    def _evaluate(self, path: str, candidate: Candidate, trees: Queue[Path]) -> _Draft:
        passing = self.baseline.passing
        running = self.baseline.tests_running(path, candidate.line, candidate.end_line)
        if running is not None and not running:
            raise _Rejected("no test runs the code")
        files = None if running is None else sorted({_file(test) for test in running})
        if files and all(self._too_large([file]) for file in files):
            raise _Rejected("hidden test files too large")
        clean_text = (self.clean / path).read_text(encoding="utf-8")
        try:
            buggy_text = mutate(clean_text, candidate)
        except MutationError:
            raise _Rejected("rewrite not exact") from None
        tree = trees.get()
        try:
            (tree / path).write_text(buggy_text, encoding="utf-8", newline="")
            # Stop once more tests fail than a bug may fail (beside the clean tree's failures):
            # the bug is rejected then, and failing tests are the slow ones.
            maxfail = self.config.max_fail + 1 + self.baseline.broken
            run = self._run(tree, files=files, maxfail=maxfail, explain=False)
        finally:
            (tree / path).write_text(clean_text, encoding="utf-8", newline="")
            trees.put(tree)
        ran = passing if files is None else {test for test in passing if _file(test) in files}
        fail_to_pass = sorted(test for test in ran if run.outcomes.get(test) != "passed")
        if not fail_to_pass:
            raise _Rejected("no test fails")
        if not self.config.min_fail <= len(fail_to_pass) <= self.config.max_fail:
            raise _Rejected(f"not {self.config.min_fail}..{self.config.max_fail} tests fail")
        if any(run.outcomes.get(test) not in ("failed", "error") for test in fail_to_pass):
            raise _Rejected("a failing test did not run")
        hidden = sorted({_file(test) for test in fail_to_pass})
        if not all(is_test_file(file) and file != path for file in hidden):
            raise _Rejected("a failing test is not in a test module")
        if self._too_large(hidden):
            raise _Rejected("hidden test files too large")
        pass_to_pass = self._pass_to_pass(set(fail_to_pass), hidden)
        base = self._copy(self.clean)
        (base / path).write_text(buggy_text, encoding="utf-8", newline="")
        for file in hidden:
            (base / file).unlink()
        patch, test_patch = write_patches(self.clean, self._copy(base), path, hidden)
        failures = self._verify(base, patch, test_patch, fail_to_pass, pass_to_pass, hidden)
        return _Draft(
            candidate, path, base, fail_to_pass, pass_to_pass, failures, patch, test_patch, hidden
        )

    def _too_large(self, files: list[str]) -> bool:
        return sum((self.clean / f).stat().st_size for f in files) > self.config.max_hidden_bytes

    def _run(
        self,
        tree: Path,
        files: list[str] | None = None,
        maxfail: int | None = None,
        explain: bool = True,
    ) -> SuiteRun:
        try:
            return self.runner.run(tree, files=files, maxfail=maxfail, explain=explain)
        except SuiteError:
            raise _Rejected("suite timed out or crashed") from None

    def _pass_to_pass(self, failing: set[str], hidden: list[str]) -> list[str]:
        """A seeded sample of at most ``p2p_max`` of the other passing tests, half from the
        hidden test files and the rest from the others when both have enough. (Verification
        checks that they pass with the bug.)"""
        passing = sorted(self.baseline.passing - failing)
        in_hidden = [test for test in passing if _file(test) in hidden]
        others = [test for test in passing if _file(test) not in hidden]
        cap = self.config.p2p_max
        if cap < 0 or len(passing) <= cap:
            return passing
        from_hidden = min(len(in_hidden), max(cap // 2, cap - len(others)))
        from_others = min(len(others), cap - from_hidden)
        rng = random.Random(f"{self.config.seed}:{','.join(sorted(failing))}")
        return sorted(rng.sample(in_hidden, from_hidden) + rng.sample(others, from_others))

    # --- patches and verification ---------------------------------------------------------------

    def _verify(
        self,
        base: Path,
        patch: str,
        test_patch: str,
        fail_to_pass: list[str],
        pass_to_pass: list[str],
        hidden: list[str],
    ) -> dict[str, Failure]:
        """Check the patches on copies of ``base`` (see the module's docstring); the failures
        of FAIL_TO_PASS with ``test_patch`` applied, for the problem statement."""
        tree = self._copy(base)
        try:
            for diff in (patch, test_patch):
                check_applies(tree, diff)
        except RuntimeError:
            raise _Rejected("verification: a patch does not apply") from None
        visible = [test for test in pass_to_pass if _file(test) not in hidden]
        run = self._run(tree, explain=False)
        if run.collect_errors or not _all(run, visible, "passed"):
            raise _Rejected("verification: the base tree's suite does not pass")
        shutil.rmtree(tree)
        tree = self._copy(base)
        git_apply(tree, test_patch)
        run = self._run(tree)
        failing = {test for test in self.baseline.passing if run.outcomes.get(test) != "passed"}
        if failing != set(fail_to_pass) or not _all(run, pass_to_pass, "passed"):
            raise _Rejected("verification: tests differ on the base tree")
        failures = {test: run.failures[test] for test in fail_to_pass if test in run.failures}
        git_apply(tree, patch)
        run = self._run(tree, explain=False)
        if not _all(run, fail_to_pass + pass_to_pass, "passed"):
            raise _Rejected("verification: the gold patch does not fix the tests")
        shutil.rmtree(tree)
        return failures

    def _instance(self, n: int, draft: _Draft, environment_commit: str) -> SWEInstance:
        instance_id = f"{self.info.name}__{self.info.version}-{n}"
        base_commit = commit_tree(draft.base, instance_id)
        statement = problem_statement(
            instance_id,
            self.info.name,
            self.info.version,
            draft.fail_to_pass,
            draft.failures,
            scrub=[str(self.work)],
        )
        candidate = draft.candidate
        info = TaskgenInfo(
            project=self.info.name,
            sdist=self.info.path.name,
            mutation=candidate.kind,
            file=draft.file,
            line=candidate.line,
            end_line=candidate.end_line,
            function=candidate.function,
            hidden_tests=draft.hidden,
            seed=self.config.seed,
        )
        return SWEInstance(
            instance_id=instance_id,
            repo=f"{REPO_OWNER}/{self.info.name}",
            base_commit=base_commit,
            problem_statement=statement,
            patch=draft.patch,
            test_patch=draft.test_patch,
            FAIL_TO_PASS=draft.fail_to_pass,
            PASS_TO_PASS=draft.pass_to_pass,
            version=self.info.version,
            environment_setup_commit=environment_commit,
            created_at=CREATED_AT,
            agentrl_taskgen=info,
        )


def _all(run: SuiteRun, tests: list[str], outcome: str) -> bool:
    return all(run.outcomes.get(test) == outcome for test in tests)


def _file(test: str) -> str:
    """The file of a pytest node id."""
    return test.split("::")[0]
