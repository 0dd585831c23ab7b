"""The HTTP routes' own shapes: ``POST /step``'s body and the OpenAPI document that
``openenv validate`` reads (``info.version``, and which of ``/reset``, ``/step``, ``/state`` are
served, which makes the server's mode "simulation")."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

OPENENV_API_VERSION = "1.0.0"
"""The version OpenEnv's FastAPI app declares in /openapi.json (profile ``openenv-http/1.x``)."""


class StepRequest(BaseModel):
    """The body of HTTP ``POST /step`` (OpenEnv's StepRequest; extra fields allowed)."""

    model_config = ConfigDict(extra="allow")

    action: dict[str, Any]
    timeout_s: float | None = Field(default=None, gt=0)
    request_id: str | None = Field(default=None, max_length=255)


def openapi_document(version: str) -> dict[str, Any]:
    """A minimal OpenAPI 3.1 document of the routes, enough for ``openenv validate`` (which
    reads ``info.version`` and which of ``/reset``, ``/step``, ``/state`` exist)."""
    json_body = {"content": {"application/json": {"schema": {"type": "object"}}}}
    ok = {"200": {"description": "OK", **json_body}}

    def route(method: str, summary: str) -> dict[str, Any]:
        operation: dict[str, Any] = {"summary": summary, "responses": ok}
        if method == "post":
            operation["requestBody"] = json_body
        return {method: operation}

    return {
        "openapi": "3.1.0",
        "info": {"title": "agentrl env serve (OpenEnv protocol)", "version": version},
        "paths": {
            "/reset": route("post", "Reset the environment"),
            "/step": route("post", "Execute an action in the environment"),
            "/state": route("get", "Get current environment state"),
            "/metadata": route("get", "Get environment metadata"),
            "/health": route("get", "Health check"),
            "/schema": route("get", "Get all JSON schemas"),
            "/mcp": route("post", "MCP JSON-RPC endpoint (OpenEnv's session methods)"),
        },
    }
