"""Model profiles: the protocol, prompt template, chat template and sampling temperature a run
uses where its config sets none, so that the defaults follow the model (docs/guides/models.md).

A profile is chosen by `AgentConfig.profile` (`auto`: from the model) before the config is
validated: a checkpoint's own `agent.yaml` or an export's `searchrl.json` (what it was trained
with; an export's also its sampling), a built-in model's alias, a known family by hub id
(Qwen2.5 base / instruct, Qwen3, Llama-3.1-Instruct), or else detected from the model's chat
template, read from its files without loading it:

    no chat template                 -> base            tags, template base
    a chat template                  -> instruct        tags, template chat
    a chat template that renders     -> instruct-tools  format tool-calls, template tools
    the `tools` it is given

Every setting the user gave (a key of the YAML file, a flag, a `--set`) is kept as given; the
profile fills only the others. The stop strings follow from the protocol: the tags' closing tags
and the prompt template's turn end, or the chat template's end of turn.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchrl.errors import DataWarning, SearchRLError


@dataclass(frozen=True)
class Profile:
    """What a model is run with unless the config says otherwise: its protocol format, the
    protocol settings of each format (`tags`, `tool_calls`), rollout settings, and (a checkpoint)
    its tools. `about` says in a few words what the profile is for."""

    name: str
    about: str
    format: str = "tags"
    tags: dict[str, Any] = field(default_factory=dict)
    tool_calls: dict[str, Any] = field(default_factory=dict)
    rollout: dict[str, Any] = field(default_factory=dict)
    tools: list[str] | None = None

    def protocol(self, fmt: str) -> dict[str, Any]:
        return dict(self.tags if fmt == "tags" else self.tool_calls)


_PAPER = {"tags": "r1searcher", "template": "base"}  # the paper's protocol for completion models
PROFILES: dict[str, Profile] = {p.name: p for p in (
    # The CPU demo's recipe (configs/demo-cpu.yaml): a 135M model follows the protocol only with a
    # worked example and the single-word tags, and writes a well-formed answer at 0.7, rarely at 1.0.
    Profile("smollm2-135m", "SmolLM2-135M-Instruct as the CPU demo runs it", "tags",
            {"tags": "search-r1", "template": "oneshot"}, {"chat_template": "hermes-fallback"}, {"temperature": 0.7}),
    # Random weights follow nothing: the configs' own defaults, so tests read as the code does.
    Profile("tiny-random", "random weights for tests: the configs' own defaults", "tags", dict(_PAPER),
            {"chat_template": "hermes-fallback"}),
    Profile("base", "a completion model (no chat template): the paper's protocol", "tags", dict(_PAPER)),
    Profile("instruct", "a chat model whose template has no tools: tags in its chat template", "tags",
            {"tags": "r1searcher", "template": "chat"}),
    Profile("instruct-tools", "a chat model whose template renders tools: its native tool calls", "tool-calls",
            {"tags": "r1searcher", "template": "chat"}, {"template": "tools"}),
    Profile("qwen2.5-base", "Qwen2.5 base: the paper's protocol (R1-Searcher trained Qwen-2.5-7B-Base so)", "tags",
            dict(_PAPER)),
    Profile("qwen2.5-instruct", "Qwen2.5 instruct: its native (Hermes) tool calls", "tool-calls",
            {"tags": "r1searcher", "template": "chat"}, {"template": "tools"}),
    Profile("qwen3", "Qwen3: its native (Hermes) tool calls, thinking as its template does", "tool-calls",
            {"tags": "r1searcher", "template": "chat"}, {"template": "tools"}),
    Profile("llama3.1-instruct", "Llama-3.1-Instruct: the paper's tags in its chat template, as R1-Searcher trained it",
            "tags", {"tags": "r1searcher", "template": "chat"}),
    Profile("none", "no profile: the configs' own defaults"),
)}

# Known families by hub id (lower case, anywhere in the name), first match wins.
FAMILIES = [
    (re.compile(r"qwen3"), "qwen3"),
    (re.compile(r"qwen-?2\.5.*instruct"), "qwen2.5-instruct"),
    (re.compile(r"qwen-?2\.5"), "qwen2.5-base"),
    (re.compile(r"llama-?3\.1.*instruct"), "llama3.1-instruct"),
]


def profile_for(model: str, wanted: str = "auto") -> Profile:
    """The profile of `model`: `wanted` by name, or (`auto`) the checkpoint's, the built-in's, the
    family's or the one its chat template tells (module docstring)."""
    from searchrl.checkpoint_meta import read_checkpoint_agent

    agent = read_checkpoint_agent(model)
    if wanted == "checkpoint" or (wanted == "auto" and agent is not None):
        if agent is None:
            raise SearchRLError(f"profile: checkpoint, but model {model!r} is neither a checkpoint with its agent "
                                "settings (agent.yaml) nor an export (searchrl.json); set profile: auto or a profile name")
        fmt = agent["protocol"].get("format", "tags")
        return Profile("checkpoint", f"what {model} was trained with", fmt,
                       agent["protocol"] if fmt == "tags" else {}, agent["protocol"] if fmt != "tags" else {},
                       agent.get("rollout", {}), tools=agent["tools"])
    if wanted != "auto":
        if wanted not in PROFILES:
            raise SearchRLError(f"unknown profile {wanted!r}; choose auto, checkpoint or one of: {', '.join(PROFILES)}")
        return PROFILES[wanted]
    from searchrl.assets import _builtin_key

    key = _builtin_key(model)
    if key in PROFILES:
        return PROFILES[key]
    name = model.lower()
    for pattern, family in FAMILIES:
        if pattern.search(name):
            return PROFILES[family]
    template = chat_template_of(model)
    if template is None:
        return PROFILES["base"]
    return PROFILES["instruct-tools" if renders_tools(template) else "instruct"]


