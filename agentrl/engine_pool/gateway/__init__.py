"""An OpenAI-compatible endpoint over any engine that records sessions as token-exact trajectories.

* :class:`Gateway` (:mod:`.service`): chat and text completions over an
  :class:`~agentrl.engine_pool.Engine` (the embedded engine, or an
  :class:`~agentrl.engine_pool.EnginePool` of SGLang / ``agentrl serve`` servers), templating with
  the rollout runner's :class:`~agentrl.tokenization.TrajectoryBuilder` and reading tool calls with
  the environments' parsers.
* :mod:`.protocol`: the request schema, what is supported and what is refused (400).
* :mod:`.sessions`: sessions -> segments -> :class:`~agentrl.tokenization.TokenTrajectory`, the
  checker's verdict per call, splits where the agent rewrote its history.
* :class:`GatewayRoutes` (:mod:`.routes`): the aiohttp routes ``agentrl serve`` and
  ``agentrl gateway`` serve.
"""

from agentrl.engine_pool.gateway.protocol import GatewayError
from agentrl.engine_pool.gateway.routes import SESSION_HEADER, GatewayRoutes
from agentrl.engine_pool.gateway.service import Gateway
from agentrl.engine_pool.gateway.sessions import (
    CallRecord,
    SegmentRecord,
    SessionRecord,
    SessionStore,
)

__all__ = [
    "SESSION_HEADER",
    "CallRecord",
    "Gateway",
    "GatewayError",
    "GatewayRoutes",
    "SegmentRecord",
    "SessionRecord",
    "SessionStore",
]
