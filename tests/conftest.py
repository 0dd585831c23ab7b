import sys
from pathlib import Path

# The example plugin package is importable in-tree for unit tests; test_registration also installs it
# for real to exercise entry-point discovery.
PLUGIN_DIR = Path(__file__).parent / "plugins" / "agentrl-echo"
sys.path.insert(0, str(PLUGIN_DIR))


import warnings  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture
def strict_gymnasium_warnings():
    """Turn every warning (gymnasium's checker warns rather than fails) into an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield
