"""Named datasets and the corpora they come with, built on first use and cached under
`cache_dir()`: `load_dataset("hotpotqa-ircot")`, `load_dataset("toyworld:train")`,
`load_dataset("my.jsonl")`, `load_dataset("hf:RUC-NLPIR/FlashRAG_datasets@hotpotqa:dev")`. The
indexes over those corpora are `searchrl.retrieval.catalog`'s.
Cache writes go to a temporary sibling folder that is renamed into place, so two processes
building the same thing at once never see half a build (the loser's copy is discarded).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchrl.data.loaders import load_questions
from searchrl.data.textio import check_file, read_json
from searchrl.data.types import Question
from searchrl.errors import SearchRLError
from searchrl.paths import cache_dir, find_shared_data, shared_data
from searchrl.registry import Registry


@dataclass(frozen=True)
class DatasetEntry:
    name: str
    description: str
    source: str  # where it comes from, for people: a file under shared/data or "generated"
    load: Callable[[], list[Question]]
    count: Callable[[], int]  # cheap: never builds an index, at most parses one file


DATASETS: Registry[DatasetEntry] = Registry("dataset")


# ---------------------------------------------------------------- cache

def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cached_build(rel: str, build: Callable[[Path], None]) -> Path:
    """`cache_dir()/rel`, running `build(tmp_dir)` first when it is not there yet."""
    final = cache_dir() / rel
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process finished first: keep theirs
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _count_lines(path: Path) -> int:
    with path.open("rb") as fh:
        return sum(1 for line in fh if line.strip())


# ---------------------------------------------------------------- localwiki

def localwiki_dir() -> Path:
    """The cached localwiki build (corpus.jsonl, one <dataset>.jsonl per question set)."""
    from searchrl.data import localwiki

    def build(tmp: Path) -> None:
        data = shared_data()
        _log(f"building the localwiki corpus from {data} (first use; cached afterwards) ...")
        started = time.perf_counter()
        wiki = localwiki.build(data)
        localwiki.write(wiki, tmp, data)
        _log(f"localwiki: {len(wiki.passages)} passages in {time.perf_counter() - started:.1f}s")

    return cached_build(f"datasets/localwiki-v{localwiki.VERSION}", build)


def _localwiki_entry(name: str, description: str) -> None:
    from searchrl.data.localwiki import QUESTION_FILES, VERSION

    files = QUESTION_FILES[name]

    def load() -> list[Question]:
        return load_questions(localwiki_dir() / f"{name}.jsonl")

    def count() -> int:
        built = cache_dir() / f"datasets/localwiki-v{VERSION}" / f"{name}.jsonl"
        if built.is_file():
            return _count_lines(built)
        from searchrl.data.loaders import read_records

        ids = {r.question.id for f in files for r in read_records(shared_data() / f) if r.has_context}
        return len(ids)

    DATASETS.register(name)(DatasetEntry(name, description, " + ".join(files), load, count))


_localwiki_entry("hotpotqa-ircot", "HotpotQA dev, IRCoT's 500-question subsample; supporting ids -> localwiki")
_localwiki_entry("hotpotqa-distractor", "HotpotQA dev, 200 (distractor setting); supporting ids -> localwiki")
_localwiki_entry("hotpotqa-train", "HotpotQA train, 100 with gold context; supporting ids -> localwiki")
_localwiki_entry("musique", "MuSiQue dev with gold paragraphs (two files, deduplicated); supporting ids -> localwiki")
_localwiki_entry("musique-train", "MuSiQue train, 100 with gold paragraphs; supporting ids -> localwiki")
_localwiki_entry("2wiki", "2WikiMultihopQA dev questions that have context; supporting ids -> localwiki")


# ---------------------------------------------------------------- plain question files

def _file_entry(name: str, rel: str, description: str, fmt: str = "auto") -> None:
    def load() -> list[Question]:
        return load_questions(shared_data() / rel, fmt, source=name)

    def count() -> int:
        path = shared_data() / rel
        check_file(path)
        return _count_lines(path) if path.suffix == ".jsonl" else len(read_json(path))

    DATASETS.register(name)(DatasetEntry(name, description, rel, load, count))


_file_entry("bamboogle", "r1-searcher-eval/bamboogle.jsonl", "Bamboogle, all 125 (R1-Searcher eval set)")
_file_entry("r1s-hotpotqa500", "r1-searcher-eval/hotpotqa_500.jsonl", "HotpotQA dev, R1-Searcher's 500 eval questions")
_file_entry("r1s-2wiki500", "r1-searcher-eval/2wiki_500.jsonl", "2WikiMultihopQA dev, R1-Searcher's 500 eval questions")
_file_entry("r1s-musique500", "r1-searcher-eval/musique_500.jsonl", "MuSiQue dev, R1-Searcher's 500 eval questions")
_file_entry("r1s-stage1", "r1-searcher-train/stage_1.jsonl", "R1-Searcher Stage-1 training set (Medium questions)")
_file_entry("r1s-stage2", "r1-searcher-train/stage_2.jsonl", "R1-Searcher Stage-2 training set (Medium + Difficult)")
_file_entry("hotpotqa-dev-all", "hotpotqa/hotpotqa_test_questions_and_answers.json", "HotpotQA full dev, question + answer only")
_file_entry("musique-dev-all", "musique/musique_test_questions_and_answers.json", "MuSiQue(ans) full dev, question + answer only")
_file_entry(
    "2wiki-dev-all", "2wikimultihopqa/2wikimultihop_test_questions_and_answers.json",
    "2WikiMultihopQA full dev, question + answer only",
)


# ---------------------------------------------------------------- generated worlds

def _generator(world: str) -> tuple[int, Any, Callable, Callable]:
    """(version, default config, generate, write) of a generated world: the toy world, or the
    held-out `toyworld-alt` (other relations, wording and names)."""
    if world == "toyworld":
        from searchrl.data.toyworld import VERSION, ToyWorldConfig, generate, write

        return VERSION, ToyWorldConfig(), generate, write
    from searchrl.data.toyworld.alt import VERSION, AltWorldConfig, generate, write

    return VERSION, AltWorldConfig(), generate, write


def world_rel(world: str) -> str:
    version, config, _, _ = _generator(world)
    # The generator version and the default config name the cache: a changed generator rebuilds.
    fields = {"version": version, **config.model_dump()}
    digest = hashlib.sha1(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"datasets/{world}-{digest}"


def world_dir(world: str) -> Path:
    """The cached generated `world` of its default config (corpus.jsonl, train.jsonl, test.jsonl)."""
    _, config, generate, write = _generator(world)

    def build(tmp: Path) -> None:
        _log(f"generating {world} (default config; cached afterwards) ...")
        write(generate(config), tmp)

    return cached_build(world_rel(world), build)


def _world_entry(world: str, split: str, description: str) -> None:
    name = f"{world}:{split}"

    def load() -> list[Question]:
        return load_questions(world_dir(world) / f"{split}.jsonl", source=name)

    def count() -> int:
        built = cache_dir() / world_rel(world) / f"{split}.jsonl"
        if built.is_file():
            return _count_lines(built)
        return getattr(_generator(world)[1], split)  # generation yields exactly this many or raises

    DATASETS.register(name)(DatasetEntry(name, description, "generated", load, count))


_world_entry("toyworld", "train", "Synthetic toy world (train split, default config), generated into the cache")
_world_entry("toyworld", "test", "Synthetic toy world (test split, default config), generated into the cache")
# Its test split only: no recipe may train on the world that checks generalisation.
_world_entry("toyworld-alt", "test", "Held-out toy world: other relations, wording and names (index "
             "toyworld-alt); for generalisation checks, never trained on")


def _selected_entry() -> None:
    """`data select`'s Medium + Difficult toy-world comparisons, shipped so no run has to select."""
    name, rel = "toyworld:selected", "configs/data/toyworld-selected.jsonl"
    path = Path(__file__).resolve().parent.parent / rel

    def load() -> list[Question]:
        return load_questions(path)

    desc = "Toy-world comparisons SmolLM2 finds Medium or Difficult (data select over 200 of toyworld:train)"
    DATASETS.register(name)(DatasetEntry(name, desc, f"searchrl/{rel}", load, lambda: _count_lines(path)))


