"""The run's retriever as the trainer meets it: only through the rollout layer, which searches
with it (docs/concepts/architecture.md). The trainer publishes weights and takes trajectories;
what it needs of retrieval besides is here.

- `RunSearch.open`: the preflight check, before the model loads: the configured retriever opened
  and queried once, so a server that is down fails in seconds with the setting that names it;
- `RunSearch.gold_examples`: an SFT stage's training items, its questions' gold search paths
  (`rollout.gold`), found once before training with the same retriever;
- `RunSearch.drop_shortcuts`: an RL stage's questions less those one search can answer
  (`rollout.gold.shortcut`), when the stage asks for it;
- `RunSearch.retriever`: what the rollout worker then searches with (`RolloutWorker.create`);
- `RetrievalCounts`, `retrieval_record`: what a rollout source's `searched()` reports of a
  batch's searches (the query cache wrapper's counts), and the step's metrics from every rank's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from searchrl import metric_names as mn
from searchrl.data.types import Question
from searchrl.errors import SearchRLError
from searchrl.retrieval import RetrievalConfig
from searchrl.retrieval.base import Retriever
from searchrl.retrieval.querycache import RetrievalCounts
from searchrl.rollout.config import RolloutConfig
from searchrl.rollout.gold import GoldPath, gold_paths, shortcut, support_passages

__all__ = ["RetrievalCounts", "RunSearch", "retrieval_record"]


@dataclass(frozen=True)
class RunSearch:
    """The run's retriever (opened and checked by `open`)."""

    retriever: Retriever

    @classmethod
    def open(cls, retrieval: RetrievalConfig, run: str | Path) -> RunSearch:
        """The retriever `retrieval` configures, queried once; web search counts against the
        budget of the run directory `run`. Errors start with the setting to fix."""
        r = retrieval
        where = f"retrieval.web.provider={r.web.provider}" if r.web.provider else f"retrieval.url={r.url}" if r.url else f"retrieval.index={r.index}"
        try:
            retriever = r.open(run=str(Path(run).resolve()))
            retriever.search(["preflight"], 1)  # a server that is down fails now, not in the first rollout
        except SearchRLError as exc:
            raise SearchRLError(f"{where}: {exc}") from None
        return cls(retriever)

    def gold_examples(
        self, questions: list[Question], rollout: RolloutConfig, key: str, evidence: bool = False
    ) -> list[GoldPath]:
        """The gold paths of the stage's questions that have one, searched as rollouts search
        (`rollout.k` passages, at most `rollout.max_searches` searches); `key` names the stage in
        errors; `evidence`: the paths quote their evidence sentences (`rollout.gold`)."""
        paths = gold_paths(questions, self.retriever, rollout.k, rollout.max_searches, evidence)
        kept = [p for p in paths if p is not None]
        if not kept:
            raise SearchRLError(
                f"{key}.kind=sft: none of the {len(questions)} questions has a gold search path (supporting_ids whose "
                f"passages the index finds by title within rollout.k={rollout.k}, at most rollout.max_searches="
                f"{rollout.max_searches} of them); use a dataset with supporting ids (e.g. toyworld:train)"
            )
        return kept


    def drop_shortcuts(self, questions: list[Question], key: str) -> list[Question]:
        """`questions` less those whose first supporting passage names the answer (one search
        answers them: an outcome reward would pay for stopping after it); questions without
        supporting ids are kept. `key` names the stage in errors."""
        passages = support_passages(self.retriever, {q.supporting_ids[0] for q in questions if q.supporting_ids})
        kept = [q for q in questions if not (q.supporting_ids and q.supporting_ids[0] in passages
                                             and shortcut(q, passages[q.supporting_ids[0]]))]
        if not kept:
            raise SearchRLError(f"{key}.drop_shortcuts: one search answers every one of the {len(questions)} questions; "
                                f"set {key}.drop_shortcuts=false or choose other question_types")
        return kept


def retrieval_record(per_rank: list[RetrievalCounts]) -> dict:
    """The step's searches: `retrieval_s`, the slowest rank's seconds in search (cache included);
    `retrieval_queries` over every rank; `retrieval_cache_hit_rate`, the share of them answered
    without a search of their own (the in-process cache, or a repeat in the same batched call);
    None when nothing was searched or no rank has a cache."""
    queries = sum(c.queries for c in per_rank)
    hits = sum(c.cache_hits for c in per_rank)
    return {
        mn.RETRIEVAL_S: max(c.seconds for c in per_rank),
        mn.RETRIEVAL_QUERIES: queries,
        mn.RETRIEVAL_CACHE_HIT_RATE: hits / queries if queries and any(c.cached for c in per_rank) else None,
    }
