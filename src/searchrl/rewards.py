"""Rewards (docs/concepts/rewards.md): the Stage-1 / Stage-2 rewards, weighted sums of named terms
(`searchrl.reward_terms`) over one `Trajectory`, its gold answers and the format verdict
(`searchrl.protocols.format_rules`). Everything here is a pure function of those.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from pydantic import ConfigDict, Field, field_validator, model_validator

from searchrl.config import StrictModel
from searchrl.data.trajectory import Trajectory
from searchrl.metrics import ANSWER_METRICS
from searchrl.protocols.base import Protocol
from searchrl.protocols.format_rules import final_answer
from searchrl.protocols.tagged import TagProtocol
from searchrl.protocols.tags import TagSet
from searchrl.registry import Registry
from searchrl.reward_terms import REWARD_TERMS, RewardInput, term_params

# ----------------------------------------------------------------------------------------------
# Stage rewards: weighted sums of named terms (searchrl.reward_terms)


# The paper's magnitudes per stage (docs/concepts/rewards.md): a stage is a preset of the same fields, so any
# stage can be given any reward (the authors' code keeps the answer reward in Stage 1, say).
REWARD_STAGES: Registry[dict[str, float]] = Registry("reward stage")
REWARD_STAGES.register("stage1")({"retrieve_weight": 1.0, "format_ok": 1.0, "format_bad": -1.0, "answer_weight": 0.0})
REWARD_STAGES.register("stage2")({"retrieve_weight": 0.0, "format_ok": 0.0, "format_bad": -2.0, "answer_weight": 1.0})


class TermConfig(StrictModel):
    """A term a stage adds to its reward: its weight, then values for the term's own parameters,
    named as in its function's signature (`searchrl.reward_terms`) and checked against it when
    the config loads, so the extra keys a strict model refuses are allowed here."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    weight: float = 1.0
    """Multiplies the term's value in the reward (costs and penalties are negative values)."""

    @property
    def params(self) -> dict:
        return dict(self.model_extra or {})


BUILT_IN_TERMS = {"retrieve": "retrieve_*", "format": "format_ok / format_bad", "answer": "answer_*"}


class RewardConfig(StrictModel):
    """Reward = retrieve_weight · R_retrieve + R_format + answer_weight · R_answer + Σ weight · term
    over `terms`. `stage` names the preset that fills every magnitude not set (defaults: the
    paper's table, docs/concepts/rewards.md); the authors' code differs in places (e.g. Stage 1 adds +0.5 for
    retrieval only when the format is right), so each is here."""

    stage: str = "stage2"
    """Preset: `stage1` (R_retrieve + R_format: learn to call search) or `stage2` (R_answer +
    R_format: learn to use the results). `1` and `2` are accepted too. Single-stage runs (the
    skip-Stage-1 ablation) use stage2, hence the default."""
    retrieve_weight: float
    """Weight of R_retrieve (stage1: 1, stage2: 0). Kept in Stage 2 it stops a model that can guess
    some answers without searching (a 135M one picking between the two names of a comparison)
    from unlearning search: search fell from 1.0 to 0.0 within 20 steps of our long CPU run at 0."""
    retrieve_hit: float = 1.0
    """R_retrieve when the rollout searched at least once (paper: +1; authors' code: +0.5)."""
    retrieve_miss: float = -1.0
    """R_retrieve when it never searched (paper: -1; authors' code: 0)."""
    retrieve_requires_format: bool = False
    """Pay retrieve_hit only when the format check passes too (the authors' code does)."""
    format_ok: float
    """R_format for a correct format (stage1: +1; stage2: 0, so the answer is the main signal)."""
    format_bad: float
    """R_format for a violation (stage1: -1; stage2: -2, a strong penalty against format collapse)."""
    answer_weight: float
    """Weight of R_answer (stage1: 0; stage2: 1; the authors' code keeps 1 in Stage 1 too)."""
    answer_metric: str = "f1"
    """R_answer metric: `f1` (paper default; avg CEM 60.6 in its Table 5), `cem` (59.5; invites
    long answers), `em` (39.7; sparse signal), or `cem_substr` (substring cover)."""
    answer_requires_format: bool = False
    """Zero R_answer when the format check fails (stops a malformed rollout from earning credit)."""
    max_answer_words: int | None = Field(default=None, ge=1)
    """Format rule `answer_length`: answers longer than this many words fail (authors' code: 10;
    paper: no cap). None = no cap."""
    require_think: bool = True
    """Format rule `think`: the reasoning sits in one think block closed right before the answer
    (paper). False drops that rule, for models too small to close `</think>` (the CPU demo)."""
    terms: dict[str, TermConfig] = Field(default_factory=dict)
    """Terms added to the three above, by name (`REWARD_TERMS`: `tool_cost`, `duplicate_query`, one
    a user registered, or a user's own by import path `package.module:function`), each with a
    weight and its parameters:
    `{duplicate_query: {weight: 1.0, penalty: 0.5}, tool_cost: {per_call: 0.05}}` (a term with
    no keys: weight 1, its defaults). Logged as `reward/<name>` like the built-in three. None in
    the paper recipe."""

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data):
        if not isinstance(data, dict):
            return data
        stage = data.get("stage", "stage2")
        name = f"stage{stage}" if isinstance(stage, int) or str(stage).isdigit() else str(stage)
        return {**REWARD_STAGES.get(name), **data, "stage": name}

    @field_validator("answer_metric")
    @classmethod
    def _metric_name(cls, v: str) -> str:
        ANSWER_METRICS.get(v)
        return v

    @field_validator("terms", mode="before")
    @classmethod
    def _empty_term_is_defaults(cls, v):
        # `terms: {duplicate_query: }` in YAML is a term with no keys
        return {name: {} if t is None else t for name, t in v.items()} if isinstance(v, dict) else v

    @field_validator("terms")
    @classmethod
    def _known_terms(cls, v: dict[str, TermConfig]) -> dict[str, TermConfig]:
        for name in v:
            if name in BUILT_IN_TERMS:
                raise ValueError(f"{name!r} is a term of every stage: set its magnitudes with {BUILT_IN_TERMS[name]} instead")
        return {name: TermConfig(weight=t.weight, **term_params(name, t.params)) for name, t in v.items()}

    def stage_terms(self) -> list[tuple[str, float, dict]]:
        """The stage's reward as (term, weight, parameters), summed in this order: R_retrieve,
        R_format and R_answer from the magnitudes above (the paper's formula), then `terms`."""
        return [
            ("retrieve", self.retrieve_weight,
             {"hit": self.retrieve_hit, "miss": self.retrieve_miss, "requires_format": self.retrieve_requires_format}),
            ("format", 1.0, {"ok": self.format_ok, "bad": self.format_bad}),
            ("answer", self.answer_weight, {"metric": self.answer_metric, "requires_format": self.answer_requires_format}),
            *((name, t.weight, t.params) for name, t in self.terms.items()),
        ]


