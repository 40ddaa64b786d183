"""BM25 retrieval on `bm25s` (sparse scores precomputed at build time; a query is a sum of
columns, so a batch of queries costs milliseconds even on one CPU core)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import bm25s
from bm25s.tokenization import Tokenizer

from searchrl.data.types import Passage
from searchrl.errors import SearchRLError
from searchrl.retrieval.base import Retriever
from searchrl.retrieval.kinds import INDEX_KINDS, BuildOptions
from searchrl.retrieval.store import (
    Passages,
    PassageStore,
    StoredIndex,
    as_passages,
    index_text,
    read_manifest,
    save_passages,
    write_manifest,
)

STOPWORDS = "en"
SUBDIR = "bm25"


def stemmer_available() -> bool:
    """Whether PyStemmer (the optional Snowball stemmer bm25s recommends) can be imported."""
    try:
        import Stemmer  # noqa: F401
    except ImportError:
        return False
    return True


def _make_stemmer(language: str | None):
    if language is None:
        return None
    try:
        import Stemmer
    except ImportError:
        raise SearchRLError(
            f"BM25 {language} stemming needs PyStemmer, which is not installed here: "
            "pip install PyStemmer, or build the index without stemming"
        ) from None
    return Stemmer.Stemmer(language)


@INDEX_KINDS.register("bm25")
class BM25Index(StoredIndex, Retriever):
    """Lucene-variant BM25 (k1=1.5, b=0.75) over title + text, English stopwords removed,
    Snowball-stemmed when PyStemmer is installed. Only passages sharing a term with the query
    are returned, so a query may get fewer than k."""

    kind = "bm25"

    def __init__(
        self, model: bm25s.BM25, passages: Passages, *, stemmer: str | None = None
    ) -> None:
        self.model = model
        self.passages = passages
        self.stemmer_language = stemmer
        self._stemmer = _make_stemmer(stemmer)
        self._loaded_from: Path | None = None

    @classmethod
    def build(
        cls, passages: Iterable[Passage], *, stem: bool | None = None, progress: bool = True
    ) -> BM25Index:
        """Index `passages` in memory. `stem=None` stems when PyStemmer is importable."""
        store = as_passages(passages)
        language = "english" if (stemmer_available() if stem is None else stem) else None
        tokenizer = Tokenizer(stopwords=STOPWORDS, stemmer=_make_stemmer(language))
        token_ids = tokenizer.tokenize(
            (index_text(p) for p in store),
            length=len(store),
            return_as="ids",
            show_progress=progress,
        )
        model = bm25s.BM25()
        model.index((token_ids, tokenizer.get_vocab_dict()), show_progress=progress)
        return cls(model, store, stemmer=language)

    @classmethod
    def build_from(cls, passages: Passages, options: BuildOptions) -> BM25Index:
        return cls.build(passages, progress=options.progress)

    def save(self, folder: Path, **manifest_fields) -> Path:
        """Write an index folder that `open_index` / `BM25Index.load` can read."""
        folder = Path(folder)
        if self._loaded_from == folder.resolve():
            return folder  # immutable since loading; rewriting mapped files could corrupt them
        folder.mkdir(parents=True, exist_ok=True)
        save_passages(self.passages, folder)
        self.model.save(str(folder / SUBDIR), show_progress=False)
        write_manifest(
            folder,
            self.kind,
            len(self.passages),
            stemmer=self.stemmer_language,
            stopwords=STOPWORDS,
            **manifest_fields,
        )
        return folder

    @classmethod
    def load(cls, folder: Path, mmap: bool = True) -> BM25Index:
        """Open a saved index; `mmap=True` leaves the score matrix on disk until touched."""
        folder = Path(folder)
        manifest = read_manifest(folder)
        if manifest["kind"] != cls.kind:
            raise SearchRLError(
                f"{folder} holds a {manifest['kind']!r} index, not bm25; use open_index"
            )
        if not (folder / SUBDIR).is_dir():
            raise SearchRLError(f"{folder}: the {SUBDIR}/ folder is missing; rebuild the index")
        model = bm25s.BM25.load(str(folder / SUBDIR), mmap=mmap, show_progress=False)
        index = cls(model, PassageStore(folder), stemmer=manifest.get("stemmer"))
        index._loaded_from = folder.resolve()
        return index

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        results: list[list[Passage]] = [[] for _ in queries]
        live = [i for i, q in enumerate(queries) if q and q.strip()]
        if not live or k <= 0:
            return results
        tokens = bm25s.tokenize(
            [queries[i] for i in live],
            stopwords=STOPWORDS,
            stemmer=self._stemmer,
            return_ids=False,
            show_progress=False,
        )
        # bm25s refuses k > corpus size; its batch retrieve gives rows [Q, k] best first.
        rows, scores = self.model.retrieve(
            tokens, k=min(k, len(self.passages)), show_progress=False
        )
        for i, row_ids, row_scores in zip(live, rows, scores):
            hits = [(int(r), float(s)) for r, s in zip(row_ids, row_scores) if s > 0]
            results[i] = self.materialise(hits)
        return results

    def __repr__(self) -> str:
        return f"BM25Index({len(self.passages)} passages, stemmer={self.stemmer_language})"
