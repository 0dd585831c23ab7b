"""Tool.from_function: the JSON schema it builds and the strict validation of model-written arguments."""

from __future__ import annotations

import asyncio
import threading
from typing import Literal

import pydantic
import pytest

from agentrl.tools import Tool, ToolArgumentError


def lookup(
    query: str,
    limit: int,
    scale: float = 1.0,
    exact: bool = False,
    ids: list[int] | None = None,
    mode: Literal["fast", "slow"] = "fast",
) -> str:
    """Look things up in the index.

    Searches titles first.

    Args:
        query: What to look for.
        limit: At most this many results.
        mode: How hard to try.
    """
    return f"{query}:{limit}:{scale}:{exact}:{ids}:{mode}"


def numpy_style(title: str, json: int = 0) -> str:
    """Store a document.

    Parameters
    ----------
    title : str
        The document title.
    json : int
        A parameter whose name shadows a pydantic attribute.
    """
    return f"{title}/{json}"


class Point(pydantic.BaseModel):
    x: int
    y: int


def distance(a: Point, b: Point) -> float:
    return ((a.x - b.x) ** 2 + (a.y - b.y) ** 2) ** 0.5


def titles_in(schema: object) -> list[object]:
    """Every value stored under a ``title`` keyword in a schema (property names excluded)."""
    if isinstance(schema, list):
        return [title for item in schema for title in titles_in(item)]
    if not isinstance(schema, dict):
        return []
    found = [schema["title"]] if "title" in schema else []
    for key, value in schema.items():
        if key == "properties":
            found += [title for sub in value.values() for title in titles_in(sub)]
        elif key != "title":
            found += titles_in(value)
    return found


def test_schema_covers_scalars_lists_optionals_literals_and_defaults() -> None:
    tool = Tool.from_function(lookup)
    assert tool.schema() == {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look things up in the index.\n\nSearches titles first.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "What to look for."},
                    "limit": {"type": "integer", "description": "At most this many results."},
                    "scale": {"type": "number", "default": 1.0},
                    "exact": {"type": "boolean", "default": False},
                    "ids": {
                        "anyOf": [
                            {"type": "array", "items": {"type": "integer"}},
                            {"type": "null"},
                        ],
                        "default": None,
                    },
                    "mode": {
                        "type": "string",
                        "enum": ["fast", "slow"],
                        "default": "fast",
                        "description": "How hard to try.",
                    },
                },
                "required": ["query", "limit"],
                "additionalProperties": False,
            },
        },
    }


def test_numpy_docstring_and_parameter_names_that_shadow_pydantic_attributes() -> None:
    tool = Tool.from_function(numpy_style)
    assert tool.description == "Store a document."
    assert tool.parameters["properties"] == {
        "title": {"type": "string", "description": "The document title."},
        "json": {
            "type": "integer",
            "default": 0,
            "description": "A parameter whose name shadows a pydantic attribute.",
        },
    }
    assert asyncio.run(tool.acall({"title": "t", "json": 3})) == "t/3"


def test_nested_models_have_no_title_noise() -> None:
    tool = Tool.from_function(distance, description="Distance between two points.")
    assert titles_in(tool.parameters) == []
    assert set(tool.parameters["$defs"]["Point"]["properties"]) == {"x", "y"}
    assert tool.parameters["required"] == ["a", "b"]


def test_name_and_description_overrides_and_function_without_docstring() -> None:
    tool = Tool.from_function(distance, name="dist", description="d")
    assert (tool.name, tool.description) == ("dist", "d")
    assert Tool.from_function(distance).description == ""


def test_schema_is_a_new_dict_every_call() -> None:
    tool = Tool.from_function(lookup)
    first = tool.schema()
    first["function"]["parameters"]["properties"].clear()
    first["function"]["name"] = "changed"
    assert tool.schema()["function"]["name"] == "lookup"
    assert "query" in tool.schema()["function"]["parameters"]["properties"]