@dataclass(frozen=True)
class RewardBreakdown:
    """One trajectory's reward and its parts (all logged; `total` is what the trainer uses)."""

    total: float
    retrieve: float
    format: float
    answer: float
    format_ok: bool
    failed_rules: list[str]
    answer_score: float  # the raw answer metric, reported in both stages
    terms: dict[str, float] = field(default_factory=dict)  # weight · value per term (the three above too)

    def to_dict(self) -> dict:
        return asdict(self)


def compute_reward(
    traj: Trajectory,
    golds: Sequence[str],
    cfg: RewardConfig,
    protocol: Protocol | TagSet,
    *,
    think_opened_in_prompt: bool | None = None,
) -> RewardBreakdown:
    """The reward of one trajectory under `cfg`: the sum of its stage's weighted terms.
    `protocol`: the run's (a `TagSet`: the tag protocol of those tags).

    The answer is `traj.answer` as the engine recorded it, else the protocol's reading of the
    policy's text (`Protocol.answer`).

    >>> from searchrl.data.trajectory import Segment
    >>> from searchrl.protocols.tags import R1SEARCHER_TAGS
    >>> t = Trajectory("q1", "Which river?", [], [], [], [],
    ...     [Segment("<|begin_of_query|>river<|end_of_query|>", "policy"),
    ...      Segment("\\n\\n<|begin_of_documents|>\\n(1)Title: T Text: x\\n<|end_of_documents|>\\n\\n", "env"),
    ...      Segment("</think><answer>the Tessaly river</answer>", "policy")], n_searches=1,
    ...     tool_calls=[{"name": "search", "arguments": {"query": "river"}, "ok": True, "error": None}])
    >>> compute_reward(t, ["Tessaly"], RewardConfig(stage=2), R1SEARCHER_TAGS).total  # F1: P=1/2, R=1
    0.6666666666666666
    >>> compute_reward(t, ["Tessaly"], RewardConfig(stage=1), R1SEARCHER_TAGS).terms
    {'retrieve': 1.0, 'format': 1.0, 'answer': 0.0}
    >>> cfg = RewardConfig(stage=1, terms={"tool_cost": {"weight": 2, "per_call": 0.25}})
    >>> r = compute_reward(t, ["Tessaly"], cfg, R1SEARCHER_TAGS)
    >>> r.total, r.terms["tool_cost"]
    (1.5, -0.5)
    """
    protocol = TagProtocol.of(protocol)
    verdict = protocol.check_format(
        traj,
        think_opened_in_prompt=think_opened_in_prompt,
        max_answer_words=cfg.max_answer_words,
        require_think=cfg.require_think,
    )
    prediction = final_answer(traj, protocol)
    x = RewardInput(golds, traj, verdict, prediction)
    parts = {name: weight * float(REWARD_TERMS.get(name)(x, **params)) for name, weight, params in cfg.stage_terms()}
    return RewardBreakdown(
        # left to right from the first term, as `retrieve + format + answer` was: the same floats
        total=functools.reduce(operator.add, parts.values()),
        retrieve=parts["retrieve"],
        format=parts["format"],
        answer=parts["answer"],
        format_ok=verdict.ok,
        failed_rules=list(verdict.failed),
        answer_score=ANSWER_METRICS.get(cfg.answer_metric)(prediction, golds),
        terms=parts,
    )
