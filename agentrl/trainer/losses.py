"""Deprecated: moved to :mod:`agentrl.algorithms.losses`; this alias goes in the next release."""

import sys
import warnings

from agentrl.algorithms import losses as _moved

warnings.warn(
    "agentrl.trainer.losses moved to agentrl.algorithms.losses", DeprecationWarning, stacklevel=2
)
sys.modules[__name__] = _moved
