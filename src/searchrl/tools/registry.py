"""The tool registry and `build_tools`, which turns the names a config lists (`tools: [search,
open, mypkg.tools:Weather]`) into tools, each given the run's `ToolContext`.

A name is a registered tool (`TOOLS`: search, open, calculate) or the import path
`package.module:ClassName` of a `Tool` subclass of the user's (docs/guides/tools.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from searchrl.errors import SearchRLError
from searchrl.registry import Registry
from searchrl.tools.base import Tool
from searchrl.tools.context import ToolContext
from searchrl.tools.schema import NAME, check_schema

TOOLS: Registry[type[Tool]] = Registry("tool", paths=True)

def tool_class(name: str) -> type[Tool]:
    """The tool class `name` stands for: a registered tool, or `package.module:ClassName`."""
    if ":" not in name and name not in TOOLS:
        raise SearchRLError(f"unknown tool {name!r}; choose among {', '.join(TOOLS.names())}, "
                            "or give your own as package.module:ClassName")
    cls = TOOLS.get(name)
    if not (isinstance(cls, type) and issubclass(cls, Tool)):
        raise SearchRLError(f"tool {name}: {name.rpartition(':')[2]} is not a subclass of searchrl.tools.base.Tool")
    return cls


def build_tools(names: Sequence[str], context: ToolContext) -> dict[str, Tool]:
    """The tools `names` list, by their names (as the model calls them), in order; each given
    `context`. `SearchRLError` for a name that is no tool, a class that is not a complete
    `Tool`, a schema outside `searchrl.tools.schema`'s subset, or two tools of one name."""
    tools: dict[str, Tool] = {}
    for name in names:
        cls = tool_class(name)
        tool_name = getattr(cls, "name", None)
        if not isinstance(tool_name, str) or not NAME.fullmatch(tool_name):
            raise SearchRLError(f"tool {name}: its `name` must be letters, digits, _ or - (at most 64), not {tool_name!r}")
        if not isinstance(getattr(cls, "description", None), str):
            raise SearchRLError(f"tool {name}: it has no `description` (a string telling the model what it does)")
        check_schema(name, getattr(cls, "parameters", None))
        if tool_name in tools:
            raise SearchRLError(f"tool {name}: a tool named {tool_name!r} is listed twice")
        if cls.__abstractmethods__:
            raise SearchRLError(f"tool {name}: {cls.__name__} does not define {', '.join(sorted(cls.__abstractmethods__))}")
        tools[tool_name] = cls(context)
    return tools
