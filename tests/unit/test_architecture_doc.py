"""docs/concepts/architecture.md against the code: its table of layers names every top-level
module and package of `searchrl`, each once, and no module imports from a layer above its own
(the table lists the layers top to bottom). The import graph is `test_import_graph`'s: every
import that runs, read from the source."""

from __future__ import annotations

import re
from pathlib import Path

from test_import_graph import MODULES, _graphs, _package

DOC = Path(__file__).resolve().parents[2] / "docs" / "concepts" / "architecture.md"
ROW = re.compile(r"^\| `(?P<name>[\w.]+/?)` \| (?P<layer>\w+) \| (?P<owns>.+) \|$")


def _rows(text: str) -> list[tuple[str, str]]:
    """(module as `searchrl.x`, layer) of each row of the layer table, in the page's order."""
    return [(f"searchrl.{m['name'].removesuffix('/').removesuffix('.py')}", m["layer"])
            for m in map(ROW.match, text.splitlines()) if m]


def _top_level() -> set[str]:
    """Every top-level module (`x.py`) and package (`x/` with an `__init__.py`) of searchrl."""
    return {_package(m) for m in MODULES} - {"searchrl"}


def test_the_table_names_every_top_level_module_once():
    rows = _rows(DOC.read_text(encoding="utf-8"))
    named = [name for name, _ in rows]
    assert len(named) == len(set(named)), "named twice: " + ", ".join(sorted({n for n in named if named.count(n) > 1}))
    missing, stale = _top_level() - set(named), set(named) - _top_level()
    assert not missing, f"{DOC.name}: no row for " + ", ".join(sorted(missing)) + " (add it to the layer table)"
    assert not stale, f"{DOC.name}: rows for modules that do not exist: " + ", ".join(sorted(stale))


def test_no_module_imports_from_a_layer_above_its_own():
    rows = _rows(DOC.read_text(encoding="utf-8"))
    blocks = [layer for i, (_, layer) in enumerate(rows) if i == 0 or rows[i - 1][1] != layer]
    assert len(blocks) == len(set(blocks)), f"{DOC.name}: list each layer's rows together, top to bottom: {blocks}"
    order = blocks[::-1]  # bottom first
    rank = {name: order.index(layer) for name, layer in rows}
    _, every = _graphs()
    upward = []
    for module, targets in sorted(every.items()):
        for target in sorted(targets):
            a, b = _package(module), _package(target)
            if a in rank and b in rank and rank[b] > rank[a]:
                upward.append(f"{module} ({order[rank[a]]}) imports {target} ({order[rank[b]]})")
    assert not upward, f"imports against the layers of {DOC.name}:\n" + "\n".join(upward)


def test_the_rows_are_read():
    text = "| module | layer | what it owns |\n|---|---|---|\n| `cli.py` | entry | The app |\n| `rl/` | jobs | Training |\n"
    assert _rows(text) == [("searchrl.cli", "entry"), ("searchrl.rl", "jobs")]


def test_the_diagrams_fit_the_page():
    blocks = re.findall(r"```\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.DOTALL)
    wide = [line for block in blocks for line in block.splitlines() if len(line) > 100]
    assert blocks and not wide, wide
