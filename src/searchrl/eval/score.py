"""Score a predictions file: EM, F1, both cover-EM variants and ACC_L (share of judge verdicts True).

Three record shapes are read, one JSON object per line (a JSON array of them also works):
- ours:          `answers` (list of gold), `prediction` (str | null), optional `judge` (bool | null),
                 optional `question`, `id`;
- R1-Searcher:   `answer` (str or list), `pred_ans`, optional `gpt4o_output` ("True"/"False");
- FlashRAG:      `golden_answers`, `pred` (top level or inside `output`).
Scores are fractions in [0, 1]; `cover_em` is the authors' token-cover variant, `cover_em_substring`
FlashRAG's `acc`.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchrl.data.textio import check_file, head, iter_json_lines, read_json
from searchrl.errors import DataError, DataWarning, listing
from searchrl.metrics import cover_em, cover_em_substring, exact_match, f1_score

SCORE_KEYS = ("n", "em", "f1", "cover_em", "cover_em_substring", "acc_l")


@dataclass(frozen=True)
class ScoredPrediction:
    """One prediction with its gold aliases and, when judged, the judge's verdict."""

    golds: tuple[str, ...]
    prediction: str | None
    judge: bool | None = None
    question: str | None = None
    id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Our own shape, the one `parse_record` reads first."""
        return {
            "id": self.id,
            "question": self.question,
            "answers": list(self.golds),
            "prediction": self.prediction,
            "judge": self.judge,
        }


def _golds(value: Any, field: str, where: str) -> tuple[str, ...]:
    if isinstance(value, (str, int, float)):
        value = [value]
    if not isinstance(value, list) or not value:
        raise DataError(
            f"{where}: `{field}` must be a gold answer or a non-empty list of them, got {value!r}"
        )
    return tuple(_gold(g, field, where) for g in value)


def _gold(g: Any, field: str, where: str) -> str:
    if isinstance(g, float) and not math.isfinite(g):
        # json reads NaN, Infinity and 1e400 as floats whose text ("nan", "inf") would match.
        raise DataError(
            f"{where}: `{field}` holds {g!r}, not a finite number (NaN, Infinity or an overflow "
            "like 1e400); write the gold answer as a string"
        )
    if isinstance(g, (int, float)) and not isinstance(g, bool):
        return str(g)
    if not isinstance(g, str):
        raise DataError(f"{where}: `{field}` holds {g!r}; gold answers must be strings")
    return g


def _prediction(value: Any, field: str, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise DataError(
        f"{where}: `{field}` must be a string or null, got {type(value).__name__} {value!r}"
    )


def _verdict(value: Any, field: str, where: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise DataError(f'{where}: `{field}` must be true/false (or "True"/"False"), got {value!r}')


def _question(value: Any, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise DataError(f"{where}: `question` must be a string or null, got {type(value).__name__} {value!r:.60}")


def _id(value: Any, where: str) -> str | None:
    """Ids are strings or integers (written as strings); None when absent."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise DataError(f"{where}: `id` must be a string or an integer, got {type(value).__name__} {value!r:.60}")


def parse_record(obj: Any, where: str) -> ScoredPrediction:
    """Read one record in any supported shape; `where` ("file:line") goes into every error."""
    if not isinstance(obj, Mapping):
        raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if "answers" in obj and "prediction" in obj:
        return ScoredPrediction(
            golds=_golds(obj["answers"], "answers", where),
            prediction=_prediction(obj["prediction"], "prediction", where),
            judge=_verdict(obj.get("judge"), "judge", where),
            question=_question(obj.get("question"), where),
            id=_id(obj.get("id"), where),
        )
    if "pred_ans" in obj:
        if "answer" not in obj:
            raise DataError(f"{where}: R1-Searcher record has `pred_ans` but no gold `answer`")
        return ScoredPrediction(
            golds=_golds(obj["answer"], "answer", where),
            prediction=_prediction(obj["pred_ans"], "pred_ans", where),
            judge=_verdict(obj.get("gpt4o_output"), "gpt4o_output", where),
            question=_question(obj.get("question"), where),
            id=_id(obj.get("id"), where),
        )
    if "golden_answers" in obj:
        output = obj.get("output")
        if "pred" in obj:
            pred = obj["pred"]
        elif isinstance(output, Mapping) and "pred" in output:
            pred = output["pred"]
        else:
            raise DataError(
                f"{where}: FlashRAG record has `golden_answers` but no `pred` (nor `output.pred`)"
            )
        return ScoredPrediction(
            golds=_golds(obj["golden_answers"], "golden_answers", where),
            prediction=_prediction(pred, "pred", where),
            question=_question(obj.get("question"), where),
            id=_id(obj.get("id"), where),
        )
    keys = ", ".join(sorted(map(str, obj))) or "(none)"
    raise DataError(
        f"{where}: unknown record shape (keys: {keys}); expected `answers`+`prediction` (searchrl), "
        "`answer`+`pred_ans` (R1-Searcher) or `golden_answers`+`pred` (FlashRAG)"
    )


