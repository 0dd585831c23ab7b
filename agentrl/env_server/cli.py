"""``agentrl env serve ENV_ID [key=value ...]``: a registered environment in OpenEnv's protocol."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="env_command", required=True, metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="serve an environment over HTTP and WebSocket in OpenEnv's protocol",
        description="Serve a registered environment (agentrl/Math-v0, a plugin's id, ...) at "
        "OpenEnv's routes (/ws sessions, /reset, /step, /state, /schema, /health, /metadata, "
        "/mcp): each session is its own environment instance. docs/env_serving.md has the "
        "mapping.",
    )
    serve.add_argument("env_id", help="a registered environment id, e.g. agentrl/Math-v0")
    serve.add_argument(
        "kwargs",
        nargs="*",
        metavar="key=value",
        help="the environment's keyword arguments (values read as YAML: max_turns=4 "
        "mode=multi), as gymnasium.make takes them",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    serve.add_argument(
        "--max-sessions",
        type=int,
        default=64,
        help="most sessions (environment instances) open at once (default 64); one more is "
        "refused with OpenEnv's CAPACITY_REACHED",
    )
    serve.add_argument(
        "--session-timeout-s",
        type=float,
        default=600.0,
        help="close a session idle for this long, in seconds (default 600; 0: never)",
    )
    serve.add_argument(
        "--max-body-bytes",
        type=int,
        default=4 << 20,
        help="largest HTTP body or WebSocket message accepted (default 4 MiB)",
    )


def parse_kwargs(items: list[str]) -> dict[str, Any]:
    """``["a=1", "b=x"]`` -> ``{"a": 1, "b": "x"}`` (values read as YAML); ValueError naming a
    malformed item."""
    import yaml

    kwargs: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"environment argument {item!r}: expected key=value")
        try:
            kwargs[key] = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError as exc:
            raise ValueError(f"environment argument {item!r}: not valid YAML ({exc})") from None
    return kwargs


def run(args: argparse.Namespace) -> int:
    import agentrl
    from agentrl.env_server.server import EnvServer
    from agentrl.envs import AgentEnv, make_env

    where = "agentrl env serve"
    if args.max_sessions < 1 or args.max_body_bytes < 1 or args.session_timeout_s < 0:
        print(
            f"{where}: error: --max-sessions and --max-body-bytes must be positive and "
            "--session-timeout-s at least 0",
            file=sys.stderr,
        )
        return 2
    try:
        kwargs = parse_kwargs(args.kwargs)
        # One environment made and closed up front: an unknown id or a bad argument stops the
        # command here, with the environment's own message, instead of failing every session.
        probe = make_env(args.env_id, **kwargs)
        probe.close()
    except Exception as exc:
        print(f"{where}: error: {args.env_id}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    base = probe.unwrapped
    doc = (type(base).__doc__ or args.env_id).strip().splitlines()
    server = EnvServer(
        args.env_id,
        lambda: make_env(args.env_id, **kwargs),
        description=doc[0] if doc else args.env_id,
        version=agentrl.__version__,
        max_sessions=args.max_sessions,
        session_timeout_s=args.session_timeout_s or None,
        max_body_bytes=args.max_body_bytes,
        num_tasks=base.num_tasks if isinstance(base, AgentEnv) else None,
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve_until_stopped(server, args.host, args.port))
    return 0


async def _serve_until_stopped(server: Any, host: str, port: int) -> None:
    """Serve until SIGTERM or SIGINT; the sessions' environments are closed either way."""
    from agentrl.env_server.server import serve

    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await serve(server, host=host, port=port)
