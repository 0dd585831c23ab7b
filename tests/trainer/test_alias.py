"""agentrl.trainer, deprecated: importing it warns once, and every old module path is the moved
module itself (in a fresh interpreter: the aliases live in sys.modules)."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import agentrl.trainer as trainer
assert [str(w.message) for w in caught if w.category is DeprecationWarning] == [
    "agentrl.trainer is deprecated and goes in the next release: import from agentrl.algorithms, "
    "agentrl.training, agentrl.rl or agentrl.rollout.stream (see agentrl.trainer.MOVED)"
], caught
import importlib
for old, new in trainer.MOVED.items():
    assert importlib.import_module(f"agentrl.trainer.{old}") is importlib.import_module(new), old
from agentrl.trainer.loop import Trainer
from agentrl.rl.loop import Trainer as moved
assert Trainer is moved
import agentrl.trainer.gae
from agentrl.algorithms.gae import gae
assert trainer.gae is gae  # the re-exported function, not the module of the same name
print("ok")
"""


def test_old_paths_are_the_moved_modules_with_one_deprecation_warning():
    done = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
