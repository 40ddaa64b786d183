"""`searchrl index search`: one query against an index, its passages printed as a table or JSON.

Apart from `index.py` because it resolves catalog names, and the catalog builds indexes."""

from __future__ import annotations

import json

from rich.console import Console
from rich.text import Text

from searchrl.display import visible
from searchrl.retrieval import local_index_dir
from searchrl.retrieval.index import open_index
from searchrl.retrieval.kinds import SearchSettings
from searchrl.tables import Column, print_table


def search_command(
    index: str, query: str, k: int, as_json: bool, settings: SearchSettings | None = None
) -> None:
    """`searchrl index search`: one query against an index directory or a catalog index, a
    table (or JSON) of the top-k passages; their text is shown with control characters escaped."""
    retriever = open_index(local_index_dir(index), settings=settings)
    try:
        (hits,) = retriever.search([query], k)
    finally:
        retriever.close()
    if as_json:
        print(json.dumps([p.to_dict() for p in hits], ensure_ascii=False, indent=2))
        return
    console = Console()
    if not hits:
        console.print("no passages matched" + ("" if query.strip() else " (the query is blank)"), markup=False)
        return
    rows = []
    for rank, p in enumerate(hits, 1):
        snippet = p.text if len(p.text) <= 160 else p.text[:157] + "..."
        name = Text.assemble(visible(p.title, keep_newlines=False), " ", (f"({visible(p.id, keep_newlines=False)})", "dim"))
        rows.append([str(rank), f"{p.score:.3f}", name, Text(visible(snippet))])
    columns = [Column("#", right=True), Column("score", right=True), Column("title", wrap=True), Column("text", wrap=True)]
    print_table(console, columns, rows, title=f"'{visible(query, keep_newlines=False)}' in {index}", keep=3)
