"""One agent, built in one place: the model, the protocol it speaks, the tools it may call, how
it rolls out and where its searches go (`AgentConfig`), and the function that builds it
(`build_agent`).

Every command that runs rollouts (`train`, `eval run`, `ask`, `data select`, and through them
`eval report` and the demo) has these sections at the top level of its config: its config class
inherits them from `AgentConfig` as they are declared here, and states what differs for it as
data, its `AgentDefaults` (evaluation decodes greedily with k=5; training searches the toy world
unless told otherwise).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field, field_validator, model_validator
from pydantic.fields import FieldInfo

from searchrl.config import StrictModel
from searchrl.profiles import apply_profile
from searchrl.protocols.base import Protocol
from searchrl.protocols.config import ProtocolConfig, protocol_class
from searchrl.retrieval import RetrievalConfig
from searchrl.retrieval.base import Retriever
from searchrl.rollout import backend as backends
from searchrl.rollout.backend import GenerationBackend
from searchrl.rollout.config import RolloutConfig
from searchrl.tools import ToolContext, build_tools
from searchrl.tools.passages import format_passages

if TYPE_CHECKING:
    from searchrl.rollout.engine import RolloutEngine


@dataclass(frozen=True)
class AgentDefaults:
    """What one command's agent sections default to where its config does not set them."""

    rollout: Mapping[str, Any] = field(default_factory=dict)
    """The rollout section's keys; a rollout given in part (a flag, a file) keeps them for the keys
    it does not give, not the class's."""
    retrieval: Mapping[str, Any] = field(default_factory=dict)
    """The retrieval section's keys, when the config gives none."""
    searches: str | None = None
    """Why the command searches: a retrieval section given without a source is refused with it."""

    def fill(self, data: dict) -> dict:
        """`data` (a config's keys, as given) with the rollout keys it does not give filled in."""
        if self.rollout and isinstance(data.get("rollout"), dict):
            return {**data, "rollout": {**self.rollout, **data["rollout"]}}
        return data


def agent_field(name: str, defaults: AgentDefaults) -> FieldInfo:
    """`AgentConfig`'s field `name` as a command with `defaults` has it, for the config class and
    the reference page alike: its rollout and retrieval sections default to their keys."""
    info = copy.copy(AgentConfig.model_fields[name])
    keys = {"rollout": defaults.rollout, "retrieval": defaults.retrieval}.get(name)
    if keys:
        info.default_factory = functools.partial(info.annotation, **keys)
    return info


class AgentConfig(StrictModel):
    """Model + protocol + rollout + retrieval: what an agent is built from (`build_agent`)."""

    defaults: ClassVar[AgentDefaults] = AgentDefaults()

    model: str = Field("smollm2-135m", description="Model name (smollm2-135m, tiny-random), folder or hub id.")
    profile: str = Field(
        "auto", description="Model profile: the protocol format, tags, prompt and chat template and temperature the run "
        "uses where this config sets none (docs/guides/models.md). auto = a checkpoint's or an export's own (its "
        "agent.yaml, searchrl.json), a built-in model's (smollm2-135m: the CPU demo's search-r1 tags, oneshot prompt, temperature 0.7), a known "
        "family's (Qwen2.5, Qwen3, Llama-3.1-Instruct) or detected from the chat template (none: base; without tools: "
        "instruct; rendering tools: instruct-tools, native tool calls). A name picks one; none = no profile. The run's "
        "config.yaml holds the one chosen.",
    )
    protocol: ProtocolConfig = Field(
        default_factory=ProtocolConfig, description="Tags or native tool calls, prompt template, documents style."
    )
    tools: list[str] = Field(
        default_factory=lambda: ["search"], min_length=1,
        description="Tools the model may call: search, open, calculate, or your own as package.module:ClassName "
        "(a class with a schema and an execute method). The tag protocols speak search only.",
    )
    rollout: RolloutConfig = Field(
        default_factory=RolloutConfig, description="Generation settings: backend, k, searches, budgets, temperature, top-p."
    )
    retrieval: RetrievalConfig = Field(
        default_factory=RetrievalConfig, description="Index, retrieval server or web search the rollouts query."
    )

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if "defaults" in vars(cls):  # a command's own defaults: its sections' defaults are theirs
            for name in ("rollout", "retrieval"):
                cls.model_fields[name].default_factory = agent_field(name, cls.defaults).default_factory
            cls.model_rebuild(force=True)

    @model_validator(mode="before")
    @classmethod
    def _profile(cls, data):
        # Before validation: the keys given are what the user set; the profile fills the others,
        # then the command's rollout defaults.
        if not isinstance(data, dict):
            return data
        return cls.defaults.fill(apply_profile(data, cls.model_fields["model"].default))

    @field_validator("retrieval")
    @classmethod
    def _searches(cls, v: RetrievalConfig) -> RetrievalConfig:
        return v.required(cls.defaults.searches) if cls.defaults.searches else v

    @model_validator(mode="after")
    def _tools_of_format(self) -> AgentConfig:
        check_tools_of_format(self.protocol, self.tools)
        return self


