"""Deprecated: moved to :mod:`agentrl.algorithms.gae`; this alias goes in the next release."""

import sys
import warnings

from agentrl.algorithms import gae as _moved

warnings.warn(
    "agentrl.trainer.gae moved to agentrl.algorithms.gae", DeprecationWarning, stacklevel=2
)
sys.modules[__name__] = _moved
