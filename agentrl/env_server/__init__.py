"""Environments as services: any registered agentrl environment served in OpenEnv's protocol
(``agentrl env serve``), many sessions per server, each its own environment instance."""

from agentrl.env_server.server import EnvServer, serve
from agentrl.env_server.sessions import SessionTable

__all__ = ["EnvServer", "SessionTable", "serve"]
