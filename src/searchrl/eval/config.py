"""`EvalConfig`: the config of one `searchrl eval run` (the run itself is `searchrl.eval.run`; its
summary and `eval report` read this config too, so it lives apart from both)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from searchrl.agent import AgentConfig
from searchrl.judge import JudgeConfig
from searchrl.protocols.config import ProtocolConfig
from searchrl.retrieval import RetrievalConfig
from searchrl.rollout.config import EVAL_ROLLOUT, EvalRollout, RolloutConfig

METHODS = ("agent", "rag", "direct")


class EvalConfig(AgentConfig):
    """One evaluation run. Every field is also a `--set key=value` (nested: `rollout.k=3`); the
    common ones are `searchrl eval run` flags."""

    method: Literal["agent", "rag", "direct"] = Field(
        "agent",
        description="agent: the model searches while it reasons (greedy rollouts); rag: retrieve "
        "top-k with the question once, answer from the passages; direct: answer without retrieval.",
    )
    dataset: str = Field(
        "toyworld:test", description="Catalog dataset name, question file path, or hf:NAME[@CONFIG][:SPLIT]."
    )
    limit: int | None = Field(None, ge=1, description="Evaluate only the first N questions; None = all.")
    protocol: ProtocolConfig = Field(
        default_factory=ProtocolConfig,
        description="Tags, prompt template, documents style. Rag/direct use their own answer prompt, in chat form "
        "when the template is a chat one.",
    )
    rollout: EvalRollout = Field(
        default_factory=lambda: RolloutConfig(**EVAL_ROLLOUT),
        description="Generation: backend, k (paper: 5 in evaluation), searches and policy tokens of an agent rollout, "
        "batch size; greedy. Rag/direct serve no search and answer within answer_max_new_tokens.",
    )
    retrieval: RetrievalConfig = Field(
        default_factory=RetrievalConfig, description="Index, retrieval server or web search; agent and rag need one, direct none."
    )
    judge: JudgeConfig = Field(
        default_factory=JudgeConfig, description="ACC_L: the LLM judge asked about every prediction (judge.url null = none); "
        "verdicts are cached on disk, so scoring the same predictions again costs nothing.",
    )
    answer_max_new_tokens: int = Field(
        64, ge=1, description="Rag/direct: tokens for the answer. It is a few words and generation stops at the "
        "closing answer tag or the turn end; the budget only cuts a model that rambles (its first line is kept).",
    )
    require_think: bool = Field(
        True, description="Format rule `think` in the format-OK rate; false as in training runs that drop it (the CPU demo)."
    )
    dump_tokens: bool = Field(
        False, description="Also write prompt/response token ids, loss mask and log-probs to predictions.jsonl."
    )
    out: str | None = Field(
        None, description="Output folder (created). One that holds a run is refused: continue it with "
        "`eval run --resume DIR`, or start over with `--overwrite`.",
    )

    @model_validator(mode="after")
    def _check(self) -> EvalConfig:
        if self.method != "direct" and self.retrieval.source is None:
            raise ValueError(
                f"method {self.method!r} retrieves: give an index (e.g. --index toyworld) or a "
                "retriever URL (e.g. --retriever-url http://127.0.0.1:8000) or a web search provider (--web searxng)"
            )
        if self.rollout.samples_per_question != 1:
            raise ValueError("rollout.samples_per_question must be 1: evaluation scores one prediction per question")
        return self
