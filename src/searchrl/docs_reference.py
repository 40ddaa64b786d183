"""The reference pages of the documentation, generated from the code so they cannot drift:

- `cli.md`: every command of the Typer app (the click tree `typer.main.get_command` builds) with
  its help and every argument and option (type, default, help);
- `config.md`: every key of every command's typed config (the pydantic models), nested sections
  under their dotted path, with type, default (as that command sets it) and description;
- `metrics.md`: every metric name a training step logs (`searchrl.metric_names`), by kind, with
  the members of each family the package defines.

`python -m searchrl.docs_reference OUTDIR` writes them; the MkDocs hook `docs/hooks/reference.py`
adds them to every site build (`pages()`), so nothing generated is committed.
"""

from __future__ import annotations

import inspect
import json
import sys
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel
from pydantic.fields import FieldInfo

REQUIRED = object()  # a key of a section that has no defaults to show


def config_models() -> dict[str, type[BaseModel]]:
    """The commands that read a typed config (`--config FILE`, `--set key=value`, `key=value`
    arguments), each with its config class. `demo` takes the training config's overrides."""
    from searchrl.ask import AskConfig
    from searchrl.data.compose import ComposeConfig
    from searchrl.eval.config import EvalConfig
    from searchrl.eval.report_config import ReportConfig
    from searchrl.rl.config import TrainConfig
    from searchrl.select.config import SelectConfig

    return {"train": TrainConfig, "eval run": EvalConfig, "eval second-hop": EvalConfig, "eval report": ReportConfig, "ask": AskConfig,
            "data select": SelectConfig, "data compose": ComposeConfig}


# ------------------------------------------------------------------------------------------------
# Markdown helpers


def text(s: str | None) -> str:
    """Help text as one Markdown table cell: one line, `|` escaped, `<tag>` shown (not parsed as
    HTML) outside code spans."""
    s = " ".join((s or "").split())
    parts = s.split("`")
    for i in range(0, len(parts), 2):  # even parts are outside backticks
        parts[i] = parts[i].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts).replace("|", "\\|")


def code(value: object) -> str:
    s = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    s = s.replace("|", "\\|")
    return f"`` {s} ``" if "`" in s else f"`{s}`"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows), ""]


# ------------------------------------------------------------------------------------------------
# The command line


def commands(group=None, path: str = "searchrl") -> Iterator[tuple[str, object]]:
    """Every command of the app, groups included, depth first: (`searchrl eval run`, command).
    The tree is the one `typer.main.get_command` builds (typer's own click: read, never built)."""
    if group is None:
        import typer

        from searchrl.cli import app

        group = typer.main.get_command(app)
    yield path, group
    for name in sorted(getattr(group, "commands", {})):
        yield from commands(group.commands[name], f"{path} {name}")


def _is_argument(p) -> bool:
    return p.param_type_name == "argument"


def _param_type(p) -> str:
    if getattr(p, "is_flag", False):
        return "flag"
    t = p.type_descriptor.annotation
    t = typing.get_args(t)[0] if typing.get_origin(t) is list else t
    name = {int: "integer", float: "number", str: "text", bool: "boolean"}.get(t, getattr(t, "__name__", str(t)))
    low, high = getattr(p, "min", None), getattr(p, "max", None)
    if low is not None or high is not None:
        name += " " + (f"{low}–{high}" if low is not None and high is not None else f"≥ {low}" if low is not None else f"≤ {high}")
    if p.multiple or p.nargs == -1:
        name += ", repeatable"
    return name


def _param_default(p) -> str:
    if p.required:
        return "required"
    if getattr(p, "is_flag", False) and p.secondary_opts:
        return code(p.opts[-1] if p.default else p.secondary_opts[-1])
    if p.default is None or p.default == [] or p.default == ():
        return "—"
    return code(p.default)


def _metavar(p) -> str:
    name = p.name.upper()
    name = f"{name}..." if p.nargs == -1 else name
    return name if p.required else f"[{name}]"


def _param_name(p) -> str:
    return code(_metavar(p)) if _is_argument(p) else ", ".join(code(o) for o in (*p.opts, *p.secondary_opts))


def params(cmd) -> list:
    """A command's arguments and options, typer's completion options left out."""
    return [p for p in cmd.params if p.name not in ("install_completion", "show_completion")]


def _usage(path: str, cmd) -> str:
    if hasattr(cmd, "commands"):
        return f"{path} [OPTIONS] COMMAND [ARGS]..."
    return " ".join([path, "[OPTIONS]", *(_metavar(p) for p in params(cmd) if _is_argument(p))])


