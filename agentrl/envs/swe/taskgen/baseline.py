"""What the clean tree's suite says: which tests pass, and which tests run which source lines.

The suite runs twice on copies of the clean tree, the first time traced: the *passing* tests are
those that pass both times, and for each line of the source modules the trace gives the passing
tests that ran it. A bug in lines no test runs cannot fail a test, so the generator does not try
it; a bug in lines some tests run is tried on those tests' files only. Lines run outside any test
(module code run when tests import the package) affect every test. The trace does not follow
child processes nor state kept between tests (a module-scoped fixture computed by the first test
that uses it), so a bug may fail tests it does not name; the generator's verification reruns the
whole suite and rejects such bugs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agentrl.envs.swe.taskgen.testrun import SuiteRunner


@dataclass(frozen=True)
class Baseline:
    passing: frozenset[str]
    """Tests that passed in both runs."""
    broken: int
    """Tests that failed or errored in either run."""
    seconds: float
    """The untraced run's duration."""
    covering: dict[tuple[str, int], frozenset[str]]
    """(module path, line) -> the passing tests that ran the line."""
    at_import: frozenset[tuple[str, int]]
    """Lines run outside any test."""

    def tests_running(self, path: str, first: int, last: int) -> frozenset[str] | None:
        """The passing tests that run any of lines ``first``..``last`` of ``path``; None when
        the lines run outside tests (every test may depend on them)."""
        lines = [(path, line) for line in range(first, last + 1)]
        if any(line in self.at_import for line in lines):
            return None
        return frozenset().union(*(self.covering.get(line, frozenset()) for line in lines))


def measure_baseline(
    runner: SuiteRunner, fresh_copy: Callable[[], Path], modules: list[str]
) -> Baseline:
    """Run the suite twice, each time in ``fresh_copy()`` of the clean tree, tracing ``modules``
    (relative paths) in the first run."""
    traced_tree = fresh_copy()
    real = {str((traced_tree / module).resolve()): module for module in modules}
    traced = runner.run(traced_tree, trace=[traced_tree / module for module in modules])
    plain = runner.run(fresh_copy())
    passing = frozenset(traced.passed & plain.passed)
    broken = {
        test
        for run in (traced, plain)
        for test, outcome in run.outcomes.items()
        if outcome in ("failed", "error")
    }
    covering: dict[tuple[str, int], set[str]] = {}
    at_import: set[tuple[str, int]] = set()
    for test, files in traced.lines.items():
        for file, lines in files.items():
            module = real.get(file)
            if module is None:
                continue
            for line in lines:
                if test == "":
                    at_import.add((module, line))
                elif test in passing:
                    covering.setdefault((module, line), set()).add(test)
    return Baseline(
        passing=passing,
        broken=len(broken),
        seconds=plain.seconds,
        covering={line: frozenset(tests) for line, tests in covering.items()},
        at_import=frozenset(at_import),
    )
