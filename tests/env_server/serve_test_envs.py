"""``agentrl env serve`` with the tests' environments registered: ``python serve_test_envs.py
serve ENV_ID ...`` parses and runs the command's own ``add_arguments``/``run``, as ``agentrl``
does, without importing every other subcommand (``agentrl.rl.cli`` alone takes seconds).

- ``tests/Echo-v0``: the example plugin's EchoEnv (say the secret word; the word depends on the seed).
- ``tests/InfraFault-v0``: a step whose text holds ``fault`` reports an infrastructure error
  (``info["infra_error"]``) with reward 0, as Code-v0 does when no grading sandbox starts; with
  ``fail_after=N`` the constructor raises after N instances (the server's probe is the first);
  with ``closed_log=PATH`` each ``aclose`` appends a line to PATH.
- ``tests/Turns-v0``: never ends an episode itself; each step's info says whether the step was
  the final turn (:attr:`AgentEnv.final_turn`); it has ``num_tasks=5`` tasks.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins" / "agentrl-echo"))

from agentrl.env_server import cli
from agentrl.envs import INFRA_ERROR, AgentEnv, register_env


class InfraFaultEnv(AgentEnv):
    """Say ok; a step holding "fault" could not be judged (infra_error)."""

    made: ClassVar[int] = 0

    def __init__(self, fail_after: int | None = None, closed_log: str | None = None) -> None:
        if fail_after is not None and InfraFaultEnv.made >= fail_after:
            raise RuntimeError(f"no sandbox left after {fail_after} environments")
        InfraFaultEnv.made += 1
        self.closed_log = closed_log

    async def aclose(self) -> None:
        if self.closed_log is not None:
            with open(self.closed_log, "a") as log:
                log.write(f"{id(self)}\n")

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        await super().areset(seed=seed, options=options)
        return [{"role": "user", "content": "Say ok."}], {"tools": []}

    async def astep(self, action: str):
        if "fault" in action:
            return [], 0.0, True, False, {INFRA_ERROR: "the grading sandbox could not start"}
        return [], float("ok" in action), True, False, {}


class TurnsEnv(AgentEnv):
    """Talk on; each step reports whether it was the final turn."""

    @property
    def num_tasks(self) -> int:
        return 5

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        await super().areset(seed=seed, options=options)
        return [{"role": "user", "content": "Talk."}], {"tools": []}

    async def astep(self, action: str):
        return (
            [{"role": "user", "content": "Go on."}],
            0.0,
            False,
            False,
            {"final_turn": self.final_turn},
        )


register_env("tests/Echo-v0", "agentrl_echo:EchoEnv")
register_env("tests/Turns-v0", TurnsEnv)
register_env("tests/InfraFault-v0", InfraFaultEnv)

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="agentrl env")
    cli.add_arguments(parser)
    raise SystemExit(cli.run(parser.parse_args(sys.argv[1:])))
