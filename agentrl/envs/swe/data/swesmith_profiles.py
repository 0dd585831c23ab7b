"""SWE-smith repository profiles of agentrl's shipped SWE projects.

Run by swesmith (``agentrl/envs/swe/swesmith_side.py``, when ``$AGENTRL_SWESMITH_PROFILES``
names this file) in the swebench side interpreter: it imports swesmith, not agentrl. One
SWE-smith ``PythonProfile`` per project file in ``projects/`` next to it, registered as SWE-smith
registers its own: owner ``agentrl-taskgen``, the project's name, the clean tree's commit
(``environment_setup_commit``), and the project's test command in SWE-smith's ``--verbose`` form,
without the conda activation (the images have no conda). See
:mod:`agentrl.envs.swe.swesmith_rows`.
"""

import json
from dataclasses import field, make_dataclass
from pathlib import Path

from swesmith.profiles import registry
from swesmith.profiles.python import PythonProfile

OWNER = "agentrl-taskgen"
PYTEST = "python3 -m pytest -p no:cacheprovider --rootdir=. --disable-warnings --color=no --tb=no --verbose"

for path in sorted((Path(__file__).parent / "projects").glob("*.json")):
    project = json.loads(path.read_text())
    env = " ".join(f"{key}={value}" for key, value in sorted(project["test_env"].items()))
    profile = make_dataclass(
        f"AgentrlTaskgen_{project['name']}",
        [
            ("owner", str, field(default=OWNER)),
            ("repo", str, field(default=project["name"])),
            ("commit", str, field(default=project["environment_setup_commit"])),
            ("test_cmd", str, field(default=f"{env} {PYTEST}".strip())),
        ],
        bases=(PythonProfile,),
    )
    registry.register_profile(profile)
