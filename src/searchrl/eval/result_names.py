"""The keys of an evaluation's `metrics.json`: one schema that `eval run` writes (`eval.summary`,
`eval.spending`) and `eval compare`, `eval report`, the model card and the demo read, as
`searchrl.metric_names` is the training step's.

Each key is a `metric_names.Metric` (a name, its kind, a one-line meaning; a family holds one
`<slot>`). The tool, multi-hop and behaviour keys are the training schema's own entries: both
report them under the same names. Code writes and reads `result_names.EM`, never "em", so a
renamed key cannot leave a reader behind.
"""

from __future__ import annotations

from searchrl import metric_names as mn
from searchrl.metric_names import Metric

# What each kind groups, in the order a reader lists them.
KINDS = {
    "answer": "The answers against the gold answers, mean over the questions.",
    "rollout": "What the model did on the questions.",
    "provenance": "What was evaluated, and how.",
    "spending": "Time, and what the run spent on retrieval, the judge and web search, summed over its invocations.",
    "tools": mn.KINDS["tools"],
    "multihop": mn.KINDS["multihop"],
    "behaviour": mn.KINDS["behaviour"],
}

SCHEMA: dict[str, Metric] = {}


def _result(name: str, kind: str, meaning: str) -> str:
    assert name not in SCHEMA and kind in KINDS, name
    SCHEMA[name] = Metric(name, kind, meaning)
    return name


# --- answer
N = _result("n", "answer", "Questions evaluated.")
EM = _result("em", "answer", "Exact match after normalisation (no answer scores 0).")
F1 = _result("f1", "answer", "Token F1 against the best gold answer (no answer scores 0).")
COVER_EM = _result("cover_em", "answer", "Cover-EM, token form (the R1-Searcher authors' code): every gold token in the answer.")
COVER_EM_SUBSTRING = _result("cover_em_substring", "answer", "Cover-EM, substring form (FlashRAG's acc): the gold answer within the answer.")
ACC_L = _result("acc_l", "answer", "Share the LLM judge calls right (null without a judge).")
ANSWERED_RATE = _result("answered_rate", "answer", "Share of questions with an answer.")

# --- rollout
MEAN_SEARCHES = _result("mean_searches", "rollout", "Searches per question.")
SEARCH_RATE = _result("search_rate", "rollout", "Share of questions searched at least once.")
MEAN_GENERATED_TOKENS = _result("mean_generated_tokens", "rollout", "Policy tokens per question.")
FORMAT_OK_RATE = _result("format_ok_rate", "rollout", "Share of answers that pass the format check.")
RETRIEVAL_RECALL = _result("retrieval_recall", "rollout",
                           "Share of a question's supporting passages among all it retrieved, mean over the questions that "
                           "name some (null: none does, or direct).")
STOP_REASONS = _result("stop_reasons", "rollout", "Questions per stop reason (answer, budget, context_full, ...).")
TRUNCATED_DOCUMENTS = _result("truncated_documents", "rollout", "Documents blocks cut to fit the model's context.")

# --- provenance
MODEL = _result("model", "provenance", "The model evaluated.")
METHOD = _result("method", "provenance", "agent, rag or direct.")
DATASET = _result("dataset", "provenance", "The dataset's name or file.")
RETRIEVER = _result("retriever", "provenance", "The index, server or web provider searched (null: direct).")
WEB = _result("web", "provenance", "Web search only: live (and where recorded) or replayed from a run.")
K = _result("k", "provenance", "Passages per search.")
FORMAT = _result("format", "provenance", "The protocol: tags or tool-calls.")
TOOLS = _result("tools", "provenance", "The tools an agent was given ([] for rag and direct).")
TAGS = _result("tags", "provenance", "The tag set of the protocol.")
TEMPLATE = _result("template", "provenance", "The prompt template.")

# --- spending (`eval.spending`)
SECONDS = _result("seconds", "spending", "Wall seconds of retrieval and generation (loading the model, data and index excluded).")
JUDGE_REQUESTS = _result("judge_requests", "spending", "Requests sent to the judge.")
JUDGE_CACHE_HITS = _result("judge_cache_hits", "spending", "Verdicts read from the judge's cache.")
JUDGE_MALFORMED = _result("judge_malformed", "spending", "Judge replies without a verdict.")
WEB_COUNTER = Metric(mn.WEB.name, "spending", "The web search counter over the run: requests, cache hits, pages, page "
                     "failures, dollars; a replay's replayed and missing answers.")
SCHEMA[WEB_COUNTER.name] = WEB_COUNTER
RETRIEVAL_QUERIES = _result("retrieval_queries", "spending", "Queries searched.")
RETRIEVAL_CACHE_HITS = _result("retrieval_cache_hits", "spending", "Queries answered from the in-process cache (only with a cache).")
RETRIEVAL_S = _result("retrieval_s", "spending", "Wall seconds in search.")
RETRIEVAL_CACHE_HIT_RATE = _result("retrieval_cache_hit_rate", "spending",
                                   "Share of queries answered without a search of their own (null: no cache).")

# --- shared with training: the same names, the same meanings
SCHEMA.update({m.name: m for m in mn.SCHEMA.values() if m.kind in ("tools", "multihop", "behaviour")})
SCHEMA[mn.TOOL_LATENCY.name] = mn.TOOL_LATENCY  # a time, yet one of the tool keys


def describe(key: str) -> Metric | None:
    """The schema entry of a metrics.json key: its own, else its family's; None when it has none."""
    return mn.describe(key, SCHEMA)
