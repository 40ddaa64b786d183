"""Typed configs: one pydantic model per command, loaded from YAML plus `key=value` overrides.

Every field carries its default and a `description` (the help text); nothing is defaulted in
code with `.get(key, default)`. Unknown keys are errors, so a typo never passes silently.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from searchrl.errors import SearchRLError

C = TypeVar("C", bound="StrictModel")


class StrictModel(BaseModel):
    """Base for every config: unknown keys rejected, assignments validated. A field's description
    is its `Field(description=...)`, else the docstring right under it (the reference page reads it)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)


# Deepest nesting a setting's value or key may have (no config nests past 5), and most values in
# one (lists and mappings counted, YAML aliases each time they are used): a hostile `--set` or
# config file is refused in one line instead of exhausting the stack or memory.
MAX_DEPTH = 64
MAX_NODES = 100_000


def _shown(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _brackets_too_deep(text: str) -> bool:
    """Whether YAML flow text opens more than MAX_DEPTH brackets at once (quotes not skipped: a
    string holding that many is refused too, which no setting needs). A loop: no recursion."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return False
    depth = 0
    for c in text:
        if c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return True
        elif c in "]}":
            depth = max(depth - 1, 0)
    return False


def check_nesting(value, where: str) -> None:
    """Refuse a value (parsed YAML) nested deeper than MAX_DEPTH or holding more than MAX_NODES
    lists, mappings and values, naming `where`. Walked with a stack, never recursion."""
    stack, seen = [(value, 1)], 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            raise SearchRLError(f"{where}: holds more than {MAX_NODES:,} values (YAML aliases count each time they are "
                                "used); no setting does")
        if isinstance(node, (dict, list)):
            if depth > MAX_DEPTH:
                raise SearchRLError(f"{where}: nested more than {MAX_DEPTH} levels deep; no setting is")
            items = list(node.keys()) + list(node.values()) if isinstance(node, dict) else node
            stack.extend((item, depth + 1) for item in items)


def parse_overrides(pairs: list[str]) -> dict:
    """`["a.b=3", "c=x"]` -> `{"a": {"b": 3}, "c": "x"}`; values are parsed as YAML scalars."""
    tree: dict = {}
    for pair in pairs:
        if "=" not in pair:
            raise SearchRLError(f"override {_shown(pair)} is not key=value (e.g. stage1.steps=10)")
        key, raw = pair.split("=", 1)
        node = tree
        if key.count(".") >= MAX_DEPTH:
            raise SearchRLError(f"override {_shown(pair)}: its key has more than {MAX_DEPTH} parts; no setting does")
        *parents, leaf = key.strip().split(".")
        for i, part in enumerate(parents):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise SearchRLError(
                    f"override {pair!r} goes inside {'.'.join(parents[: i + 1])}, which another override set to {node!r}; "
                    "set its keys one by one instead"
                )
        node[leaf] = _override_value(pair, raw)
    return tree


def _override_value(pair: str, raw: str):
    """An override's value as a YAML scalar (or list/mapping); a tag such as `!!python/...` or
    broken YAML is one line saying so (safe_load never runs a tag, but its error is a traceback)."""
    if raw == "":
        return ""
    where = f"override {_shown(pair)}"
    if _brackets_too_deep(raw):
        raise SearchRLError(f"{where}: the value is nested more than {MAX_DEPTH} levels deep; no setting is")
    try:
        value = yaml.safe_load(raw)
    except yaml.constructor.ConstructorError:
        raise SearchRLError(f"{where}: YAML tags (!!...) are not accepted; quote the value to give it as a string") from None
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise SearchRLError(f"{where}: the value is not valid YAML ({problem}); quote it to give it as a string") from None
    except RecursionError:  # block-style nesting by indentation
        raise SearchRLError(f"{where}: the value is nested more than {MAX_DEPTH} levels deep; no setting is") from None
    check_nesting(value, where)
    return value


def flag_overrides(flags: dict, given: Sequence[str] = ()) -> list[str]:
    """Command-line flags keyed by their config keys (`{"rollout.k": 3}`) as `key=value` overrides;
    flags not given (None) override nothing. A flag whose key an override in `given` (`--set`)
    also sets to another value is an error naming both: neither is dropped without a word."""
    tree = parse_overrides(list(given))
    for key, value in flags.items():
        found = _set_at(tree, key) if value is not None else None
        if found is not None and found[1] != value:
            raise SearchRLError(
                f"--set {found[0]}={json.dumps(found[1])} conflicts with the flag that sets {key}={json.dumps(value)}: "
                "give the value once, as the flag or as --set"
            )
    return [f"{key}={json.dumps(value)}" for key, value in flags.items() if value is not None]


def _set_at(tree: dict, key: str) -> tuple[str, object] | None:
    """What the overrides `tree` set at dotted `key`, or at a key above it to something that is
    not a mapping: (that key, its value); None when they set neither."""
    node, parts = tree, key.split(".")
    for depth, part in enumerate(parts, start=1):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
        if depth == len(parts) or not isinstance(node, dict):
            return ".".join(parts[:depth]), node
    return None


def deep_merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    """A config file's mapping; a top-level `extends: OTHER.yaml` (relative to the file) is read
    first and this file's keys are deep-merged over it, so a variant states only what differs."""
    if path.is_dir():
        raise SearchRLError(f"config file {path} is a directory; give a YAML file (one inside it?)")
    if not path.is_file():
        raise SearchRLError(f"config file {path} does not exist")
    if path.resolve() in seen:
        raise SearchRLError(f"config file {path} extends itself (via {' -> '.join(map(str, seen))})")
    try:
        text = path.read_text()
        if _brackets_too_deep(text):
            raise RecursionError
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise SearchRLError(f"config file {where} is not valid YAML: {problem}") from None
    except RecursionError:
        raise SearchRLError(f"config file {path}: nested more than {MAX_DEPTH} levels deep; no setting is") from None
    except UnicodeDecodeError:
        raise SearchRLError(f"config file {path} is not UTF-8 text; re-save it as UTF-8") from None
    check_nesting(data, f"config file {path}")
    if not isinstance(data, dict):
        raise SearchRLError(f"config file {path} must hold a mapping at top level")
    base = data.pop("extends", None)
    if base is None:
        return data
    return deep_merge(_read_yaml(path.parent / str(base), (*seen, path.resolve())), data)


CONFIG_DIR = Path(__file__).resolve().parent / "configs"


def resolve_config_path(name: str | Path) -> Path:
    """A packaged config's name (`demo-cpu`, `multihop-cpu`: CONFIG_DIR/NAME.yaml) or a YAML path;
    anything that looks like a path stays one, so a wrong path is reported as such."""
    path = Path(name)
    if path.exists() or path.suffix or len(path.parts) > 1:
        return path
    packaged = CONFIG_DIR / f"{path}.yaml"
    if packaged.is_file():
        return packaged
    known = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))
    raise SearchRLError(f"config {str(name)!r} is neither a file nor a packaged config ({known})")


def load_config(cls: type[C], path: str | Path | None = None, overrides: list[str] = ()) -> C:
    """Build `cls` from an optional YAML file (or packaged config name) and `key=value` overrides,
    with clear errors."""
    data = _read_yaml(resolve_config_path(path)) if path is not None else {}
    data = deep_merge(data, parse_overrides(list(overrides)))
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        where = f" in {path}" if path else ""
        raise SearchRLError(f"invalid {cls.__name__}{where}:\n" + "\n".join(validation_lines(exc))) from None


def validation_lines(exc: ValidationError) -> list[str]:
    """One line per problem of a pydantic error, for people: `  key: message`, or the message
    alone when the whole config is at fault (a model validator: pydantic's `loc` is empty), without
    pydantic's "Value error, " prefix."""
    lines = []
    for e in exc.errors():
        msg = str(e["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
        key = ".".join(map(str, e["loc"]))
        lines.append(f"  {key}: {msg}" if key else f"  {msg}")
    return lines


def dump_config(cfg: StrictModel, path: str | Path) -> None:
    """Write the resolved config next to a run's outputs."""
    Path(path).write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
