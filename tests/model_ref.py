"""The model reference the tests load: ``AGENTRL_TEST_MODEL``, default ``smollm2``. A module of its
own so test files can import it (``from conftest import ...`` names whichever conftest module was
imported first under that name, which differs between runs)."""

import os

MODEL = os.environ.get("AGENTRL_TEST_MODEL", "smollm2")
