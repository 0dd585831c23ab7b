"""``POST /mcp`` (and the ``mcp`` WebSocket message): JSON-RPC 2.0 as OpenEnv 0.10.0's
``mcp_handler`` answers it for an environment without MCP tools.

OpenEnv's session methods work: ``openenv/session/create`` opens a session (one environment
instance, counted towards the limit) whose id the HTTP routes and ``/ws?session_id=`` take, and
``openenv/session/close`` closes one (``closing: true`` while a WebSocket drives it: it closes
when that connection ends). ``tools/list`` and ``tools/call`` answer -32603 "Environment does not
support MCP": an agentrl environment's tools are called through the assistant's text, in step.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentrl.env_server.sessions import (
    EnvFactoryError,
    Session,
    SessionCapacityError,
    SessionTable,
    UnknownSession,
)

# JSON-RPC 2.0 error codes as OpenEnv's JsonRpcErrorCode (mcp_types.py) numbers them.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_ERROR = -32000


class JsonRpcRequest(BaseModel):
    """OpenEnv's JsonRpcRequest (the body of ``POST /mcp``)."""

    model_config = ConfigDict(extra="forbid")

    jsonrpc: str = Field(pattern="^2\\.0$")
    method: str
    params: dict[str, Any] = Field(default_factory=dict)
    id: str | int | None = None


def jsonrpc_error(
    request_id: str | int | None, code: int, message: str, data: Any = None
) -> dict[str, Any]:
    """A JSON-RPC 2.0 error response as OpenEnv's ``JsonRpcResponse.model_dump`` writes it."""
    error: dict[str, Any] = {"code": code, "message": message, "data": data}
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def jsonrpc_result(request_id: str | int | None, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


async def answer_jsonrpc(
    body: Any, sessions: SessionTable, env_id: str, ws_session: Session | None = None
) -> dict[str, Any]:
    """The JSON-RPC response to ``body``; ``ws_session`` is the session of the WebSocket the
    request came on, if any."""
    try:
        request = JsonRpcRequest.model_validate(body)
    except ValidationError as exc:
        return jsonrpc_error(None, INVALID_REQUEST, f"Invalid request: {exc}")
    rid, params = request.id, request.params
    if request.method == "openenv/session/create":
        if ws_session is not None:
            return jsonrpc_result(rid, {"session_id": ws_session.id})
        try:
            session = await sessions.open()
        except SessionCapacityError as exc:
            data = {"active_sessions": exc.active, "max_sessions": exc.max_sessions}
            return jsonrpc_error(rid, SERVER_ERROR, str(exc), data)
        except EnvFactoryError as exc:
            return jsonrpc_error(rid, SERVER_ERROR, str(exc), {"factory_name": env_id})
        return jsonrpc_result(rid, {"session_id": session.id})
    if request.method == "openenv/session/close":
        target = params.get("session_id")
        if not target or not isinstance(target, str):
            message = "Invalid params - 'session_id' is required"
            return jsonrpc_error(rid, INVALID_PARAMS, message)
        if ws_session is not None and target == ws_session.id:
            message = "Cannot close active WebSocket-managed session via MCP method"
            return jsonrpc_error(rid, INVALID_REQUEST, message)
        try:
            session = sessions.get(target)
        except UnknownSession as exc:
            return jsonrpc_error(rid, INVALID_PARAMS, str(exc))
        if session.attached:
            session.close_requested = True
            return jsonrpc_result(rid, {"session_id": target, "closed": False, "closing": True})
        await sessions.close(target)
        return jsonrpc_result(rid, {"session_id": target, "closed": True})
    if request.method in ("tools/list", "tools/call"):
        return jsonrpc_error(rid, INTERNAL_ERROR, "Environment does not support MCP")
    return jsonrpc_error(rid, METHOD_NOT_FOUND, f"Method not found: {request.method}")
