"""Tools for agents: typed tools with JSON schemas, tool-call parsers, and a Python runner.

* :class:`Tool` / :class:`ToolSet` -- a typed Python function as a tool, and a set of tools that
  answers parsed calls with chat messages (never raising).
* :class:`HermesParser` / :class:`TagParser` -- read tool calls out of model text, and write them.
* :func:`run_python` / :func:`python_tool` -- run Python in a separate process with a time limit
  (no sandbox: see :mod:`agentrl.tools.python` for what is not isolated).
"""

from agentrl.tools.parsers import (
    HermesParser,
    ParseResult,
    TagParser,
    ToolCall,
    ToolCallError,
    ToolCallParser,
)
from agentrl.tools.python import ExecResult, python_tool, run_python
from agentrl.tools.tool import Tool, ToolArgumentError
from agentrl.tools.toolset import ToolSet

__all__ = [
    "ExecResult",
    "HermesParser",
    "ParseResult",
    "TagParser",
    "Tool",
    "ToolArgumentError",
    "ToolCall",
    "ToolCallError",
    "ToolCallParser",
    "ToolSet",
    "python_tool",
    "run_python",
]
