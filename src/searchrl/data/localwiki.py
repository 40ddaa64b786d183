"""`localwiki`: a real local retrieval corpus made of every paragraph in the benchmark data.

The gold context paragraphs of the HotpotQA, MuSiQue and 2WikiMultihopQA files, plus the
HippoRAG passage corpora and FlashRAG's DPR sample, deduplicated, form one corpus of ~22k
Wikipedia paragraphs. Because the gold paragraphs are inside it, questions that came with
gold context get `supporting_ids` pointing at corpus passages, which makes retrieval recall
measurable offline. It is small, so recall here is much easier than on 29M KILT passages.

Passage ids are `lw-000001`, ... in first-seen order over the fixed `QUESTION_FILES` then
`CORPUS_FILES` lists below, so they are stable for the same data.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from searchrl.data.loaders import Record, clean_text, read_records
from searchrl.data.types import Passage, Question
from searchrl.errors import DataError
from searchrl.paths import shared_data

VERSION = 1  # bump when ids or contents change, so caches rebuild

# dataset name -> question files (relative to shared/data) whose gold context gets mapped.
# Order matters: it fixes passage ids. Duplicate question ids across files keep the first.
QUESTION_FILES: dict[str, tuple[str, ...]] = {
    "hotpotqa-ircot": ("hotpotqa/dev_subsampled.jsonl",),
    "hotpotqa-distractor": ("hotpotqa/hotpot.json",),
    "musique": ("musique/musique.json", "musique/musique_qa_100.json"),
    "2wiki": ("2wikimultihopqa/wikihop.json",),
    "hotpotqa-train": ("hotpotqa/hotpotqa_train.json",),
    "musique-train": ("musique/musique_train.json",),
}
# Passage-only files. The KILT page samples are left out: they are whole pages about
# unrelated topics ("A", ...) that no question here needs, in a different (page) format.
CORPUS_FILES: tuple[str, ...] = (
    "hotpotqa/hotpotqa_train_corpus.json",
    "musique/musique_train_corpus.json",
    "2wikimultihopqa/2wikimultihopqa_corpus.json",
    "wiki-passages/sample_data.jsonl",
)

_NO_SPACE = re.compile(r"\s+")


def dedup_key(title: str, text: str) -> str:
    """Lowercased title + text with all whitespace removed: upstream copies of one paragraph
    differ only in spacing ("Teutberga( died" vs "Teutberga (died"), never in words."""
    return _NO_SPACE.sub("", f"{title}\n{text}".lower())


@dataclass
class LocalWiki:
    """The deduplicated corpus and the question sets whose supporting ids point into it."""

    passages: list[Passage] = field(default_factory=list)
    datasets: dict[str, list[Question]] = field(default_factory=dict)
    n_paragraphs_seen: int = 0
    _ids: dict[str, str] = field(default_factory=dict, repr=False)

    def add(self, title: str, text: str) -> str:
        """The id of this paragraph, adding it when it is new."""
        self.n_paragraphs_seen += 1
        title, text = clean_text(title), clean_text(text)
        key = dedup_key(title, text)
        pid = self._ids.get(key)
        if pid is None:
            pid = f"lw-{len(self.passages) + 1:06d}"
            self._ids[key] = pid
            self.passages.append(Passage(pid, title, text))
        return pid

    def add_record(self, record: Record) -> Question:
        """Add a question's context paragraphs; return the question with supporting ids set."""
        ids = [self.add(p.title, p.text) for p in record.context]
        support = [pid for pid, p in zip(ids, record.context) if p.supporting]
        unique = tuple(dict.fromkeys(support))  # 2Wiki contexts repeat some paragraphs
        q = record.question
        return Question(q.id, q.question, q.answers, unique, q.type, q.source)


def _corpus_rows(path: Path) -> list[tuple[str, str]]:
    """(title, text) pairs of a passage file: list of {title, text}, dict title -> sentences,
    or FlashRAG JSON lines whose `contents` is a quoted title line, then the text."""
    try:
        if path.suffix == ".jsonl":
            rows = [json.loads(line) for line in path.open(encoding="utf-8") if line.strip()]
        else:
            rows = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from None
    if isinstance(rows, dict):
        return [(t, " ".join(s.strip() for s in sents)) for t, sents in rows.items()]
    out = []
    for i, row in enumerate(rows):
        if "contents" in row:
            title, _, text = row["contents"].partition("\n")
            out.append((title.strip().strip('"'), text))
        elif "title" in row and "text" in row:
            out.append((row["title"], row["text"]))
        else:
            raise DataError(f"{path}, record [{i}]: needs title+text or contents, has {sorted(row)}")
    return out


def build(data_dir: Path | None = None) -> LocalWiki:
    """Read every question and passage file of the shared data into one `LocalWiki`."""
    root = Path(data_dir) if data_dir else shared_data()
    files = [f for fs in QUESTION_FILES.values() for f in fs] + list(CORPUS_FILES)
    missing = [f for f in files if not (root / f).is_file()]
    if missing:
        raise DataError(f"localwiki needs {', '.join(missing)} under {root}; is this the benchmark data folder?")
    wiki = LocalWiki()
    for name, rel_files in QUESTION_FILES.items():
        seen: set[str] = set()
        questions: list[Question] = []
        for rel in rel_files:
            for record in read_records(root / rel, source=name):
                if not record.has_context or record.question.id in seen:
                    continue  # 36 wikihop rows have no context; 8 MuSiQue ids are in both files
                seen.add(record.question.id)
                questions.append(wiki.add_record(record))
        wiki.datasets[name] = questions
    for rel in CORPUS_FILES:
        for title, text in _corpus_rows(root / rel):
            wiki.add(title, text)
    return wiki


def write(wiki: LocalWiki, out_dir: Path, data_dir: Path | None = None) -> Path:
    """Write `corpus.jsonl` (id, title, text), one `<dataset>.jsonl` per question set
    (`Question.to_dict` lines) and `meta.json` with counts."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "corpus.jsonl").open("w", encoding="utf-8") as fh:
        for p in wiki.passages:
            fh.write(json.dumps({"id": p.id, "title": p.title, "text": p.text}, ensure_ascii=False) + "\n")
    for name, questions in wiki.datasets.items():
        with (out / f"{name}.jsonl").open("w", encoding="utf-8") as fh:
            for q in questions:
                fh.write(json.dumps(q.to_dict(), ensure_ascii=False) + "\n")
    meta = {
        "version": VERSION,
        "passages": len(wiki.passages),
        "paragraphs_seen": wiki.n_paragraphs_seen,
        "datasets": {name: len(qs) for name, qs in wiki.datasets.items()},
        "question_files": QUESTION_FILES,
        "corpus_files": list(CORPUS_FILES),
        "data_dir": str(data_dir or ""),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return out


def read_corpus(path: Path) -> list[Passage]:
    """The passages of a `corpus.jsonl` written by `write` (ids kept, nothing chunked)."""
    with Path(path).open(encoding="utf-8") as fh:
        return [Passage(d["id"], d["title"], d["text"]) for d in map(json.loads, fh) if d]
