"""Start pytest for SWE-v0's grader so that nothing in the repository can stand in for it.

SWE-v0's grader (:mod:`agentrl.envs.swe.grading`) copies this file into the grading sandbox and
runs it from the repository's directory as::

    python3 -s pytest_entry.py REPO PLUGIN [--probe] -- PYTEST_ARGS...

Python puts this script's directory, not the working directory, first on ``sys.path`` (and ``-s``
leaves out the user's site-packages), so before anything of the repository can be imported:

1. ``pytest`` (and ``_pytest``, ``pluggy``, ...) is imported from the interpreter's installation:
   a ``pytest.py``, ``_pytest/`` or ``sitecustomize.py`` in the repository is never read;
2. the report plugin is loaded from its file (``PLUGIN``) and handed to pytest as an object, so
   no module of the repository can take its name;
3. only then is the repository *appended* to ``sys.path`` (``python -m pytest`` puts the working
   directory first), so the tests import its packages but none of its modules can shadow an
   installed or a standard one; the grader adds ``--import-mode=append`` so that pytest does the
   same for the test files' directories.

With ``--probe`` no test runs: it prints, as one JSON line after :data:`PROBE_MARK`, the rootdir and
configuration file that pytest chooses for ``PYTEST_ARGS`` (conftest files are not loaded).
Standard library and pytest only; works with pytest 6.1 and later.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

PROBE_MARK = "agentrl-pytest-probe:"
PLUGIN_MODULE = "agentrl_taskgen_report"


def _probe(pytest):
    """A plugin that prints pytest's rootdir and configuration file and stops before the
    session."""

    class Probe:
        @pytest.hookimpl(tryfirst=True)
        def pytest_cmdline_main(self, config):
            inifile = getattr(config, "inipath", None)
            found = {"rootdir": str(config.rootpath), "inifile": str(inifile) if inifile else None}
            print(PROBE_MARK + json.dumps(found), flush=True)
            return 0

    return Probe()


def _load_plugin(path: str):
    spec = importlib.util.spec_from_file_location(PLUGIN_MODULE, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[PLUGIN_MODULE] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> int:
    split = argv.index("--")
    (repo, plugin_path, *options), args = argv[:split], argv[split + 1 :]
    if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # this script's directory: only the interpreter's own paths remain
    import pytest

    plugin = _probe(pytest) if "--probe" in options else _load_plugin(plugin_path)
    sys.path.append(repo)
    sys.argv = [os.path.join(os.path.dirname(pytest.__file__), "__main__.py"), *args]
    return int(pytest.main(args, plugins=[plugin]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