def read_predictions(path: str | Path) -> list[ScoredPrediction]:
    """All records of a predictions file; a malformed one raises DataError naming file:line."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path} is a directory; pass the predictions file in it (e.g. {path / 'predictions.jsonl'})")
    check_file(path, "predictions file")
    if head(path).startswith("["):
        items = read_json(path)
        records = [parse_record(obj, f"{path}: item {i}") for i, obj in enumerate(items)]
    else:
        records = [parse_record(obj, f"{path}:{lineno}") for lineno, obj in iter_json_lines(path)]
    if not records:
        raise DataError(f"{path}: holds no predictions")
    return records


def first_of_each_id(records: list[ScoredPrediction], path: Path) -> list[ScoredPrediction]:
    """`records` with each id kept once, at its first occurrence (records without an id all
    kept); a DataWarning names the repeated ids, since counting them twice would bend the means
    (two runs appended to one file, a resumed run that wrote a record again)."""
    seen: set[str] = set()
    kept, repeated = [], []
    for r in records:
        if r.id is None:
            kept.append(r)
        elif r.id in seen:
            repeated.append(r.id)
        else:
            seen.add(r.id)
            kept.append(r)
    if repeated:
        ids = list(dict.fromkeys(repeated))
        warnings.warn(
            f"{path}: {len(ids)} id(s) occur more than once ({len(repeated)} extra record(s)): {listing(ids, 5)}; "
            "scored each id once, at its first record",
            DataWarning,
            stacklevel=2,
        )
    return kept


def score_records(records: Iterable[ScoredPrediction | Mapping[str, Any]]) -> dict[str, Any]:
    """Mean scores over records (objects or dicts in any supported shape); keys as `SCORE_KEYS`.

    >>> score_records([{"answers": ["Paris"], "prediction": "paris", "judge": True},
    ...                {"answers": ["Rome"], "prediction": None}])
    {'n': 2, 'em': 0.5, 'f1': 0.5, 'cover_em': 0.5, 'cover_em_substring': 0.5, 'acc_l': 1.0}
    """
    items = [
        r if isinstance(r, ScoredPrediction) else parse_record(r, f"record {i}")
        for i, r in enumerate(records)
    ]
    n = len(items)
    if n == 0:
        return {
            "n": 0,
            "em": None,
            "f1": None,
            "cover_em": None,
            "cover_em_substring": None,
            "acc_l": None,
        }
    verdicts = [r.judge for r in items if r.judge is not None]
    return {
        "n": n,
        "em": sum(exact_match(r.prediction, r.golds) for r in items) / n,
        "f1": sum(f1_score(r.prediction, r.golds) for r in items) / n,
        "cover_em": sum(cover_em(r.prediction, r.golds) for r in items) / n,
        "cover_em_substring": sum(cover_em_substring(r.prediction, r.golds) for r in items) / n,
        # Over judged records only; `score_command` warns when that is not all of them.
        "acc_l": sum(verdicts) / len(verdicts) if verdicts else None,
    }


def score_file(path: str | Path) -> dict[str, Any]:
    """Scores of one predictions file, as fractions in [0, 1]; `acc_l` is None without verdicts."""
    return score_records(first_of_each_id(read_predictions(path), Path(path)))


def judge_missing(
    records: list[ScoredPrediction], judge: Any, progress: bool = True
) -> list[ScoredPrediction]:
    """Fill in verdicts where a record has none, asking `judge` (a `searchrl.judge.Judge`)."""
    from dataclasses import replace

    from searchrl.judge import JudgeItem

    todo = [i for i, r in enumerate(records) if r.judge is None]
    for i in todo:
        if not records[i].question:
            raise DataError(
                f"record {i + 1} has no `question`; the judge needs it to grade the answer"
            )
    items = [
        JudgeItem(records[i].question or "", records[i].golds, records[i].prediction) for i in todo
    ]
    verdicts = judge.judge_many(items, progress=progress)
    out = list(records)
    for i, verdict in zip(todo, verdicts):
        out[i] = replace(out[i], judge=verdict)
    return out


def score_command(
    path: Path,
    as_json: bool = False,
    judge_url: str | None = None,
    judge_model: str | None = None,
    judged_out: Path | None = None,
) -> dict[str, Any]:
    """What `searchrl eval score` does: read, optionally judge, print JSON or a table in percent."""
    import sys

    from rich.console import Console

    from searchrl.tables import Column, print_table

    records = first_of_each_id(read_predictions(path), path)
    err = Console(stderr=True)
    if judge_url is not None:
        from searchrl.judge import DEFAULT_MODEL, JudgeConfig

        judge = JudgeConfig(url=judge_url, model=judge_model or DEFAULT_MODEL).build()
        try:
            records = judge_missing(records, judge, progress=sys.stderr.isatty())
        finally:
            judge.close()
        stats = judge.stats
        err.print(f"judge: {stats.requests} requests, {stats.cache_hits} verdicts from the cache, "
                  f"{stats.malformed} replies without a verdict", highlight=False)
    if judged_out is not None:
        judged_out.parent.mkdir(parents=True, exist_ok=True)
        with judged_out.open("w", encoding="utf-8") as fh:
            for r in records:
                fh.write(json.dumps(r.to_dict(), ensure_ascii=False) + "\n")
    scores = score_records(records)
    n_judged = sum(r.judge is not None for r in records)
    if 0 < n_judged < len(records):
        err.print(
            f"[yellow]warning:[/] ACC_L covers {n_judged} of {len(records)} records (the others have no verdict)"
        )
    if as_json:
        print(json.dumps(scores))
        return scores
    labels = {
        "em": "EM",
        "f1": "F1",
        "cover_em": "Cover-EM / ACC_R (token cover, authors' code)",
        "cover_em_substring": "Cover-EM (substring, FlashRAG acc)",
        "acc_l": "ACC_L (LLM judge)",
    }
    rows = [[label, "n/a" if scores[key] is None else f"{100 * scores[key]:.1f}"] for key, label in labels.items()]
    print_table(Console(), [Column("metric", wrap=True), Column("%", right=True)], rows,
                title=f"{path.name}: {scores['n']} predictions")
    return scores