def test_unannotated_parameters_and_varargs_are_refused() -> None:
    def untyped(x, y: int) -> int:  # type: ignore[no-untyped-def]
        return y

    def variadic(*args: int) -> int:
        return 0

    with pytest.raises(TypeError, match="parameter 'x' has no type annotation"):
        Tool.from_function(untyped)
    with pytest.raises(TypeError, match=r"\*args"):
        Tool.from_function(variadic)
    with pytest.raises(TypeError, match="positional-only"):
        Tool.from_function(divmod)


def test_names_must_suit_tool_apis() -> None:
    with pytest.raises(ValueError, match="pass name="):
        Tool.from_function(lambda x: x)
    with pytest.raises(ValueError):
        Tool.from_function(lookup, name="has space")


async def test_sync_functions_run_off_the_event_loop_thread() -> None:
    loop_thread = threading.get_ident()

    def where(tag: str) -> bool:
        return threading.get_ident() != loop_thread

    assert await Tool.from_function(where).acall({"tag": "x"}) == "True"


async def test_async_functions_are_awaited_and_results_become_strings() -> None:
    async def slow_add(a: int, b: int = 10) -> int:
        await asyncio.sleep(0)
        return a + b

    tool = Tool.from_function(slow_add)
    assert await tool.acall({"a": 1}) == "11"
    assert await tool.acall({"a": 1, "b": -1}) == "0"


async def test_function_defaults_apply_to_omitted_arguments() -> None:
    def greet(name: str, greeting: str = "hello") -> str:
        return f"{greeting} {name}"

    assert await Tool.from_function(greet).acall({"name": "ada"}) == "hello ada"


async def test_valid_arguments_are_accepted_with_json_semantics() -> None:
    tool = Tool.from_function(lookup)
    result = await tool.acall({"query": "q", "limit": 2, "scale": 3, "ids": [1, 2], "mode": "slow"})
    assert result == "q:2:3.0:False:[1, 2]:slow"
    assert await tool.acall({"query": "q", "limit": 2, "ids": None}) == "q:2:1.0:False:None:fast"
    assert await Tool.from_function(distance).acall({"a": {"x": 0, "y": 0}, "b": {"x": 3, "y": 4}})


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"query": "q", "limit": "abc"}, "argument 'limit': Input should be a valid integer"),
        ({"query": "q", "limit": "12"}, "argument 'limit'"),
        ({"query": "q", "limit": 1.5}, "argument 'limit'"),
        ({"query": "q", "limit": True}, "argument 'limit'"),
        ({"query": 7, "limit": 1}, "argument 'query': Input should be a valid string"),
        ({"query": "q", "limit": 1, "exact": "yes"}, "argument 'exact'"),
        ({"query": "q", "limit": 1, "ids": [1, "2"]}, "argument 'ids[1]'"),
        ({"query": "q", "limit": 1, "mode": "medium"}, "argument 'mode': Input should be 'fast'"),
        ({"query": "q", "limit": 1, "colour": "red"}, "unexpected argument 'colour'"),
        ({"query": "q"}, "missing required argument 'limit'"),
        ({"query": "q", "limit": 1, "scale": float("nan")}, "are not JSON"),
        (["q", 1], "must be an object, got list"),
    ],
)
async def test_invalid_arguments_raise_an_error_naming_the_argument(
    arguments: dict[str, object], expected: str
) -> None:
    tool = Tool.from_function(lookup)
    with pytest.raises(ToolArgumentError, match="lookup") as caught:
        await tool.acall(arguments)
    assert expected in str(caught.value)
    assert isinstance(caught.value, ValueError)


async def test_argument_errors_list_the_arguments_the_tool_takes() -> None:
    with pytest.raises(ToolArgumentError) as caught:
        await Tool.from_function(lookup).acall({})
    message = str(caught.value)
    assert "missing required argument 'query'" in message
    assert "missing required argument 'limit'" in message
    assert "query, limit, scale (optional)" in message


def test_arguments_that_are_not_valid_unicode_get_a_clear_error() -> None:
    tool = Tool.from_function(lookup)
    with pytest.raises(ToolArgumentError, match="invalid arguments for tool 'lookup': the argu"):
        tool.validate({"query": "half a pair: \ud800", "limit": 1})
