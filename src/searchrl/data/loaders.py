"""Read question files of every common multi-hop QA format into `Question`s.

Formats (auto-detected from the first record's fields):

| fmt          | fields                                                                 |
|--------------|------------------------------------------------------------------------|
| `searchrl`   | our own `Question.to_dict` lines: id, question, answers, supporting_ids, evidence |
| `r1searcher` | R1-Searcher: idx, question, answer (a string or a list)                 |
| `flashrag`   | FlashRAG: id, question, golden_answers                                  |
| `hotpotqa`   | HotpotQA / 2WikiMultihopQA JSON: _id, question, answer, supporting_facts, context |
| `musique`    | MuSiQue: id, question, answer, answer_aliases, paragraphs[{title, paragraph_text, is_supporting}] |
| `ircot`      | IRCoT processed: question_id, question_text, answers_objects, contexts  |
| `qa`         | plain lists of {question, answer}                                       |

Files may be a JSON list or JSON lines, whatever their suffix says (several upstream `.json`
files are really JSON lines). Formats that carry gold paragraphs keep them in
`Record.context`, so `localwiki` can map supporting paragraphs to corpus passage ids; a bare
`load_questions` of such a file leaves `supporting_ids` empty because raw files have no
corpus ids to point at.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from itertools import chain
from pathlib import Path
from typing import Any, NamedTuple

from searchrl.data.textio import head, iter_json_lines, read_json
from searchrl.data.types import Question
from searchrl.errors import DataError, DataWarning, SearchRLError, listing
from searchrl.registry import Registry


class GoldParagraph(NamedTuple):
    """A context paragraph shipped with a question; `supporting` marks the gold evidence."""

    title: str
    text: str
    supporting: bool


@dataclass(frozen=True)
class Record:
    """One parsed question plus the context paragraphs its file carried (may be empty)."""

    question: Question
    context: tuple[GoldParagraph, ...] = field(default=())

    @property
    def has_context(self) -> bool:
        return bool(self.context)


Parser = Callable[[dict, str, int, str], Record]  # (row, where, index, source) -> Record
FORMATS: Registry[Parser] = Registry("question format")


def clean_text(text: str) -> str:
    """Collapse runs of whitespace; upstream files mix double spaces, tabs and newlines."""
    return " ".join(str(text).split())


def _need(row: dict, keys: Iterable[str], where: str, fmt: str) -> None:
    missing = [k for k in keys if row.get(k) in (None, "", [])]
    if missing:
        names = ", ".join(repr(k) for k in missing)
        raise DataError(f"{where}: missing or empty field {names} (format {fmt!r}); fix or drop this record")


def _json_kind(value: Any) -> str:
    """How JSON would name `value`'s type, for messages: "null", "a number", "an object", ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    kinds = {str: "a string", int: "a number", float: "a number", dict: "an object", list: "a list"}
    return kinds.get(type(value), type(value).__name__)


def _question(row: dict, key: str, where: str, fmt: str) -> str:
    value = row[key]
    if not isinstance(value, str) or not value.strip():
        got = "blank" if isinstance(value, str) else _json_kind(value)
        raise DataError(
            f"{where}: field {key!r} must be a non-empty string, got {got} (format {fmt!r}); "
            "fix or drop this record"
        )
    return value.strip()


def _id(row: dict, keys: Iterable[str], where: str, fallback: str) -> str:
    """The first of `keys` that is set, as a string; ids are strings or integers (R1-Searcher's
    `idx`), anything else is an error rather than a stringified object."""
    for key in keys:
        value = row.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise DataError(
                f"{where}: field {key!r} must be a string or an integer id, got {_json_kind(value)}; "
                "fix or drop this record"
            )
        return str(value)
    return fallback


def _answer_text(item: Any, where: str, fmt: str, field: str) -> str:
    if isinstance(item, str):
        return item.strip()
    if isinstance(item, float) and not math.isfinite(item):
        # json reads NaN, Infinity and 1e400 as floats whose text ("nan", "inf") would match.
        raise DataError(
            f"{where}: answer {item!r} is not a finite number (NaN, Infinity or an overflow like 1e400); "
            "write the answer as a string"
        )
    if isinstance(item, (int, float)):  # FanoutQA writes numbers and true/false as JSON values
        return str(item)
    raise DataError(
        f"{where}: field {field!r} holds {_json_kind(item)} where an answer belongs; answers are "
        f"strings or lists of strings (format {fmt!r}); fix or drop this record"
    )


