"""Retrieval recall: how many of a question's supporting paragraphs the retriever finds.

The query is the question text itself (no rewriting), as a one-shot baseline for the
search-while-reasoning policy, which may issue better sub-queries.
"""

from __future__ import annotations

from collections.abc import Sequence

from searchrl.data.types import Question
from searchrl.errors import SearchRLError
from searchrl.retrieval.base import Retriever


def _with_support(questions: Sequence[Question]) -> list[Question]:
    scored = [q for q in questions if q.supporting_ids]
    if not scored:
        raise SearchRLError(
            "none of these questions has supporting_ids, so recall cannot be measured; "
            "use a dataset with gold paragraphs mapped to the index (hotpotqa-ircot, musique, 2wiki with localwiki)"
        )
    return scored


def recall_at_k(
    questions: Sequence[Question], retriever: Retriever, k: int, *, batch_size: int = 64, progress: bool = True
) -> dict:
    """Recall of supporting paragraphs in the top `k` results of each question.

    Returns `recall` (share of a question's supporting ids in its top k, averaged over
    questions), `all_found` (share of questions whose supporting ids are all in the top k),
    `any_found` (at least one), plus `k`, `questions` (scored) and `skipped` (no supporting
    ids, so nothing to find). Questions without supporting ids are skipped, not counted as 0.
    """
    if k < 1:
        raise SearchRLError(f"k must be at least 1, got {k}")
    scored = _with_support(questions)
    recalls: list[float] = []
    all_found = any_found = 0
    batches = range(0, len(scored), batch_size)
    if progress:
        from tqdm import tqdm

        batches = tqdm(batches, desc=f"retrieving top-{k}", unit="batch", leave=False)
    for start in batches:
        batch = scored[start : start + batch_size]
        results = retriever.search([q.question for q in batch], k)
        for q, hits in zip(batch, results):
            gold = set(q.supporting_ids)
            found = len(gold & {p.id for p in hits[:k]})
            recalls.append(found / len(gold))
            all_found += found == len(gold)
            any_found += found > 0
    n = len(scored)
    return {
        "k": k,
        "questions": n,
        "skipped": len(questions) - n,
        "recall": sum(recalls) / n,
        "all_found": all_found / n,
        "any_found": any_found / n,
    }


def retrieval_command(dataset: str, index: str, k: int, limit: int | None, as_json: bool) -> dict:
    """`searchrl eval retrieval`: load, search, print recall@k as a table or one JSON line."""
    import json
    import time

    from searchrl.data.catalog import load_dataset
    from searchrl.retrieval import open_retriever

    questions = load_dataset(dataset)
    if limit is not None:
        questions = questions[:limit]
    _with_support(questions)  # fail before building an index for nothing
    retriever = open_retriever(index)
    started = time.perf_counter()
    try:
        result = recall_at_k(questions, retriever, k, progress=not as_json)
    finally:
        retriever.close()
    result.update(dataset=dataset, index=index, seconds=round(time.perf_counter() - started, 2))
    if as_json:
        print(json.dumps(result))
        return result
    from rich.console import Console

    from searchrl.tables import Column, print_table

    rows = [
        [f"recall@{k}", f"{result['recall']:.3f}"],
        [f"all supporting found@{k}", f"{result['all_found']:.3f}"],
        [f"any supporting found@{k}", f"{result['any_found']:.3f}"],
        ["questions scored", str(result["questions"])],
        ["skipped (no supporting ids)", str(result["skipped"])],
        ["search time (s)", f"{result['seconds']:.1f}"],
    ]
    print_table(Console(), [Column("metric", wrap=True), Column("value", right=True)], rows,
                title=f"retrieval recall: {dataset} on {index}")
    return result