_selected_entry()


# ---------------------------------------------------------------- datasets API

def load_dataset(spec: str) -> list[Question]:
    """Questions named by `spec`: a catalog name, `hf:NAME[@CONFIG][:SPLIT]`, or a file path."""
    if spec in DATASETS:
        return DATASETS.get(spec).load()
    if spec.startswith("hf:"):
        from searchrl.data.loaders import load_hf

        name, _, split = spec[3:].partition(":")
        name, _, config = name.partition("@")
        if not name:
            raise SearchRLError(f"dataset spec {spec!r} names no Hugging Face dataset; write hf:NAME[@CONFIG][:SPLIT]")
        return load_hf(name, split or "train", config or None)
    path = Path(spec).expanduser()
    if path.exists():
        return load_questions(path)  # a directory is refused there, as one
    known = ", ".join(DATASETS.names())
    raise SearchRLError(
        f"unknown dataset {spec!r}: not a catalog name and no such file. "
        f"Catalog names: {known}; or give a question file path, or hf:NAME[@CONFIG][:SPLIT]."
    )


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    description: str
    source: str
    count: int | None  # None when it could not be counted (e.g. data folder absent)
    problem: str = ""


def list_datasets() -> list[DatasetInfo]:
    """Every catalog dataset with its question count (cheap; builds no index)."""
    infos = []
    for name in DATASETS.names():
        entry = DATASETS.get(name)
        try:
            infos.append(DatasetInfo(name, entry.description, entry.source, entry.count()))
        except (SearchRLError, ImportError) as exc:  # data folder absent, generator unavailable
            infos.append(DatasetInfo(name, entry.description, entry.source, None, str(exc)))
    return infos


