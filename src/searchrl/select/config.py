"""`SelectConfig`: the config of one `searchrl data select` run (the run is `searchrl.select.run`,
its report `searchrl.select.report`; both read this)."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from searchrl.rollout.agent import AgentConfig, AgentDefaults


class SelectConfig(AgentConfig):
    """One data-selection run. Every field is also a `--set key=value` (nested: `rollout.k=3`); the
    common ones are `searchrl data select` flags. The model is the reference model that samples the
    rollouts (paper: Qwen-2.5-7B-Instruct); they are sampled, never greedy, with the seed and
    samples_per_question set per round, in engine batches of rollout.batch_size; they search the
    toy world unless told otherwise."""

    defaults = AgentDefaults(retrieval={"index": "toyworld"})
    dataset: str = Field(
        "toyworld:train", description="Candidate questions: catalog name, question file or hf:NAME."
    )
    limit: int | None = Field(None, ge=1, description="Only the first N questions; None = all.")
    metric: str = Field(
        "cem",
        description="Answer metric that decides correctness: em, f1, cem (cover-EM, the authors' token form) or cem_substr.",
    )
    min_score: float = Field(
        1.0,
        gt=0,
        le=1,
        description="A rollout is correct when metric(answer, gold) >= this (e.g. metric=f1 min_score=0.8).",
    )
    rollouts_per_round: int = Field(
        8, ge=1, description="Rollouts sampled per question in one round."
    )
    questions_per_round: int = Field(
        8,
        ge=1,
        description="Questions sampled together in one round (so a round generates up to "
        "questions_per_round x rollouts_per_round sequences, in engine batches of rollout.batch_size).",
    )
    max_rollouts: int = Field(
        32,
        ge=1,
        description="Cap per question: a question with no correct rollout among this many is `unsolved`. "
        "Set it above difficult_from, or no question can be Difficult.",
    )
    medium_from: int = Field(
        10, ge=1, description="Count from which a question is Medium (paper: Easy < 10)."
    )
    difficult_from: int = Field(
        21,
        ge=1,
        description="Count from which a question is Difficult (paper: Medium 10-20, Difficult > 20).",
    )
    seed: int = Field(
        0,
        description="Seeds the sampling of every round; same seed and settings, same rollouts (on the same hardware).",
    )
    out: str | None = Field(
        None,
        description="Output folder: easy/medium/difficult/unsolved.jsonl, summary.md/.json, histogram.png, "
        "progress.jsonl, config.yaml. Running again with the same folder resumes.",
    )

    @field_validator("metric")
    @classmethod
    def _metric_name(cls, v: str) -> str:
        from searchrl.metrics import ANSWER_METRICS

        ANSWER_METRICS.get(v)
        return v

    @model_validator(mode="after")
    def _check(self) -> SelectConfig:
        if self.medium_from > self.difficult_from:
            raise ValueError(
                f"medium_from ({self.medium_from}) must not exceed difficult_from ({self.difficult_from})"
            )
        if self.rollout.greedy:
            raise ValueError(
                "rollout.greedy must be false: greedy rollouts of one question are all the same, so counting them measures nothing"
            )
        if self.rollout.samples_per_question != 1:
            raise ValueError(
                "rollout.samples_per_question is set per round: use rollouts_per_round instead"
            )
        if self.retrieval.source is None:
            raise ValueError(
                "selection searches: set retrieval.index (e.g. toyworld), retrieval.url or retrieval.web"
            )
        return self
