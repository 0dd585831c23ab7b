"""Engines placed as Ray actors: one server per actor, anywhere on a Ray cluster, driven over HTTP.

``await launch_ray_engines(count, model=...)`` creates ``count`` :class:`EngineServerActor` actors.
Each reserves its resources (``num_gpus`` per engine: one GPU per SGLang server, 0 on CPUs), starts
a server on its node (``agentrl serve``, or ``python -m sglang.launch_server`` with
``server="sglang"``; Ray sets ``CUDA_VISIBLE_DEVICES`` to the actor's GPUs) and reports the URL it
listens on. The driver gets started :class:`SGLangEngine` clients for those URLs, ready for an
:class:`~agentrl.engine_pool.pool.EnginePool`. The server is the actor's child and is killed with it
(``PR_SET_PDEATHSIG``: :func:`~agentrl.engine_pool.sglang_engine.die_with_parent`), so
``ray.kill(actor)`` or a lost node takes its engine down, and the pool reroutes its requests.

Multi-node launch::

    # node 0 (the head, where the trainer runs)
    ray start --head --port 6379
    # every other node
    ray start --address <head-ip>:6379
    # the driver
    ray.init(address="auto")
    engines = await launch_ray_engines(8, model="/models/qwen", server="sglang", num_gpus=1)
    async with EnginePool(engines) as pool: ...

Servers bind ``0.0.0.0`` on ports chosen by their node, so the nodes must reach each other's ports
(one cluster network, as Ray itself requires). Ray is optional: ``pip install 'agentrl[ray]'``.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Literal

from agentrl.engine_pool.engine import EngineError
from agentrl.engine_pool.sglang_engine import SGLangEngine, die_with_parent, free_port


class EngineServerActor:
    """The body of the Ray actor: starts one engine server on its node and keeps it alive."""

    def __init__(
        self,
        model: str,
        server: Literal["agentrl", "sglang"] = "agentrl",
        extra_args: tuple[str, ...] = (),
        startup_timeout: float = 600.0,
    ) -> None:
        self.port = free_port("0.0.0.0")
        self.host = _node_ip()
        if server == "agentrl":
            command = [sys.executable, "-m", "agentrl.cli", "serve", model]
        elif server == "sglang":
            # with its tokenizer: stop strings need it (see sglang_command)
            command = [sys.executable, "-m", "sglang.launch_server", "--model-path", model]
        else:
            raise ValueError(f"server must be 'agentrl' or 'sglang', got {server!r}")
        command += ["--host", "0.0.0.0", "--port", str(self.port), *extra_args]
        self.log = tempfile.NamedTemporaryFile(prefix="agentrl-engine-", suffix=".log")  # noqa: SIM115
        self.process = subprocess.Popen(
            command, stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent()
        )
        self._wait_healthy(startup_timeout)

    def url(self) -> str:
        """Where the server answers, reachable from the other nodes."""
        return f"http://{self.host}:{self.port}"

    def pid(self) -> int:
        """The server process's pid on its node."""
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = Path(self.log.name).read_bytes()[-2000:].decode(errors="replace")
                raise EngineError(f"the engine server exited ({self.process.returncode}): {tail}")
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.port}/health_generate", timeout=5
                ) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise EngineError(
            f"the engine server on port {self.port} was not healthy after {timeout:g} s"
        )


async def launch_ray_engines(
    count: int,
    *,
    model: str,
    server: Literal["agentrl", "sglang"] = "agentrl",
    num_gpus: float = 0,
    num_cpus: float = 1,
    extra_args: tuple[str, ...] = (),
    startup_timeout: float = 600.0,
    **engine_options: Any,
) -> tuple[list[SGLangEngine], list[Any]]:
    """Start ``count`` engine-server actors and return (started clients, actor handles).

    Needs ``ray.init(...)`` first. ``engine_options`` go to :class:`SGLangEngine` (timeouts).
    Keep the actor handles: dropping them lets Ray reclaim the actors and their servers.
    """
    import ray

    remote = ray.remote(num_gpus=num_gpus, num_cpus=num_cpus)(EngineServerActor)
    # Actor handles are dynamic: their methods' `.remote` is Ray's, not the class's.
    actors: list[Any] = [
        remote.remote(model, server, tuple(extra_args), startup_timeout) for _ in range(count)
    ]
    urls = await asyncio.gather(*(_await_ref(actor.url.remote()) for actor in actors))
    engines = [await SGLangEngine(url, **engine_options).start() for url in urls]
    return engines, actors


async def _await_ref(ref: Any) -> Any:
    return await ref  # Ray object refs are awaitable inside asyncio


def _node_ip() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:
        return "127.0.0.1"
