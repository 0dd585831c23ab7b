"""A tool: a typed Python function the agent can call, with a JSON schema built from its signature.

``Tool.from_function(fn)`` reads ``fn``'s annotated parameters into a pydantic model: that model
gives the JSON schema shown to the model (``Tool.schema()``, OpenAI/Hermes style) and validates the
arguments the model wrote (``Tool.acall``). Validation is pydantic's *strict JSON* mode: the
arguments are checked as the JSON values they came from, so ``"12"`` is not an ``int`` and ``1.5``
is not an ``int``, while ``1`` is a valid ``float`` and a JSON array is a valid ``tuple``. Unknown
argument names are rejected. Parameter descriptions come from the function's docstring (Google,
numpy or reST style, via ``docstring_parser``).
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import docstring_parser
import pydantic

_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# JSON-schema keywords whose values are data, not schemas: titles inside them are left alone.
_DATA_KEYWORDS = frozenset({"default", "examples", "const", "enum"})
# Keywords whose values map names to schemas: the names are kept, the schemas are cleaned.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions"})


class ToolArgumentError(ValueError):
    """The arguments of a tool call are invalid; the message names each bad argument."""


@dataclass(frozen=True, eq=False)
class Tool:
    """A callable tool: ``name``, ``description`` and a JSON schema of its ``parameters``.

    Build one with :meth:`from_function`. ``parameters`` is a JSON schema with ``type: object``,
    ``properties``, ``required`` and ``additionalProperties: false``, without pydantic's ``title``
    entries. ``function`` is the wrapped callable and ``arguments_model`` the pydantic model that
    validates its arguments.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    function: Callable[..., Any] = field(repr=False)
    arguments_model: type[pydantic.BaseModel] = field(repr=False)

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
    ) -> Tool:
        """Wrap a sync or async function whose parameters all have type annotations.

        ``name`` defaults to ``fn.__name__`` and must match ``[A-Za-z0-9_-]{1,64}`` (the limit
        OpenAI-style APIs impose). ``description`` defaults to the docstring's summary and body;
        each parameter's description comes from the docstring's argument section. Raises
        ``TypeError`` for an unannotated parameter, ``*args``/``**kwargs``, a positional-only
        parameter or a type pydantic cannot validate, and ``ValueError`` for a bad name.
        """
        name = name if name is not None else getattr(fn, "__name__", "")
        if not _TOOL_NAME.fullmatch(name):
            raise ValueError(f"tool name {name!r} must match {_TOOL_NAME.pattern}; pass name=...")
        try:
            signature = inspect.signature(fn, eval_str=True)
        except NameError as exc:
            raise TypeError(f"cannot resolve the annotations of tool {name!r}: {exc}") from exc
        docstring = docstring_parser.parse(inspect.getdoc(fn) or "")
        param_docs = {param.arg_name: param.description for param in docstring.params}
        fields: dict[str, Any] = {}
        for index, param in enumerate(signature.parameters.values()):
            _check_parameter(name, param)
            default = ... if param.default is inspect.Parameter.empty else param.default
            info = pydantic.Field(default, alias=param.name, description=param_docs.get(param.name))
            # Field names are positional placeholders: parameter names such as `json` or
            # `model_config` would clash with BaseModel's attributes. The alias is the real name.
            fields[f"p{index}"] = (param.annotation, info)
        config = pydantic.ConfigDict(extra="forbid", strict=True)
        model = pydantic.create_model(name, __config__=config, **fields)
        parameters = _without_titles(model.model_json_schema())
        parameters.setdefault("properties", {})
        parameters.setdefault("required", [])
        if description is None:
            parts = (docstring.short_description, docstring.long_description)
            description = "\n\n".join(part for part in parts if part)
        return cls(name, description, parameters, fn, model)

    def schema(self) -> dict[str, Any]:
        """The OpenAI/Hermes tool schema; a new dict on every call (callers may mutate it)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": copy.deepcopy(self.parameters),
            },
        }

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Check ``arguments`` and return the keyword arguments to call the function with.

        Only the arguments that were given are returned, so the function's own defaults apply.
        Raises :class:`ToolArgumentError` naming every bad, missing or unexpected argument.
        """
        if not isinstance(arguments, Mapping):
            raise ToolArgumentError(
                f"arguments of tool {self.name!r} must be an object, got {type(arguments).__name__}"
            )
        try:
            encoded = json.dumps(dict(arguments), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ToolArgumentError(f"arguments of tool {self.name!r} are not JSON: {exc}") from exc
        try:
            validated = self.arguments_model.model_validate_json(encoded)
        except pydantic.ValidationError as exc:
            problems = "; ".join(_describe(error) for error in exc.errors(include_url=False))
            raise ToolArgumentError(
                f"invalid arguments for tool {self.name!r}: {problems}. {self._signature()}"
            ) from None
        # Every field has its parameter's name as alias (see `from_function`).
        names = {
            key: field.alias for key, field in type(validated).model_fields.items() if field.alias
        }
        return {names[key]: getattr(validated, key) for key in validated.model_fields_set}

    async def acall(self, arguments: Mapping[str, Any]) -> str:
        """Validate ``arguments``, run the function and return its result as a string.

        Async functions are awaited; sync ones run in a worker thread (``asyncio.to_thread``) so
        they never block the event loop. Raises :class:`ToolArgumentError` for invalid arguments;
        exceptions raised by the function propagate unchanged.
        """
        values = self.validate(arguments)
        if inspect.iscoroutinefunction(self.function):
            result = await self.function(**values)
        else:
            result = await asyncio.to_thread(self.function, **values)
            if inspect.isawaitable(result):  # e.g. an object whose __call__ is async
                result = await result
        return result if isinstance(result, str) else str(result)

    def _signature(self) -> str:
        required = set(self.parameters["required"])
        names = [
            name if name in required else f"{name} (optional)"
            for name in self.parameters["properties"]
        ]
        return f"The arguments of {self.name!r} are: {', '.join(names) or 'none'}."


def _check_parameter(tool: str, param: inspect.Parameter) -> None:
    if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
        raise TypeError(f"tool {tool!r}: *args and **kwargs cannot be described by a JSON schema")
    if param.kind is inspect.Parameter.POSITIONAL_ONLY:
        raise TypeError(f"tool {tool!r}: parameter {param.name!r} is positional-only")
    if param.annotation is inspect.Parameter.empty:
        raise TypeError(
            f"tool {tool!r}: parameter {param.name!r} has no type annotation; "
            "every parameter needs one to build the JSON schema"
        )


def _without_titles(schema: Any) -> Any:
    """Drop pydantic's ``title`` keywords from a JSON schema, in place; return the schema."""
    if isinstance(schema, list):
        for item in schema:
            _without_titles(item)
    elif isinstance(schema, dict):
        schema.pop("title", None)
        for keyword, value in schema.items():
            if keyword in _SCHEMA_MAPS and isinstance(value, dict):
                for subschema in value.values():
                    _without_titles(subschema)
            elif keyword not in _DATA_KEYWORDS:
                _without_titles(value)
    return schema


def _describe(error: Mapping[str, Any]) -> str:
    """One pydantic error as a phrase that names the argument, e.g. ``'xs[1]': ... (got 'a')``."""
    if not error["loc"]:  # about the arguments as a whole (e.g. json_invalid)
        return f"the arguments: {error['msg']}"
    name, *path = error["loc"]
    where = repr(str(name) + "".join(f"[{part!r}]" for part in path))
    if error["type"] == "extra_forbidden":
        return f"unexpected argument {where}"
    if error["type"] == "missing" and not path:
        return f"missing required argument {where}"
    got = repr(error["input"])
    got = got if len(got) <= 80 else got[:77] + "..."
    return f"argument {where}: {error['msg']} (got {got})"
