"""The paper's headline figures (docs/guides/evaluation.md, "The paper's figures"), the reference rows of `searchrl eval report`.

R1-Searcher reports ACC_R (cover-EM, the authors' token cover) and ACC_L (gpt-4o-mini judge) on
500-question subsets (Bamboogle: all 125), retrieving from KILT's 2019 Wikipedia (29M passages,
BGE-large-en-v1.5, k = 5). EM and F1 are not in the paper: for the two benchmarks whose predictions
the authors released (`shared/data/r1-searcher-results/`), `searchrl eval score` gives them, next to
the paper's exact ACC_R/ACC_L (docs/results.md, "Answer metrics: parity with the paper"). MuSiQue figures are
not among these systems' published rows, so the report has no paper row for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PAPER_RETRIEVAL = "KILT Wikipedia, 29M passages, BGE-large, k=5"
WEB = "online web search"


@dataclass(frozen=True)
class PaperResult:
    """One system on one benchmark; metrics are fractions, None where not reported."""

    benchmark: str
    system: str
    retrieval: str
    n: int = 500  # questions evaluated (Bamboogle: all 125)
    cover_em: float | None = None
    acc_l: float | None = None
    em: float | None = None
    f1: float | None = None

    def get(self, key: str) -> float | None:
        return getattr(self, key) if key in ("cover_em", "acc_l", "em", "f1") else None


QWEN = "R1-Searcher, Qwen-2.5-7B-Base"
LLAMA = "R1-Searcher, Llama-3.1-8B-Instruct"

PAPER_RESULTS: tuple[PaperResult, ...] = (
    PaperResult("HotpotQA", QWEN, PAPER_RETRIEVAL, cover_em=0.654, acc_l=0.750, em=0.580, f1=0.719),
    PaperResult("HotpotQA", LLAMA, PAPER_RETRIEVAL, cover_em=0.648, acc_l=0.746),
    PaperResult("HotpotQA", "ReARTeR, GPT-4o-mini", PAPER_RETRIEVAL, acc_l=0.506),
    PaperResult("2Wiki", QWEN, PAPER_RETRIEVAL, cover_em=0.636, acc_l=0.650),
    PaperResult("2Wiki", "ReARTeR, GPT-4o-mini", PAPER_RETRIEVAL, acc_l=0.534),
    PaperResult(
        "Bamboogle", QWEN, PAPER_RETRIEVAL, 125, cover_em=0.528, acc_l=0.544, em=0.456, f1=0.577
    ),
    PaperResult("Bamboogle", QWEN, WEB, 125, cover_em=0.624),
    PaperResult("Bamboogle", LLAMA, PAPER_RETRIEVAL, 125, cover_em=0.504, acc_l=0.544),
    PaperResult("Bamboogle", "Search-o1, QwQ-32B", WEB, 125, cover_em=0.560),
)

# Name fragment -> benchmark, matched against a dataset's catalog name or file name.
_BENCHMARKS = (
    ("hotpot", "HotpotQA"),
    ("2wiki", "2Wiki"),
    ("musique", "MuSiQue"),
    ("bamboogle", "Bamboogle"),
)


def benchmark_of(dataset: str) -> str | None:
    """The paper benchmark a dataset is drawn from, by its name.

    >>> benchmark_of("hotpotqa-ircot"), benchmark_of("r1s-2wiki500"), benchmark_of("toyworld:test")
    ('HotpotQA', '2Wiki', None)
    """
    name = Path(dataset).name.lower()
    return next((bench for fragment, bench in _BENCHMARKS if fragment in name), None)


def paper_results(benchmark: str | None) -> list[PaperResult]:
    return [r for r in PAPER_RESULTS if r.benchmark == benchmark]
