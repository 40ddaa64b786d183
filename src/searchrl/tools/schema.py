"""The subset of JSON schema tool arguments are checked against, and the check itself.

Chat templates take the full JSON schema, but a tool's arguments are flat: the subset is an
"object" of properties typed string, integer, number, boolean or array of strings, with `enum`,
`minLength` / `maxLength`, `minimum` / `maximum`, `required`, `additionalProperties` and
`minProperties` / `maxProperties`. `check_schema` refuses anything else when the tool is built
(a keyword silently ignored would be a check silently skipped); `check_arguments` is what the
engine runs before `Tool.call`, and its message is written for the model to read.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from searchrl.errors import SearchRLError

# A string argument without its own maxLength is cut off here: no tool needs a novel.
MAX_STRING = 10_000
TYPES = {"string": "a string", "integer": "an integer", "number": "a number", "boolean": "true or false",
         "array": "a list of strings"}
_PROPERTY_KEYS = {"type", "description", "enum", "minLength", "maxLength", "minimum", "maximum", "items", "default", "title"}
_OBJECT_KEYS = {"type", "properties", "required", "additionalProperties", "minProperties", "maxProperties", "description", "title"}
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")


def check_schema(where: str, parameters: object) -> None:
    """`SearchRLError` naming `where` (the tool) when `parameters` is not a JSON-schema object in
    the subset this module checks."""
    def bad(what: str) -> SearchRLError:
        return SearchRLError(f"tool {where}: its parameters schema {what}; see `searchrl.tools.schema` for the subset supported")

    if not isinstance(parameters, dict) or parameters.get("type") != "object":
        raise bad('is not a JSON-schema object ({"type": "object", "properties": {...}})')
    if extra := set(parameters) - _OBJECT_KEYS:
        raise bad(f"uses {', '.join(sorted(extra))}, which are not checked")
    properties = parameters.get("properties", {})
    if not isinstance(properties, dict):
        raise bad("has properties that are not a mapping of names to schemas")
    for key, spec in properties.items():
        if not isinstance(spec, dict) or spec.get("type") not in TYPES:
            raise bad(f"gives `{key}` no type among {', '.join(TYPES)}")
        if extra := set(spec) - _PROPERTY_KEYS:
            raise bad(f"uses {', '.join(sorted(extra))} in `{key}`, which are not checked")
        if spec["type"] == "array" and spec.get("items", {}).get("type") != "string":
            raise bad(f'gives the array `{key}` items other than {{"type": "string"}}')
        if "enum" in spec and not (isinstance(spec["enum"], list) and spec["enum"]):
            raise bad(f"gives `{key}` an enum that is not a non-empty list")
    required = parameters.get("required", [])
    if not isinstance(required, list) or not set(required) <= set(properties):
        raise bad("requires keys it does not define")
    if not isinstance(parameters.get("additionalProperties", False), bool):
        raise bad("has an additionalProperties that is not true or false")


def check_arguments(name: str, parameters: dict[str, Any], arguments: object) -> str | None:
    """Why `arguments` do not fit the tool `name`'s `parameters` (checked by `check_schema`), in
    words the model can read; None when they fit.

    >>> schema = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
    >>> check_arguments("search", schema, {"query": 3})
    'search: argument `query` must be a string, not 3'
    >>> check_arguments("search", schema, {"q": "x"})
    'search: unknown argument `q`; its arguments are: `query`'
    >>> check_arguments("search", schema, {"query": "Quellbridge"}) is None
    True
    """
    properties = parameters.get("properties", {})
    known = ", ".join(f"`{k}`" for k in properties) or "none"
    if not isinstance(arguments, dict):
        return f"{name}: the arguments must be an object of named values ({known}), not {_shown(arguments)}"
    if not parameters.get("additionalProperties", False):
        for key in arguments:
            if key not in properties:
                return f"{name}: unknown argument `{_cut(str(key), 40)}`; its arguments are: {known}"
    for key in parameters.get("required", []):
        if key not in arguments:
            return f"{name}: argument `{key}` is missing"
    least, most = parameters.get("minProperties", 0), parameters.get("maxProperties", math.inf)
    if not least <= len(arguments) <= most:
        if least == most == 1:
            return f"{name}: give exactly one of {known}"
        return f"{name}: give between {least} and {most} arguments of {known}"
    for key, value in arguments.items():
        if key in properties and (why := _value_error(properties[key], value)):
            return f"{name}: argument `{key}` {why}"
    return None


def _value_error(spec: dict[str, Any], value: object) -> str | None:
    kind = spec["type"]
    if not _has_type(kind, value):
        return f"must be {TYPES[kind]}, not {_shown(value)}"
    if "enum" in spec and value not in spec["enum"]:
        return f"must be one of {', '.join(_shown(v) for v in spec['enum'])}, not {_shown(value)}"
    texts = value if kind == "array" else [value] if kind == "string" else []
    longest = spec.get("maxLength", MAX_STRING)
    for text in texts:
        if len(text) > longest:
            return f"is {len(text)} characters long; at most {longest} are read"
        if len(text) < spec.get("minLength", 0):
            return f"must be at least {spec['minLength']} characters long"
    if kind in ("integer", "number"):
        if "minimum" in spec and value < spec["minimum"]:
            return f"must be at least {spec['minimum']}, not {value}"
        if "maximum" in spec and value > spec["maximum"]:
            return f"must be at most {spec['maximum']}, not {value}"
    return None


def _has_type(kind: str, value: object) -> bool:
    if isinstance(value, bool):  # bool is an int to Python, never to JSON
        return kind == "boolean"
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int)
    if kind == "number":
        return isinstance(value, (int, float)) and math.isfinite(value)
    if kind == "array":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return False


def _shown(value: object, most: int = 60) -> str:
    """A value as the model wrote it, in JSON's words, cut to `most` characters."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return _cut(text, most)


def _cut(text: str, most: int) -> str:
    return text if len(text) <= most else text[: most - 3] + "..."
