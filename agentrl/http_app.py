"""Serving an aiohttp application until cancelled: the one way every ``agentrl`` server starts.

``agentrl serve``, ``agentrl gateway``, ``agentrl env serve`` and ``agentrl retriever serve`` all
listen the same way: the socket is bound, then one line ending in ``(ready)`` is printed (what
scripts and tests wait for), then ``ready`` is set, and the runner is cleaned up on every exit
path (cancellation, Ctrl-C, an error while binding).
"""

from __future__ import annotations

import asyncio

from aiohttp import web


async def serve_app(
    app: web.Application,
    host: str,
    port: int,
    banner: str,
    ready: asyncio.Event | None = None,
) -> None:
    """Serve ``app`` on ``host:port`` until cancelled; print ``"{banner} (ready)"`` once the
    socket listens, then set ``ready``."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        print(f"{banner} (ready)", flush=True)
        if ready is not None:
            ready.set()
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