def _answers(value: Any, where: str, fmt: str, field: str) -> tuple[str, ...]:
    if isinstance(value, dict):  # FanoutQA {entity: answer}: one readable string
        value = "; ".join(f"{k}: {_answer_text(v, where, fmt, field)}" for k, v in value.items())
    items = value if isinstance(value, list) else [value]
    out: list[str] = []
    for item in items:
        text = _answer_text(item, where, fmt, field)
        if text and text not in out:
            out.append(text)
    if not out:
        raise DataError(f"{where}: no usable answer in field {field!r} (format {fmt!r}); fix or drop this record")
    return tuple(out)


def _sentences(sents: Any) -> str:
    # HotpotQA sentences carry their own leading space, 2Wiki's don't: strip and rejoin.
    if isinstance(sents, str):
        return clean_text(sents)
    return clean_text(" ".join(str(s).strip() for s in sents))


@FORMATS.register("searchrl")
def _parse_searchrl(row: dict, where: str, index: int, source: str) -> Record:
    _need(row, ("id", "question", "answers"), where, "searchrl")
    for key in ("type", "source"):
        if not isinstance(row.get(key) or "", str):
            raise DataError(f"{where}: field {key!r} must be a string, got {_json_kind(row[key])}")
    ids = row.get("supporting_ids") or []
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise DataError(f"{where}: field 'supporting_ids' must be a list of passage id strings")
    evidence = row.get("evidence") or []
    if not isinstance(evidence, list) or not all(isinstance(s, str) for s in evidence):
        raise DataError(f"{where}: field 'evidence' must be a list of sentence strings")
    q = Question.from_dict({
        **row,
        "type": row.get("type") or "",
        "source": row.get("source") or "",
        "supporting_ids": ids,
        "evidence": evidence,
        "id": _id(row, ("id",), where, ""),
        "question": _question(row, "question", where, "searchrl"),
        "answers": _answers(row["answers"], where, "searchrl", "answers"),
    })
    return Record(replace(q, source=q.source or source))


@FORMATS.register("r1searcher")
def _parse_r1searcher(row: dict, where: str, index: int, source: str) -> Record:
    _need(row, ("question", "answer"), where, "r1searcher")
    qid = _id(row, ("idx",), where, str(index))
    answers = _answers(row["answer"], where, "r1searcher", "answer")
    return Record(Question(qid, _question(row, "question", where, "r1searcher"), answers, source=source))


@FORMATS.register("flashrag")
def _parse_flashrag(row: dict, where: str, index: int, source: str) -> Record:
    _need(row, ("question", "golden_answers"), where, "flashrag")
    qid = _id(row, ("id",), where, str(index))
    answers = _answers(row["golden_answers"], where, "flashrag", "golden_answers")
    return Record(Question(qid, _question(row, "question", where, "flashrag"), answers, source=source))


def _hotpot_context(ctx: Any) -> list[tuple[str, str]]:
    # Original JSON: [[title, [sentences]], ...]; Hugging Face: {"title": [...], "sentences": [...]}.
    if isinstance(ctx, dict):
        return [(t, _sentences(s)) for t, s in zip(ctx.get("title", []), ctx.get("sentences", []))]
    return [(t, _sentences(s)) for t, s in ctx]


def _hotpot_support_titles(facts: Any) -> set[str]:
    if isinstance(facts, dict):
        return set(facts.get("title", []))
    return {f[0] for f in facts}


@FORMATS.register("hotpotqa")
def _parse_hotpotqa(row: dict, where: str, index: int, source: str) -> Record:
    """HotpotQA and 2WikiMultihopQA share this shape; a missing `context` (some 2Wiki rows)
    is allowed and simply yields no gold paragraphs."""
    _need(row, ("question", "answer"), where, "hotpotqa")
    qid = _id(row, ("_id", "id"), where, str(index))
    answers = _answers(row["answer"], where, "hotpotqa", "answer")
    context: tuple[GoldParagraph, ...] = ()
    if row.get("context"):
        try:
            support = _hotpot_support_titles(row.get("supporting_facts") or [])
            context = tuple(GoldParagraph(t, x, t in support) for t, x in _hotpot_context(row["context"]))
        except (TypeError, ValueError, IndexError) as exc:
            raise DataError(f"{where}: malformed 'context' or 'supporting_facts' ({exc})") from None
    question = _question(row, "question", where, "hotpotqa")
    q = Question(qid, question, answers, type=str(row.get("type") or ""), source=source)
    return Record(q, context)


