"""One agent, built in one place: the model, the protocol it speaks, how it rolls out and where
its searches go (`AgentConfig`), and the function that builds it (`build_agent`).

Every command that runs rollouts (`train`, `eval run`, `ask`, `data select`, and through them
`eval report` and the demo) has these four sections at the top level of its config, as it always
had: its config class inherits them from `AgentConfig`, redeclaring a field only to change its
default or its help (evaluation decodes greedily with k=5; training must search). The tool
registry and the native tool-call format join this section next to `protocol`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import Field

from searchrl.config import StrictModel
from searchrl.protocol import Protocol, ProtocolConfig
from searchrl.retrieval import RetrievalConfig
from searchrl.retrieval.base import Retriever
from searchrl.rollout import backend as backends
from searchrl.rollout.backend import GenerationBackend
from searchrl.rollout.config import RolloutConfig

if TYPE_CHECKING:
    from searchrl.rollout.engine import RolloutEngine


class AgentConfig(StrictModel):
    """Model + protocol + rollout + retrieval: what an agent is built from (`build_agent`)."""

    model: str = Field("smollm2-135m", description="Model name (smollm2-135m, tiny-random), folder or hub id.")
    protocol: ProtocolConfig = Field(default_factory=ProtocolConfig, description="Tags, prompt template, documents style.")
    rollout: RolloutConfig = Field(
        default_factory=RolloutConfig, description="Generation settings: backend, k, searches, budgets, temperature, top-p."
    )
    retrieval: RetrievalConfig = Field(
        default_factory=RetrievalConfig, description="Index, retrieval server or web search the rollouts query."
    )


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
    protocol: Protocol | None = None,
    rollout: RolloutConfig | None = None,
) -> Agent:
    """The agent of `cfg`. A `backend` or `retriever` given is used as it is (a loaded model, a
    wrapped or shared retriever) and stays the caller's to close; the others are built here: the
    retriever first and checked (a wrong index or a server that is down fails in a second, not
    after the model's minutes of loading), then the backend. `search=False`: no retriever at all
    (answers without retrieval). `run` / `new_run`: the web search budget the retriever counts
    against (`RetrievalConfig.open`). `protocol` / `rollout` replace the config's (evaluation's
    answer-only baselines)."""
    from searchrl.rollout.engine import RolloutEngine

    owned: list = []
    try:
        if retriever is None and search:
            retriever = cfg.retrieval.open(run=run, new_run=new_run)
            owned.append(retriever)
            retriever.check()
        if backend is None:
            backend = load_backend(cfg)
            owned.append(backend)
    except BaseException:
        for service in reversed(owned):
            service.close()
        raise
    protocol = protocol or Protocol.from_config(cfg.protocol)
    engine = RolloutEngine(backend, retriever, protocol, rollout or cfg.rollout)
    return Agent(protocol, backend, retriever, engine, owned)
