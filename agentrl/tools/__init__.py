"""Tools for agents: typed tools with JSON schemas, tool-call parsers, and a Python runner.

* :class:`Tool` / :class:`ToolSet` -- a typed Python function as a tool, and a set of tools that
  answers parsed calls with chat messages (never raising).
* :class:`HermesParser` / :class:`TagParser` -- read tool calls out of model text, and write them.
* :func:`run_python` / :func:`python_tool` -- run Python in a separate process with a time limit
  (no sandbox: see :mod:`agentrl.tools.python` for what is not isolated).
* :class:`Sandbox` -- the sandbox protocol; backends :class:`BubblewrapSandbox`
  (:mod:`agentrl.tools.bwrap`) and :class:`ContainerSandbox` (:mod:`agentrl.tools.container`), and
  :class:`SandboxPool` of warm sandboxes.
"""

from agentrl.tools.bwrap import BubblewrapSandbox
from agentrl.tools.container import ContainerSandbox
from agentrl.tools.parsers import (
    HermesParser,
    ParseResult,
    TagParser,
    ToolCall,
    ToolCallError,
    ToolCallParser,
)
from agentrl.tools.python import python_tool, run_python
from agentrl.tools.sandbox import (
    ExecResult,
    Sandbox,
    SandboxCrashed,
    SandboxError,
    SandboxLimits,
    SandboxLost,
)
from agentrl.tools.sandbox_pool import EpisodeSandbox, SandboxPool, sandbox_factory
from agentrl.tools.tool import Tool, ToolArgumentError
from agentrl.tools.toolset import ToolSet

__all__ = [
    "BubblewrapSandbox",
    "ContainerSandbox",
    "EpisodeSandbox",
    "ExecResult",
    "HermesParser",
    "ParseResult",
    "Sandbox",
    "SandboxCrashed",
    "SandboxError",
    "SandboxLimits",
    "SandboxLost",
    "SandboxPool",
    "TagParser",
    "Tool",
    "ToolArgumentError",
    "ToolCall",
    "ToolCallError",
    "ToolCallParser",
    "ToolSet",
    "python_tool",
    "run_python",
    "sandbox_factory",
]