@FORMATS.register("musique")
def _parse_musique(row: dict, where: str, index: int, source: str) -> Record:
    _need(row, ("question", "answer"), where, "musique")
    qid = _id(row, ("id",), where, str(index))
    aliases = row.get("answer_aliases") or []
    if not isinstance(aliases, list):
        raise DataError(f"{where}: field 'answer_aliases' must be a list of strings, got {_json_kind(aliases)}")
    answers = _answers([row["answer"], *aliases], where, "musique", "answer/answer_aliases")
    try:
        context = tuple(
            GoldParagraph(p["title"], clean_text(p["paragraph_text"]), bool(p.get("is_supporting")))
            for p in row.get("paragraphs") or []
        )
    except (KeyError, TypeError) as exc:
        raise DataError(f"{where}: a paragraph lacks {exc} (needs title, paragraph_text)") from None
    qtype = qid.split("__")[0] if "__" in qid else ""  # "2hop", "3hop1", ...
    question = _question(row, "question", where, "musique")
    return Record(Question(qid, question, answers, type=qtype, source=source), context)


def _ircot_answers(objects: Any, where: str) -> tuple[str, ...]:
    if not isinstance(objects, list) or not all(isinstance(o, dict) for o in objects):
        raise DataError(f"{where}: field 'answers_objects' must be a list of objects (format 'ircot')")
    found: list[str] = []
    for obj in objects:
        if not isinstance(obj.get("spans") or [], list) or not isinstance(obj.get("date") or {}, dict):
            raise DataError(f"{where}: an answers_objects entry needs 'spans' as a list and 'date' as an object")
        found.extend(obj.get("spans") or [])
        if not obj.get("spans") and obj.get("number"):
            found.append(obj["number"])
        date = obj.get("date") or {}
        if not obj.get("spans") and any(date.values()):
            found.append(" ".join(str(date[k]) for k in ("day", "month", "year") if date.get(k)))
    return _answers(found, where, "ircot", "answers_objects")


@FORMATS.register("ircot")
def _parse_ircot(row: dict, where: str, index: int, source: str) -> Record:
    _need(row, ("question_id", "question_text", "answers_objects"), where, "ircot")
    try:
        context = tuple(
            GoldParagraph(c["title"], clean_text(c["paragraph_text"]), bool(c.get("is_supporting")))
            for c in row.get("contexts") or []
        )
    except (KeyError, TypeError) as exc:
        raise DataError(f"{where}: a context lacks {exc} (needs title, paragraph_text)") from None
    answers = _ircot_answers(row["answers_objects"], where)
    qid, question = _id(row, ("question_id",), where, ""), _question(row, "question_text", where, "ircot")
    return Record(Question(qid, question, answers, source=source), context)


@FORMATS.register("qa")
def _parse_qa(row: dict, where: str, index: int, source: str) -> Record:
    _need(row, ("question", "answer"), where, "qa")
    qid = f"{source}-{index}" if source else str(index)
    answers = _answers(row["answer"], where, "qa", "answer")
    return Record(Question(qid, _question(row, "question", where, "qa"), answers, source=source))