CLI_INTRO = (
    "Every `searchrl` command with its arguments and options, generated from the code "
    "(`searchrl.docs_reference`); `searchrl COMMAND --help` prints the same."
)


def cli_page() -> str:
    out = ["# Command line", "", CLI_INTRO, ""]
    for path, cmd in commands():
        level = "#" * (2 if path.count(" ") <= 1 else 3)
        paragraphs = inspect.cleandoc(cmd.help or "").split("\n\n")  # `train` lists its recipes one a paragraph
        out += [f"{level} `{path}`", "", "\n\n".join(text(p) for p in paragraphs), ""]
        if hasattr(cmd, "commands"):
            rows = [(code(f"{path} {n}"), text((c.help or "").split("\n")[0])) for n, c in sorted(cmd.commands.items())]
            out += _table(("command", "what it does"), rows)
        out += ["```", _usage(path, cmd), "```", ""]
        if params(cmd):
            rows = [(_param_name(p), _param_type(p), _param_default(p), text(p.help)) for p in params(cmd)]
            out += _table(("argument / option", "type", "default", "help"), rows)
        if cmd.epilog:
            out += [text(cmd.epilog), ""]
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------
# The configs


def _type_name(t: object) -> str:
    origin, args = typing.get_origin(t), typing.get_args(t)
    if t is type(None):
        return "null"
    if origin is typing.Annotated:  # constraints (ge, le) are in the description
        return _type_name(args[0])
    if t is typing.Any:
        return "any"
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_type_name(a) for a in args)}]"
    return getattr(t, "__name__", str(t))


def _section_model(field: FieldInfo) -> tuple[type[BaseModel], str] | None:
    """The config class a field holds and how its keys are spelled below it: a section (alone or
    beside null: `key.sub`), a mapping of them (`key.<name>.sub`) or a list (`key[].sub`); None
    for a plain key."""
    t = field.annotation
    args = typing.get_args(t) if typing.get_origin(t) in (typing.Union, types.UnionType) else (t,)
    args = tuple(a for a in args if a is not type(None))
    if len(args) != 1:
        return None
    t, origin, inner = args[0], typing.get_origin(args[0]), typing.get_args(args[0])
    if isinstance(t, type) and issubclass(t, BaseModel):
        return t, ""
    if origin is dict and isinstance(inner[1], type) and issubclass(inner[1], BaseModel):
        return inner[1], ".<name>"
    if origin is list and isinstance(inner[0], type) and issubclass(inner[0], BaseModel):
        return inner[0], "[]"
    return None


def _instance(model: type[BaseModel], value: object) -> BaseModel | None:
    if isinstance(value, model):
        return value
    try:
        return model()
    except Exception:  # noqa: BLE001 - a section with required keys has no defaults to show
        return None


def config_keys(model: type[BaseModel], value: BaseModel | None = None, prefix: str = "") -> Iterator[tuple[str, FieldInfo, object, type[BaseModel] | None]]:
    """Every key of `model` and of its sections, depth first: (dotted key, field, default as
    `value` holds it, the section's class or None). Keys of a mapping or list of sections are
    spelled `terms.<name>.weight`, `parts[].dataset` (their defaults: the class's)."""
    value = value if value is not None else _instance(model, None)
    for name, field in model.model_fields.items():
        if value is not None:
            default = getattr(value, name)
        else:
            default = REQUIRED if field.is_required() else field.get_default(call_default_factory=True)
        found = _section_model(field)
        yield f"{prefix}{name}", field, default, found[0] if found else None
        if found is not None:
            section, spelled = found
            yield from config_keys(section, _instance(section, default if not spelled else None), f"{prefix}{name}{spelled}.")


def _parent(key: str) -> str:
    """The section a dotted key sits in: `rollout.vllm.kv_cache_gb` -> `rollout.vllm`,
    `stage1.reward.terms.<name>.weight` -> `stage1.reward.terms.<name>`, `parts[].count` -> `parts[]`."""
    return key.rpartition(".")[0]


def _default(value: object) -> str:
    if value is REQUIRED:
        return "required"
    if isinstance(value, BaseModel):
        return "see below"
    if isinstance(value, dict):
        value = {k: v.model_dump(mode="json") if isinstance(v, BaseModel) else v for k, v in value.items()}
    return code(value if not isinstance(value, tuple) else list(value))


CONFIG_INTRO = (
    "Every key of every command's config, generated from the pydantic models "
    "(`searchrl.docs_reference`). A YAML file given with `--config` sets them (nested sections as "
    "mappings, `extends: OTHER.yaml` to start from another file); `key=value` overrides "
    "(`searchrl train`'s arguments, `--set` elsewhere) set one, nested with dots: `rollout.max_searches=4`. "
    "Unknown keys are errors. Defaults are the command's own (the training config searches the toy "
    "world by default, for one)."
)