def chat_template_of(model: str) -> str | None:
    """The chat template in `model`'s files (a local folder, or a hub id's cached files), read
    without loading the tokenizer; None when there is none (or no file to read)."""
    folder = Path(model).expanduser()
    files: dict[str, Path | None] = {}
    for name in ("chat_template.jinja", "tokenizer_config.json"):
        if folder.is_dir():
            files[name] = folder / name if (folder / name).is_file() else None
        else:
            files[name] = _cached_hub_file(model, name)
    if files["chat_template.jinja"] is not None:
        return files["chat_template.jinja"].read_text(encoding="utf-8")
    if files["tokenizer_config.json"] is None:
        return None
    try:
        template = json.loads(files["tokenizer_config.json"].read_text(encoding="utf-8")).get("chat_template")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) and template.strip() else None


def _cached_hub_file(model: str, name: str) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model, name)
    except Exception:  # noqa: BLE001 - not a valid hub id (a missing folder): nothing to read
        return None
    return Path(found) if isinstance(found, str) else None


_PROBE_TOOL = "searchrl_profile_probe"


@functools.lru_cache(maxsize=16)
def renders_tools(template: str) -> bool:
    """Whether a chat template writes the `tools` it is given into the prompt (rendered as
    transformers renders it, with one probe tool); a template that fails to render has none."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: "")
    tool = {"type": "function", "function": {"name": _PROBE_TOOL, "description": "probe",
                                             "parameters": {"type": "object", "properties": {}}}}
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    try:
        text = env.from_string(template).render(messages=messages, tools=[tool], add_generation_prompt=True,
                                                bos_token="", eos_token="")
    except Exception:  # noqa: BLE001 - a template's own errors come in many types: it renders no tools
        return False
    return _PROBE_TOOL in text


def apply_profile(data: dict, default_model: str) -> dict:
    """`data` (a config's raw mapping) with the profile of its model filling what it leaves
    unset, and `profile` set to the chosen profile's name. A section given as a built model
    (a `ProtocolConfig`, a `RolloutConfig`) counts as set in full. A checkpoint's settings that
    the config sets otherwise are kept as set, with one warning. A run folder or its
    `checkpoints/latest` as `model` becomes the run's newest complete checkpoint
    (`resolve_trained_model`), the folder the config then records."""
    from searchrl.checkpoint_meta import resolve_trained_model

    if "model" in data and isinstance(data["model"], str):
        data = {**data, "model": resolve_trained_model(data["model"])}
    model = str(data.get("model", default_model))
    profile = profile_for(model, str(data.get("profile", "auto")))
    out = {**data, "profile": profile.name}
    protocol = data.get("protocol", {})
    if isinstance(protocol, dict):
        fmt = protocol.get("format") or ("tags" if _says_tags(protocol) else profile.format)
        out["protocol"] = {**profile.protocol(fmt), **protocol, "format": fmt}
    if isinstance(data.get("rollout", {}), dict) and profile.rollout:
        out["rollout"] = {**profile.rollout, **data.get("rollout", {})}
    if profile.tools is not None and "tools" not in data and _format_of(out["protocol"]) == profile.format:
        out["tools"] = list(profile.tools)
    if profile.name == "checkpoint":
        _warn_mismatch(model, profile, out)
    return out


def _says_tags(protocol: dict) -> bool:
    """Whether the given protocol settings are a tag protocol's (tags, a tag prompt template):
    they win over a profile's tool calls. Tags stay the default format, so tool-call settings
    without `format: tool-calls` are refused as ever (`ProtocolConfig`)."""
    from searchrl.protocols.prompts import TOOL_TEMPLATES

    template = protocol.get("template")
    return "tags" in protocol or (template is not None and template not in TOOL_TEMPLATES)


def _format_of(protocol) -> str:
    return protocol.get("format", "tags") if isinstance(protocol, dict) else protocol.format


def _warn_mismatch(model: str, profile: Profile, resolved: dict) -> None:
    protocol = resolved.get("protocol")
    given = protocol if isinstance(protocol, dict) else protocol.model_dump(mode="json")
    trained = {**profile.tags, **profile.tool_calls}
    differ = [f"protocol.{k}={given[k]!r} (trained: {v!r})" for k, v in trained.items() if k in given and given[k] != v]
    tools = resolved.get("tools")
    if tools is not None and list(tools) != list(profile.tools or []):
        differ.append(f"tools={list(tools)} (trained: {profile.tools})")
    if differ:
        _warn_once(f"checkpoint {model} was trained with another protocol than this run sets: {'; '.join(differ)}; "
                   "the run uses what it sets (leave these unset to use the checkpoint's)")


@functools.cache
def _warn_once(message: str) -> None:
    warnings.warn(message, DataWarning, stacklevel=2)


def describe(cfg) -> str:
    """One line: the profile of an agent config and the settings the run uses."""
    p = cfg.protocol
    if p.format == "tags":
        what = f"tags {p.tags}, template {p.template}"
    else:
        what = f"tool calls ({', '.join(cfg.tools)}), template {p.template}, chat template {p.chat_template or 'its own'}"
    temperature = "greedy" if cfg.rollout.greedy else f"temperature {cfg.rollout.temperature:g}"
    about = PROFILES[cfg.profile].about if cfg.profile in PROFILES else f"what {cfg.model} was trained with"
    return f"model profile {cfg.profile} ({about}): {what}, {temperature}; set protocol.* to change (docs/guides/models.md)"


def announce(cfg) -> None:
    """Print `describe(cfg)` on stderr (stdout stays the command's own: JSON with --json)."""
    print(describe(cfg), file=sys.stderr, flush=True)
