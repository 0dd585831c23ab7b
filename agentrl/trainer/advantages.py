"""Deprecated: moved to :mod:`agentrl.algorithms.advantages`; this alias goes in the next release."""

import sys
import warnings

from agentrl.algorithms import advantages as _moved

warnings.warn(
    "agentrl.trainer.advantages moved to agentrl.algorithms.advantages",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
