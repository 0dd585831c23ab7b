"""Run every benchmark in bench/ in turn: ``python -m bench`` (or ``make bench``).

Each benchmark measures its baseline and agentrl's code in the same process run and prints ratios.
Pass benchmark names to run only those: ``python -m bench rollout``.
"""

import subprocess
import sys
from pathlib import Path

BENCHES = sorted(p.stem.removeprefix("bench_") for p in Path(__file__).parent.glob("bench_*.py"))


def main(names: list[str]) -> int:
    unknown = set(names) - set(BENCHES)
    if unknown:
        print(f"unknown benchmarks {sorted(unknown)}; available: {BENCHES}", file=sys.stderr)
        return 2
    failed = []
    for name in names or BENCHES:
        print(f"\n=== bench_{name} ===", flush=True)
        if subprocess.run([sys.executable, "-m", f"bench.bench_{name}"]).returncode:
            failed.append(name)
    if failed:
        print(f"failed: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
