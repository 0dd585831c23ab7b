"""Deprecated: moved to :mod:`agentrl.algorithms.off_policy`; this alias goes in the next release."""

import sys
import warnings

from agentrl.algorithms import off_policy as _moved

warnings.warn(
    "agentrl.trainer.off_policy moved to agentrl.algorithms.off_policy",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
