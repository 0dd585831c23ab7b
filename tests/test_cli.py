"""The ``agentrl`` command: every subcommand parses, and only the one given is imported."""

import subprocess
import sys

import pytest

from agentrl.cli import SUBCOMMANDS, build_parser


def test_every_subcommand_registers_its_arguments():
    parser = build_parser()
    for name in SUBCOMMANDS:
        with pytest.raises(SystemExit) as done:
            parser.parse_args([name, "--help"])
        assert done.value.code == 0


def test_only_the_given_subcommand_is_imported():
    # A fresh interpreter: which agentrl modules did `agentrl env serve --help` import?
    script = (
        "import sys\n"
        "from agentrl.cli import main\n"
        "try:\n"
        "    main(['env', 'serve', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(','.join(sorted(m for m in sys.modules if m.startswith('agentrl.'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    imported = set(done.stdout.strip().splitlines()[-1].split(","))
    assert "agentrl.env_server.cli" in imported
    for name, (module, _) in SUBCOMMANDS.items():
        if name != "env":
            assert module not in imported, f"agentrl env serve imported {module}"


def test_unknown_and_missing_commands_are_refused_with_the_list():
    for argv in (["bogus"], []):
        done = subprocess.run(
            [sys.executable, "-m", "agentrl.cli", *argv],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2
        assert "COMMAND" in done.stderr