def check_tools_of_format(protocol: ProtocolConfig, tools: list[str]) -> None:
    """The run's tools fit its protocol (tags speak the search tool alone); a ValueError for a
    config validator otherwise."""
    protocol_class(protocol.format).check_config(protocol, tools)


def build_protocol(cfg: AgentConfig, tokenizer) -> Protocol:
    """The protocol of `cfg`, bound to `tokenizer` where it needs one (`Protocol.build`; tool
    calls: the chat template's self-test runs here)."""
    return protocol_class(cfg.protocol.format).build(cfg.protocol, cfg.tools, tokenizer)


def load_backend(cfg: AgentConfig) -> GenerationBackend:
    """The generation backend `cfg.rollout.backend` names, holding `cfg.model`."""
    return backends.make_backend(cfg.rollout.backend, cfg.model, **cfg.rollout.backend_options())


@dataclass
class Agent:
    """A model that speaks a protocol and searches: protocol, backend, retriever and the rollout
    engine over them. `close()` frees what `build_agent` opened (never what its caller lent)."""

    protocol: Protocol
    backend: GenerationBackend
    retriever: Retriever | None
    engine: RolloutEngine
    owned: list = field(default_factory=list)

    def close(self) -> None:
        for service in reversed(self.owned):
            service.close()
        self.owned.clear()


def build_agent(
    cfg: AgentConfig,
    backend: GenerationBackend | None = None,
    retriever: Retriever | None = None,
    *,
    search: bool = True,
    run: str | None = None,
    new_run: bool = False,
    web_record: str | None = None,
    protocol: Protocol | None = None,
    rollout: RolloutConfig | None = None,
) -> Agent:
    """The agent of `cfg`. A `backend` or `retriever` given is used as it is (a loaded model, a
    wrapped or shared retriever) and stays the caller's to close; the others are built here: the
    retriever first and checked (a wrong index or a server that is down fails in a second, not
    after the model's minutes of loading), then the backend. `search=False`: no retriever at all
    (answers without retrieval). `run` / `new_run`: the web search budget the retriever counts
    against; `web_record`: the folder web search records into (`RetrievalConfig.open`).
    `protocol` / `rollout` replace the config's (evaluation's answer-only baselines)."""
    from searchrl.rollout.engine import RolloutEngine

    owned: list = []
    try:
        if retriever is None and search:
            retriever = cfg.retrieval.open(run=run, new_run=new_run, web_record=web_record)
            owned.append(retriever)
            retriever.check()
        if backend is None:
            backend = load_backend(cfg)
            owned.append(backend)
    except BaseException:
        for service in reversed(owned):
            service.close()
        raise
    rollout = rollout or cfg.rollout
    style = cfg.protocol.doc_style
    context = ToolContext.of(retriever, rollout.k, lambda passages: format_passages(passages, style))
    owned.append(context)
    try:
        tools = build_tools(cfg.tools, context)
        owned.extend(tools.values())
        protocol = protocol or build_protocol(cfg, backend.tokenizer)
    except BaseException:
        for service in reversed(owned):
            service.close()
        raise
    engine = RolloutEngine(backend, retriever, protocol, rollout, tools)
    return Agent(protocol, backend, retriever, engine, owned)
