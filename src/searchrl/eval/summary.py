"""metrics.json and metrics.md of an evaluation run: the scores of its prediction records, its
search and format rates, provenance, and what it spent, under the names of `eval.result_names`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from searchrl import metric_names as mn
from searchrl.eval import behaviour
from searchrl.eval import result_names as rn
from searchrl.eval.multihop import HEADER, multihop_metrics, right_aligned, row_of_record, type_rows
from searchrl.eval.spending import cache_hit_rate, spending_rows
from searchrl.tables import markdown_table
from searchrl.tools.metrics import tool_metrics

if TYPE_CHECKING:
    from searchrl.eval.config import EvalConfig


def retrieval_recall(recs: Sequence[dict]) -> float | None:
    """Mean over records with supporting ids of the share of them found among ALL passages the
    trajectory retrieved (every search together); None when no record has supporting ids or the
    method retrieves nothing."""
    shares = []
    for r in recs:
        gold = set(r["supporting_ids"])
        if gold and r["method"] != "direct":
            seen = {pid for ids in r["retrieved_ids"] for pid in ids}
            shares.append(len(gold & seen) / len(gold))
    return sum(shares) / len(shares) if shares else None


def summarize(cfg: EvalConfig, recs: Sequence[dict], spent: dict) -> dict:
    """metrics.json: answer scores (via `score_records`, so they equal `searchrl eval score`),
    search and format rates, policy tokens per question, retrieval recall, provenance, and what
    was `spent` over the runs of a resumed evaluation: `seconds` (wall time of retrieval +
    generation; loading the model, data and index excluded), judge and web search counters,
    retrieval queries, cache hits and seconds in search (`retrieval_cache_hit_rate` from them);
    then the multi-hop behaviour per question type (`searchrl.eval.multihop`)."""
    from searchrl.eval.score import score_records

    scores = score_records(recs)
    n = len(recs)
    mean = (lambda xs: sum(xs) / n) if n else (lambda xs: None)
    return {
        rn.N: n,
        rn.EM: scores["em"],
        rn.F1: scores["f1"],
        rn.COVER_EM: scores["cover_em"],
        rn.COVER_EM_SUBSTRING: scores["cover_em_substring"],
        rn.ACC_L: scores["acc_l"],
        rn.MEAN_SEARCHES: mean([r["n_searches"] for r in recs]),
        rn.SEARCH_RATE: mean([r["n_searches"] >= 1 for r in recs]),
        rn.MEAN_GENERATED_TOKENS: mean([r["n_policy_tokens"] for r in recs]),
        rn.FORMAT_OK_RATE: mean([r["format_ok"] for r in recs]),
        rn.RETRIEVAL_RECALL: retrieval_recall(recs),
        rn.ANSWERED_RATE: mean([r["prediction"] is not None for r in recs]),
        rn.STOP_REASONS: dict(Counter(r["stop_reason"] for r in recs)),
        # documents blocks cut to fit the model's context (records of older runs have no such field)
        rn.TRUNCATED_DOCUMENTS: sum(r.get("truncated_documents", 0) for r in recs),
        **tool_metrics([r.get("tool_calls", []) for r in recs], [r.get("timing", {}) for r in recs],
                       cfg.tools if cfg.method == "agent" else []),
        **spent,
        rn.SECONDS: round(spent[rn.SECONDS], 3),  # as retrieval_s: rounding alike keeps search time <= it
        **({rn.RETRIEVAL_CACHE_HIT_RATE: cache_hit_rate(spent)} if rn.RETRIEVAL_QUERIES in spent else {}),
        rn.MODEL: cfg.model,
        rn.METHOD: cfg.method,
        rn.DATASET: cfg.dataset,
        rn.RETRIEVER: None if cfg.method == "direct" else cfg.retrieval.source,
        **({rn.WEB: web_provenance(cfg)} if cfg.method != "direct" and cfg.retrieval.web.provider else {}),
        rn.K: cfg.rollout.k,
        rn.FORMAT: cfg.protocol.format,
        rn.TOOLS: list(cfg.tools) if cfg.method == "agent" else [],
        rn.TAGS: cfg.protocol.tags,
        rn.TEMPLATE: cfg.protocol.template,
        **multihop_metrics([row_of_record(r) for r in recs]),
        # an agent's failure modes; rag's documents are in its prompt, not its records
        **(behaviour.behaviour_metrics([behaviour.of_record(r) for r in recs]) if cfg.method == "agent" else {}),
    }


def web_provenance(cfg: EvalConfig) -> str:
    """Where a web run's search results came from: "live" (and where they were recorded) or
    "replayed from RUN" (docs/guides/web-replay.md)."""
    web = cfg.retrieval.web
    if web.replay is not None:
        return f"replayed from {web.replay}"
    return "live, recorded in web_record/" if web.record else "live"


METRICS_HEADER = ("metric", "value")
BEHAVIOUR_LABELS = {
    mn.QUERY_ECHO_RATE: "answer is its only query (echo) %",
    mn.UNGROUNDED_RATE: "answer in no document read %",
    mn.OVERHOP_RATE: "searched on after the answer was read %",
    mn.AVOID_RATE: "no answer %",
    mn.EMPTY_SEARCH_RATE: "searches that found nothing %",
}


def protocol_label(metrics: dict) -> str:
    """"search-r1 / oneshot" for tags; "tool calls (search, open) / tools-fewshot" for native calls."""
    if metrics.get(rn.FORMAT) == "tool-calls":  # the tags preset does not apply to native calls
        return f"tool calls ({', '.join(metrics.get(rn.TOOLS) or [])}) / {metrics[rn.TEMPLATE]}"
    return f"{metrics[rn.TAGS]} / {metrics[rn.TEMPLATE]}"


def metrics_rows(metrics: dict) -> list[tuple[str, str]]:
    """One run's metrics as (label, value) rows: what metrics.md and `eval run` show."""
    rows = [
        ("model", metrics[rn.MODEL]),
        ("method", metrics[rn.METHOD]),
        ("dataset", f"{metrics[rn.DATASET]} (n={metrics[rn.N]})"),
        ("retriever", f"{metrics[rn.RETRIEVER]} (k={metrics[rn.K]})" if metrics[rn.RETRIEVER] else "-"),
        ("protocol", protocol_label(metrics)),
    ]
    if rn.WEB in metrics:
        rows.append(("web", metrics[rn.WEB]))
    labels = {
        rn.EM: "EM %",
        rn.F1: "F1 %",
        rn.COVER_EM: "Cover-EM % (token cover, authors' code)",
        rn.COVER_EM_SUBSTRING: "Cover-EM % (substring, FlashRAG acc)",
        rn.ACC_L: "ACC_L % (LLM judge)",
        rn.FORMAT_OK_RATE: "format OK %",
        rn.SEARCH_RATE: "questions with >= 1 search %",
        rn.RETRIEVAL_RECALL: "supporting passages retrieved %",
    }
    for key, label in labels.items():
        rows.append((label, fmt_percent(metrics[key])))
    for key, label in BEHAVIOUR_LABELS.items():  # agent runs only (and runs written since)
        if key in metrics:
            rows.append((label, fmt_percent(metrics[key])))
    rows.append(("searches / question", fmt_number(metrics[rn.MEAN_SEARCHES], 2)))
    rows.append(("generated tokens / question", fmt_number(metrics[rn.MEAN_GENERATED_TOKENS], 1)))
    rows.append(("seconds", fmt_number(metrics[rn.SECONDS], 1)))
    cut, full = metrics.get(rn.TRUNCATED_DOCUMENTS, 0), metrics.get(rn.STOP_REASONS, {}).get("context_full", 0)
    if cut or full:  # the model's context bounded the run (rollout.engine): shown only when it did
        rows.append(("documents blocks cut / rollouts stopped, context full", f"{cut} / {full}"))
    return rows + spending_rows(metrics)


def metrics_markdown(metrics: dict) -> str:
    """metrics.md: one run's metrics as a two-column Markdown table, then the per-type table."""
    return markdown_table(METRICS_HEADER, metrics_rows(metrics), (False, True)) + by_type_markdown(metrics)


def by_type_markdown(metrics: dict) -> str:
    """The multi-hop behaviour per question type as a Markdown table after a blank line; "" for
    runs written before it was measured."""
    rows = type_rows(metrics)
    if not rows:
        return ""
    caption = "By question type (`all`: every question; supp. hop k: supporting passages first found by search k):"
    return f"\n{caption}\n\n" + markdown_table(HEADER, rows, right_aligned(HEADER))


def fmt_percent(value) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}"


def fmt_number(value, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"
