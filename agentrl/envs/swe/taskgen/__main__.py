"""``python -m agentrl.envs.swe.taskgen``: see :mod:`agentrl.envs.swe.taskgen.cli`."""

import sys

from agentrl.envs.swe.taskgen.cli import main

sys.exit(main())