def data_available() -> bool:
    """Whether the benchmark data folder is present (most catalog datasets need it)."""
    return find_shared_data() is not None


# ---------------------------------------------------------------- CLI bodies

def list_command(indexes: list[tuple[str, str, bool]]) -> None:
    """`searchrl data list`: tables of the catalog datasets and of `indexes` ((name, description,
    built?) of each catalog index: `searchrl.retrieval.catalog.list_indexes`)."""
    from rich.console import Console
    from rich.text import Text

    from searchrl.tables import Column, print_table

    console = Console()
    rows = [[info.name, f"{info.count:,}" if info.count is not None else Text("n/a", style="red"), info.source,
             Text.assemble(info.description, (f" ({info.problem})" if info.problem else "", "red"))]
            for info in list_datasets()]
    print_table(console, [Column("name"), Column("questions", right=True), Column("source", drop_first=True),
                          Column("description", wrap=True)], rows, title="datasets (searchrl data show NAME)")
    console.print()
    print_table(console, [Column("name"), Column("built"), Column("description", wrap=True)],
                [[name, "yes" if built else "no", description] for name, description, built in indexes],
                title="indexes (--index NAME; built on first use)")
    if not data_available():
        console.print("[yellow]benchmark data folder not found; set SEARCHRL_DATA=/path/to/shared/data[/]")


# `data show` prints previews: a 50 MB question must not take minutes to scroll past.
_PREVIEW_CHARS = 300


def preview(text: str, limit: int = _PREVIEW_CHARS) -> str:
    """`text` cut to `limit` characters, saying how much was left out.

    >>> preview("abcdef", 4)
    'abcd… (2 more characters)'
    """
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text) - limit:,} more characters)"


def show_command(spec: str, limit: int) -> None:
    """`searchrl data show SPEC`: the first `limit` questions of a dataset, long fields cut short
    and control characters shown as escapes (the file's text is untrusted)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.text import Text

    from searchrl.display import visible

    console = Console()
    questions = load_dataset(spec)
    console.print(f"[bold]{escape(spec)}[/]: {len(questions):,} questions")

    def show(text: str, limit: int = _PREVIEW_CHARS) -> str:
        return visible(preview(text, limit), keep_newlines=False)

    for q in questions[:limit]:
        meta = f"{q.type or ''} {q.source}"
        console.print()
        console.print(Text.assemble((show(q.id, 80), "cyan"), " ", (show(meta, 80), "dim")), highlight=False, markup=False)
        console.print(f"  Q: {show(q.question)}", highlight=False, markup=False)
        console.print(f"  A: {show(' | '.join(q.answers))}", highlight=False, markup=False)
        if q.supporting_ids:
            console.print(f"  supporting: {show(', '.join(q.supporting_ids))}", highlight=False, markup=False)


def localwiki_command(out: Path) -> None:
    """`searchrl data localwiki --out DIR`: write the corpus and mapped question files."""
    from searchrl.data import localwiki

    data = shared_data()
    wiki = localwiki.build(data)
    localwiki.write(wiki, out, data)
    print(f"{out}/corpus.jsonl: {len(wiki.passages):,} passages (from {wiki.n_paragraphs_seen:,} paragraphs)")
    for name, questions in wiki.datasets.items():
        print(f"{out}/{name}.jsonl: {len(questions):,} questions")
