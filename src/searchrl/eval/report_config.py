"""The config of `searchrl eval report` and the eval runs it plans. The report's runner
(`searchrl.eval.report`) and its tables (`searchrl.eval.report_table`) both read them, so they live
apart from both."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from searchrl.config import StrictModel
from searchrl.eval.config import EvalConfig
from searchrl.judge import JudgeConfig
from searchrl.profiles import apply_profile
from searchrl.protocols.config import ProtocolConfig
from searchrl.rollout.agent import AgentConfig, AgentDefaults, agent_field, check_tools_of_format
from searchrl.rollout.config import RolloutConfig

DEFAULT_DATASETS = [
    "hotpotqa-ircot",
    "2wiki",
    "musique",
    "bamboogle",
    "r1s-hotpotqa500",
    "r1s-2wiki500",
    "r1s-musique500",
]
DEFAULT_INDEXES = {"bm25": "localwiki", "dense": "localwiki-dense"}
AGENT_KEYS = ("profile", "protocol", "tools")  # what the model profile fills (`searchrl.profiles`)


class ReportConfig(StrictModel):
    """`searchrl eval report`. Every field is also a `--set key=value`; the shared sections
    (protocol, rollout, judge) are those of `eval run` and go unchanged into every run. The agent
    sections but retrieval are the agent config's, with `eval run`'s defaults: the model evaluated
    (a hub id, a checkpoint or a `searchrl export` folder), and the protocol and tools of its
    agent runs, where not set the model profile's (a checkpoint's or an export's own: what it was
    trained with; set otherwise, it is used and warned about)."""

    defaults: ClassVar[AgentDefaults] = EvalConfig.defaults
    model: str = AgentConfig.model_fields["model"]
    profile: str = AgentConfig.model_fields["profile"]
    datasets: list[str] = Field(
        default_factory=lambda: list(DEFAULT_DATASETS),
        description="Catalog names or question files. Those whose questions carry supporting ids (their paragraphs are in "
        "the corpus) run every method; the others (Bamboogle, R1-Searcher's 500 sets) run direct only, closed-book.",
    )
    methods: list[Literal["direct", "rag", "agent"]] = Field(
        default_factory=lambda: ["direct", "rag", "agent"], description="Methods of `eval run`."
    )
    retrievers: list[str] = Field(
        default_factory=lambda: list(DEFAULT_INDEXES),
        description="Retrievers of rag and agent, by their name in `indexes` (bm25, dense). Dense builds its index "
        "once (~17 CPU-min for localwiki), then searches as fast as BM25 does on this corpus size.",
    )
    indexes: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_INDEXES),
        description="Retriever name -> the index it searches (catalog name or index directory).",
    )
    limit: int | None = Field(
        50, ge=1, description="First N questions of each dataset (CPU-sized default); null = all."
    )
    protocol: ProtocolConfig = AgentConfig.model_fields["protocol"]
    tools: list[str] = AgentConfig.model_fields["tools"]
    rollout: RolloutConfig = agent_field("rollout", EvalConfig.defaults)
    judge: JudgeConfig = Field(
        default_factory=JudgeConfig, description="ACC_L judge (judge.url null = no ACC_L column)."
    )
    require_think: bool = Field(
        True,
        description="Format rule `think` in the format-OK rate; false for a model trained without it (the CPU demo).",
    )
    out: str = Field(
        "runs/report",
        description="Report folder: runs/<dataset>__<method>[__<retriever>]/, report.md, plots/.",
    )

    @model_validator(mode="before")
    @classmethod
    def _profile(cls, data):
        # As in an agent config: the keys given are what the user set, the model profile fills the
        # protocol and tools. The rollout stays the report's (greedy), so finished runs stay valid.
        if not isinstance(data, dict):
            return data
        given = {key: data[key] for key in ("model", *AGENT_KEYS) if key in data}
        filled = apply_profile(given, cls.model_fields["model"].default)
        data = {**data, **{key: filled[key] for key in ("model", *AGENT_KEYS) if key in filled}}  # a run: its checkpoint
        return cls.defaults.fill(data)

    @model_validator(mode="after")
    def _check(self) -> ReportConfig:
        check_tools_of_format(self.protocol, self.tools)
        for field in ("datasets", "methods", "retrievers"):
            values = getattr(self, field)
            if not values or len(set(values)) != len(values):
                raise ValueError(f"{field} must name at least one entry, each once (got {values})")
        unknown = [r for r in self.retrievers if r not in self.indexes]
        if unknown:
            raise ValueError(
                f"retrievers {unknown} have no index in `indexes` ({', '.join(self.indexes)})"
            )
        return self


@dataclass(frozen=True)
class PlannedRun:
    """One `eval run` of the report: what it evaluates and the config it runs with."""

    dataset: str
    method: str
    retriever: str | None  # None: direct
    closed_book: bool
    cfg: EvalConfig

    @property
    def name(self) -> str:
        return dataset_name(self.dataset)

    @property
    def label(self) -> str:
        return " · ".join(x for x in (self.name, self.method, self.retriever) if x)


def dataset_name(dataset: str) -> str:
    """A dataset as the report shows it: a catalog name, or a question file's name without suffix."""
    path = Path(dataset)
    return path.stem if path.suffix else dataset