def config_page() -> str:
    out = ["# Configuration", "", CONFIG_INTRO, ""]
    for command, model in config_models().items():
        out += [f"## `searchrl {command}`: {model.__name__}", "", text(inspect.cleandoc(model.__doc__ or "")), ""]
        sections: dict[str, list[tuple[str, ...]]] = {"": []}
        for key, field, default, section in config_keys(model):
            parent = _parent(key)
            leaf = key[len(parent) + 1:] if parent else key
            type_ = f"section ({_type_name(field.annotation)})" if section else _type_name(field.annotation)
            sections[parent].append((code(leaf), type_, _default(default), text(field.description)))
            if section:
                found = _section_model(field)
                sections[key + found[1]] = []
        for key, rows in sections.items():
            if key:
                out += [f"### `{command}`: `{key}`", ""]
            out += _table(("key", "type", "default", "description"), rows)
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------
# The metrics


def family_members() -> dict[str, Callable[[], list[str]]]:
    """For each family of `metric_names`, the values its slot takes in this package (a run's own
    tools and reward terms add theirs)."""
    from searchrl import metric_names as mn
    from searchrl.data.trajectory import STOP_REASONS
    from searchrl.protocols.format_rules import FORMAT_RULES
    from searchrl.retrieval.web.budget import COUNTERS
    from searchrl.reward_terms import REWARD_TERMS
    from searchrl.rl.monitors import MONITORS
    from searchrl.tools.registry import TOOLS

    return {mn.REWARD_TERM.name: REWARD_TERMS.names, mn.STOP.name: lambda: list(STOP_REASONS),
            mn.FORMAT_FAILED.name: lambda: list(FORMAT_RULES), mn.TOOL_CALLS.name: TOOLS.names,
            mn.TOOL_LATENCY.name: TOOLS.names, mn.WEB.name: lambda: list(COUNTERS), mn.HEALTH.name: lambda: list(MONITORS),
            # question types are the dataset's own: the kind's description names them
            **{m.name: list for m in mn.SCHEMA.values() if m.kind == "multihop"}}


METRICS_INTRO = (
    "Every key of a step record in a run's `metrics.jsonl` (mirrored to TensorBoard under the same "
    "names), generated from the one schema that the trainer, the health monitors, the plots and the "
    "demo read (`searchrl.metric_names`). A name with `<slot>` is a family: one key per value. "
    "`null` means the step had nothing to measure (no reference model, no search, ...). "
    "An SFT stage writes its own short record: the index keys, `sft_loss`, the token counts, the optimizer "
    "keys and its timings."
)


def metrics_page() -> str:
    from searchrl import metric_names as mn

    members = family_members()
    out = ["# Training metrics", "", METRICS_INTRO, ""]
    for kind, what in mn.KINDS.items():
        rows = []
        for m in (m for m in mn.SCHEMA.values() if m.kind == kind):
            names = members[m.name]() if m.slot else []
            also = f" Members: {', '.join(code(m.key(v)) for v in names)}." if names else ""
            rows.append((code(m.name), text(m.meaning) + also))
        out += [f"## {kind}", "", what, "", *_table(("metric", "meaning"), rows)]
    return "\n".join(out + results_section())


RESULTS_INTRO = (
    "Every key of an evaluation's `metrics.json` (`searchrl eval run`; `eval compare`, `eval report`, the "
    "model card and the demo read it), generated from its schema (`searchrl.eval.result_names`). The tool, "
    "multi-hop and behaviour keys are the training step's, above. The judge's keys are there when a judge "
    "was asked, the web keys when the run searched the web."
)


def results_section() -> list[str]:
    from searchrl.eval import result_names as rn

    rows = [(code(m.name), m.kind, text(m.meaning)) for m in rn.SCHEMA.values()]
    return ["## Evaluation results: `metrics.json`", "", RESULTS_INTRO, "", *_table(("key", "kind", "meaning"), rows)]


def pages() -> dict[str, str]:
    """The reference pages by file name (under `docs/reference/`)."""
    from searchrl.docs_api import python_api_page

    return {"cli.md": cli_page(), "config.md": config_page(), "metrics.md": metrics_page(), "python.md": python_api_page()}


def write(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, content in pages().items():
        (out / name).write_text(content + "\n", encoding="utf-8")
        written.append(out / name)
    return written


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m searchrl.docs_reference OUTDIR")
    for path in write(Path(sys.argv[1])):
        print(path)
