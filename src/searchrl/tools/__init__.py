"""Tools the policy may call (search, open, calculate, users' own): see `searchrl.tools.base`.

`build_tools(names, ToolContext.of(retriever, k))` makes the tools a config lists; the engine
checks each call with `check_arguments` before `Tool.call`.
"""

from searchrl.tools.base import Observation, Tool, ToolCall
from searchrl.tools.context import ToolContext
from searchrl.tools.registry import TOOLS, build_tools, tool_class
from searchrl.tools.schema import check_arguments, check_schema

# The built-in tools register themselves on import.
from searchrl.tools import calculate, open, search  # noqa: F401  isort: skip

__all__ = ["TOOLS", "Observation", "Tool", "ToolCall", "ToolContext", "build_tools", "check_arguments", "check_schema",
           "tool_class"]
