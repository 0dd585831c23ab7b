"""OpenAI's request schema, validated: what the gateway accepts, what it refuses, and why.

:func:`parse_chat_request` and :func:`parse_completion_request` turn a JSON body into a
:class:`ChatRequest` / :class:`CompletionRequest` or raise :class:`GatewayError` (an OpenAI error
object with its HTTP status) naming the bad field. Every field is one of:

* supported: ``model``, ``messages`` / ``prompt``, ``tools``, ``tool_choice`` (``"auto"``,
  ``"none"``, and, by constrained decoding, ``"required"`` and a named function
  ``{"type": "function", "function": {"name": ...}}``), ``response_format`` (``text``, and by
  constrained decoding ``json_object`` and ``json_schema``), ``n``, ``temperature``, ``top_p``, ``top_k`` and ``min_p`` (SGLang/vLLM extensions),
  ``max_tokens`` / ``max_completion_tokens``, ``stop``, ``seed``, ``logprobs`` (chat: a bool;
  completions: ``0``, the sampled tokens' log-probs), ``stream``, ``stream_options``
  (``include_usage``);
* accepted because they do not change what is generated: ``user``, ``metadata``,
  ``return_token_ids`` (token ids are always returned), an ``extra_body`` object holding only
  those (rllm-model-gateway's proxy sends ``"extra_body": {"return_token_ids": true}`` in the
  body, where the openai SDK's ``extra_body`` would have merged it), and the refused fields
  below at their default values (``frequency_penalty: 0``, ``top_logprobs: 0``,
  ``parallel_tool_calls: true``, ``logit_bias: {}``, ``echo: false``, ``best_of: 1``...);
* refused with 400 (the engine cannot honour them): any other value of those fields,
  ``top_logprobs > 0`` (engines return the sampled token's log-prob only), and every field not
  listed here.

Messages are normalised to the :data:`Message` form the rest of the gateway compares and renders:
``{"role", "content": str, optional "name", "tool_call_id", "tool_calls": [{"id", "name",
"arguments": dict}]}`` (``developer`` becomes ``system``; text parts are joined).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Literal

Message = dict[str, Any]
"""A normalised OpenAI message (see the module docstring)."""

_ROLES = {"system", "developer", "user", "assistant", "tool"}
_MESSAGE_KEYS = {
    "role", "content", "name", "tool_calls", "tool_call_id",
    # what the openai SDK writes back for an assistant message it received; null or empty only
    "refusal", "annotations", "audio", "function_call", "reasoning_content",
}  # fmt: skip
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# Fields accepted at these values only: a request asking for anything else is refused.
_DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "logit_bias": ({},),
    "top_logprobs": (0,),
    "parallel_tool_calls": (True,),
    "store": (False,),
    "echo": (False,),
    "best_of": (1,),
    "suffix": ("",),
    "min_tokens": (0,),
}
_IGNORED = {"user", "metadata", "return_token_ids"}
_COMMON = {
    "model", "n", "temperature", "top_p", "top_k", "min_p", "max_tokens", "stop", "seed",
    "stream", "stream_options", "logprobs",
}  # fmt: skip
_CHAT_FIELDS = _COMMON | {
    "messages", "tools", "tool_choice", "max_completion_tokens", "response_format",
}  # fmt: skip
_COMPLETION_FIELDS = _COMMON | {"prompt"}


class GatewayError(Exception):
    """An OpenAI error object and its HTTP status: ``{"error": {"message", "type", "param",
    "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None, code: str | None = None) -> GatewayError:
    return GatewayError(400, message, param=param, code=code)


@dataclass(frozen=True)
class Sampling:
    """The sampling fields both endpoints share, validated."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False
    stream: bool = False
    include_usage: bool = False


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: list[Message]
    tools: list[dict[str, Any]] | None
    tool_choice: Literal["auto", "none", "required"]
    """``"required"`` also stands for a named function, whose name is ``forced_tool``."""
    sampling: Sampling
    forced_tool: str | None = None
    json_schema: str | None = None
    """``response_format``'s schema as JSON text (``json_object``: any JSON object), or None."""


@dataclass(frozen=True)
class CompletionRequest:
    model: str
    prompt: str | list[int]
    sampling: Sampling


def parse_chat_request(body: Any) -> ChatRequest:
    """A ``/v1/chat/completions`` body, validated (see the module docstring)."""
    body = _object(body, "the request body")
    _check_fields(body, _CHAT_FIELDS)
    if "max_tokens" in body and "max_completion_tokens" in body:
        raise bad_request("give max_tokens or max_completion_tokens, not both", "max_tokens")
    if "max_completion_tokens" in body:
        body = {**body, "max_tokens": body["max_completion_tokens"]}
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad_request("messages must be a non-empty list of messages", "messages")
    messages = [normalize_message(m, f"messages[{i}]") for i, m in enumerate(raw)]
    tools = _tools(body.get("tools"))
    choice, forced = _tool_choice(body.get("tool_choice"), tools)
    logprobs = body.get("logprobs", False)
    if logprobs is not None and not isinstance(logprobs, bool):
        raise bad_request(f"logprobs must be a boolean, got {logprobs!r}", "logprobs")
    sampling = _sampling(body, bool(logprobs))
    schema = _response_format(body.get("response_format"))
    if schema is not None and choice == "required":
        raise bad_request(
            "response_format json_object or json_schema cannot be combined with tool_choice "
            "'required' or a named function: both constrain the whole reply",
            "response_format",
        )
    return ChatRequest(_model(body), messages, tools, choice, sampling, forced, schema)


def _response_format(value: Any) -> str | None:
    """OpenAI's ``response_format``: None for text, else the JSON schema the reply must meet."""
    kind = value.get("type") if isinstance(value, dict) else None
    if value is None or kind == "text":
        return None
    if kind == "json_object":
        return json.dumps({"type": "object"})
    spec = value.get("json_schema") if kind == "json_schema" else None
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise bad_request(
            "response_format must be {'type': 'text'}, {'type': 'json_object'} or "
            f"{{'type': 'json_schema', 'json_schema': {{'name': ..., 'schema': {{...}}}}}}, got {value!r}",
            "response_format",
        )
    return json.dumps(schema)


def _tool_choice(
    value: Any, tools: list[dict[str, Any]] | None
) -> tuple[Literal["auto", "none", "required"], str | None]:
    """OpenAI's ``tool_choice``: ``("auto" | "none" | "required", None)``, or ``("required",
    name)`` for a named function, which must be one of ``tools``."""
    if value is None or value in ("auto", "none"):
        return value or "auto", None
    if value == "required":
        if not tools:
            raise bad_request(
                "tool_choice 'required' needs at least one tool in tools", "tool_choice"
            )
        return "required", None
    function = value.get("function") if isinstance(value, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not (isinstance(value, dict) and value.get("type") == "function" and isinstance(name, str)):
        raise bad_request(
            f"tool_choice must be 'auto', 'none', 'required' or {{'type': 'function', "
            f"'function': {{'name': ...}}}}, got {value!r}",
            "tool_choice",
        )
    if name not in {tool["function"]["name"] for tool in tools or ()}:
        raise bad_request(
            f"tool_choice names the function {name!r}, which is not in tools", "tool_choice"
        )
    return "required", name


def parse_completion_request(body: Any) -> CompletionRequest:
    """A ``/v1/completions`` body, validated: one prompt, as text or token ids."""
    body = _object(body, "the request body")
    _check_fields(body, _COMPLETION_FIELDS)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list):
        if not prompt or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise bad_request(
                "prompt must be a string or a non-empty list of token ids (one prompt; batches "
                "are not supported)",
                "prompt",
            )
    elif not isinstance(prompt, str) or not prompt:
        raise bad_request("prompt must be a non-empty string or a list of token ids", "prompt")
    logprobs = body.get("logprobs")
    if logprobs not in (None, 0) or isinstance(logprobs, bool):
        raise bad_request(
            f"logprobs={logprobs!r} is not supported: engines return the sampled token's "
            "log-prob only; use logprobs=0",
            "logprobs",
        )
    return CompletionRequest(_model(body), prompt, _sampling(body, logprobs == 0))


def normalize_message(message: Any, where: str) -> Message:
    """One OpenAI chat message in the gateway's normalised form, or a 400 naming ``where``."""
    message = _object(message, where)
    unknown = sorted(set(message) - _MESSAGE_KEYS)
    if unknown:
        raise bad_request(f"{where} has unsupported keys {unknown}", f"{where}.{unknown[0]}")
    for key in ("audio", "function_call", "refusal"):
        if message.get(key):
            raise bad_request(f"{where}.{key} is not supported", f"{where}.{key}")
    role = message.get("role")
    if role not in _ROLES:
        raise bad_request(
            f"{where}.role must be one of {sorted(_ROLES)}, got {role!r}", f"{where}.role"
        )
    out: Message = {"role": "system" if role == "developer" else role}
    content = message.get("content")
    calls = message.get("tool_calls") or []
    if content is None and not (role == "assistant" and calls):
        raise bad_request(f"{where}.content is missing", f"{where}.content")
    out["content"] = _text(content, f"{where}.content")
    if message.get("name") is not None:
        out["name"] = _string(message["name"], f"{where}.name")
    if role == "tool":
        out["tool_call_id"] = _string(message.get("tool_call_id"), f"{where}.tool_call_id")
    if calls:
        if role != "assistant":
            raise bad_request(f"{where}.tool_calls is only for assistant messages", where)
        if not isinstance(calls, list):
            raise bad_request(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
        out["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(calls)]
    return out


def _tool_call(call: Any, where: str) -> dict[str, Any]:
    call = _object(call, where)
    if call.get("type", "function") != "function":
        raise bad_request(f"{where}.type must be 'function'", f"{where}.type")
    function = _object(call.get("function"), f"{where}.function")
    name = _string(function.get("name"), f"{where}.function.name")
    arguments = function.get("arguments", "{}")
    try:
        decoded = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError as exc:
        raise bad_request(
            f"{where}.function.arguments is not valid JSON: {exc}", f"{where}.function.arguments"
        ) from None
    if not isinstance(decoded, dict):
        raise bad_request(
            f"{where}.function.arguments must encode a JSON object",
            f"{where}.function.arguments",
        )
    return {"id": str(call.get("id") or ""), "name": name, "arguments": decoded}


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad_request("tools must be a list of function tools", "tools")
    names: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        tool = _object(tool, where)
        if tool.get("type") != "function":
            raise bad_request(f"{where}.type must be 'function'", f"{where}.type")
        function = _object(tool.get("function"), f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            raise bad_request(
                f"{where}.function.name must match {_TOOL_NAME.pattern}, got {name!r}",
                f"{where}.function.name",
            )
        if name in names:
            raise bad_request(f"two tools are named {name!r}", f"{where}.function.name")
        names.add(name)
        parameters = function.get("parameters", {"type": "object"})
        if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
            raise bad_request(
                f"{where}.function.parameters must be a JSON schema of type 'object'",
                f"{where}.function.parameters",
            )
        if not isinstance(function.get("description", ""), str):
            raise bad_request(
                f"{where}.function.description must be a string", f"{where}.function.description"
            )
    return [dict(tool) for tool in tools] or None


def _sampling(body: dict[str, Any], logprobs: bool) -> Sampling:
    n = _integer(body, "n", 1, 1, 128)
    seed = body.get("seed")
    if seed is not None and (not _is_int(seed) or not 0 <= seed < 2**63):
        raise bad_request(f"seed must be an integer in [0, 2**63), got {seed!r}", "seed")
    stop = body.get("stop")
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if not all(isinstance(s, str) and s for s in stops):
        raise bad_request("stop must be a non-empty string or a list of them", "stop")
    stream = body.get("stream", False) or False
    if not isinstance(stream, bool):
        raise bad_request("stream must be a boolean", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise bad_request("stream_options supports include_usage only", "stream_options")
    max_tokens = body.get("max_tokens")
    if max_tokens is not None:
        max_tokens = _integer(body, "max_tokens", 1, 1, 2**31)
    return Sampling(
        n=n,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        top_k=max(_integer(body, "top_k", 0, -1, 2**31), 0),  # -1 disables it (SGLang, vLLM)
        min_p=_number(body, "min_p", 0.0, 0.0, 1.0),
        max_tokens=max_tokens,
        stop=stops,
        seed=seed,
        logprobs=logprobs,
        stream=stream,
        include_usage=bool(options.get("include_usage", False)),
    )


def _check_fields(body: dict[str, Any], supported: set[str]) -> None:
    for key, value in body.items():
        if key in supported or key in _IGNORED or value is None:
            continue
        if key == "extra_body":  # a proxy's vendor extensions put in the body itself
            if not isinstance(value, dict):
                raise bad_request("extra_body must be an object", key)
            for extra in value:
                if extra not in _IGNORED:
                    raise bad_request(f"unsupported field 'extra_body.{extra}'", key)
            continue
        if key in _DEFAULT_ONLY:
            if value not in _DEFAULT_ONLY[key]:
                raise bad_request(
                    f"{key}={value!r} is not supported by this gateway (only "
                    f"{_DEFAULT_ONLY[key][0]!r})",
                    key,
                )
            continue
        raise bad_request(f"unsupported field {key!r}", key)


def _model(body: dict[str, Any]) -> str:
    return _string(body.get("model"), "model")


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad_request(f"{where} must be a JSON object", where)
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise bad_request(f"{where} must be a non-empty string, got {value!r}", where)
    return value


def _text(content: Any, where: str) -> str:
    """Message content as text: a string, null, or a list of text parts (joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise bad_request(
                    f"{where}[{i}]: only text parts are supported, got {part!r:.80}",
                    f"{where}[{i}]",
                )
            texts.append(_string(part.get("text"), f"{where}[{i}].text"))
        return "".join(texts)
    raise bad_request(f"{where} must be a string or a list of text parts", where)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _integer(body: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = body.get(key, default)
    value = default if value is None else value
    if not _is_int(value) or not low <= value <= high:
        raise bad_request(f"{key} must be an integer in [{low}, {high}], got {value!r}", key)
    return int(value)


def _number(
    body: dict[str, Any], key: str, default: float, low: float, high: float, low_open: bool = False
) -> float:
    value = body.get(key, default)
    value = default if value is None else value
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not (low < value if low_open else low <= value) or value > high:
        interval = f"{'(' if low_open else '['}{low}, {high}]"
        raise bad_request(f"{key} must be a number in {interval}, got {value!r}", key)
    return float(value)