def detect_format(row: Any, where: str = "record") -> str:
    """The format name for one record, judged by which fields it has."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object per question, got {type(row).__name__}")
    keys = set(row)
    if {"question_id", "question_text"} <= keys:
        return "ircot"
    if "question" not in keys:
        raise DataError(f"{where}: no 'question' field (fields: {sorted(keys)}); not a question file?")
    if "paragraphs" in keys:
        return "musique"
    if keys & {"supporting_facts", "context", "_id"}:
        return "hotpotqa"
    if "golden_answers" in keys:
        return "flashrag"
    if "answers" in keys:
        return "searchrl"
    if "idx" in keys:
        return "r1searcher"
    if "answer" in keys:
        return "qa"
    raise DataError(
        f"{where}: cannot tell the format from fields {sorted(keys)}; "
        f"pass fmt= one of {', '.join(FORMATS.names())}"
    )


def iter_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, row) for each record of a JSON list or JSON-lines file; `where` is `file:line`
    for JSON lines and `file, record [i]` (0-based) for a JSON list."""
    path = Path(path)
    start = head(path)
    if start.startswith("["):
        rows = read_json(path)
        for i, row in enumerate(rows):
            yield f"{path}, record [{i}]", row
        return
    lines = iter_json_lines(path)
    try:
        first = next(lines, None)
    except DataError:
        if start.startswith("{"):
            _reject_json_object(path)
        raise
    for lineno, row in chain([first] if first else [], lines):
        yield f"{path}:{lineno}", row


def _reject_json_object(path: Path) -> None:
    try:
        read_json(path)
    except DataError:
        return  # really broken JSON lines: let the caller report the line
    raise DataError(
        f"{path}: is one JSON object, not a list of questions or JSON lines "
        "(a corpus file such as title -> sentences?)"
    )


def parse_rows(rows: Iterable[tuple[str, Any]], fmt: str = "auto", source: str = "") -> list[Record]:
    """Parse (where, row) pairs; with fmt="auto" the first row decides the format."""
    if fmt != "auto" and fmt not in FORMATS:
        known = ", ".join(["auto", *FORMATS.names()])
        raise SearchRLError(f"unknown question format {fmt!r}; choose one of: {known}")
    records: list[Record] = []
    parser: Parser | None = None if fmt == "auto" else FORMATS.get(fmt)
    for index, (where, row) in enumerate(rows):
        if parser is None:
            parser = FORMATS.get(detect_format(row, where))
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object per question, got {type(row).__name__}")
        records.append(parser(row, where, index, source))
    return records


def read_records(path: Path, fmt: str = "auto", source: str = "") -> list[Record]:
    """Every question of `path` with the gold paragraphs its format carries."""
    path = Path(path)
    records = parse_rows(iter_rows(path), fmt, source or path.stem)
    if not records:
        raise DataError(f"{path}: holds no records")
    _warn_duplicate_ids(path, records)
    return records


def _warn_duplicate_ids(path: Path, records: list[Record]) -> None:
    counts = Counter(r.question.id for r in records)
    dupes = [qid for qid, n in counts.items() if n > 1]
    if dupes:
        warnings.warn(
            f"{path}: {len(dupes)} question id(s) occur more than once: {listing(dupes)}; per-question "
            "results under those ids will be mixed up, so give each question its own id",
            DataWarning,
            stacklevel=2,
        )


def load_questions(path: Path, fmt: str = "auto", source: str = "") -> list[Question]:
    """Questions of a file in any supported format; `source` defaults to the file's stem."""
    return [r.question for r in read_records(path, fmt, source)]


def load_hf(name: str, split: str = "train", config: str | None = None, fmt: str = "auto") -> list[Question]:
    """Questions of a Hugging Face Hub dataset (needs the `datasets` package and internet).

    Rows are parsed like file records, e.g. `RUC-NLPIR/FlashRAG_datasets` config `hotpotqa`
    split `dev` (FlashRAG fields) or `hotpotqa/hotpot_qa` config `distractor`.
    """
    try:
        import datasets
    except ImportError:
        raise SearchRLError(
            f"loading 'hf:{name}' needs the `datasets` package: `pip install datasets`, and internet "
            "access to the Hugging Face Hub. Offline, convert the data to a local JSON-lines file instead."
        ) from None
    try:
        ds = datasets.load_dataset(name, config, split=split)
    except Exception as exc:  # noqa: BLE001 - hub, network and config errors come in many types
        raise SearchRLError(
            f"could not load Hugging Face dataset {name!r} (config {config!r}, split {split!r}): "
            f"{type(exc).__name__}: {exc}. Offline? Use a local file path instead."
        ) from None
    rows = ((f"hf:{name}[{i}]", dict(row)) for i, row in enumerate(ds))
    return [r.question for r in parse_rows(rows, fmt, source=name.split("/")[-1])]
