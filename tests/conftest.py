"""Fixtures shared by the whole suite.

The SmolLM2 model (~25 s to load from the GGUF) and its tokenizer (~11 s) are loaded once per session.
``AGENTRL_TEST_MODEL`` may name another model reference (e.g. a local directory saved from the same
GGUF, which loads in ~5 s) for faster local iteration; it defaults to ``smollm2``.
"""

import os
import sys
import warnings
from pathlib import Path

import pytest

from agentrl.models import load_model, load_tokenizer

# The example plugin package is importable in-tree for unit tests; test_registration also installs it
# for real to exercise entry-point discovery.
PLUGIN_DIR = Path(__file__).parent / "plugins" / "agentrl-echo"
sys.path.insert(0, str(PLUGIN_DIR))

MODEL = os.environ.get("AGENTRL_TEST_MODEL", "smollm2")


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer(MODEL)


@pytest.fixture(scope="session")
def smollm2():
    """The shared float32 model. Tests that change its weights restore them before returning."""
    return load_model(MODEL, dtype="float32")


@pytest.fixture
def strict_gymnasium_warnings():
    """Turn every warning (gymnasium's checker warns rather than fails) into an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield
