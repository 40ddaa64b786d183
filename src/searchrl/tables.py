"""Tables the commands print, readable wherever they land.

On a terminal wide enough, a rich table. Piped or redirected (not a terminal), a Markdown table:
nothing to cut, pastes anywhere. On a terminal too narrow for every column, the leading columns
and as many others as fit, and a line naming the ones left out (and where they are written):
a cell is never broken across lines, except in columns of prose (`Column.wrap`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePath

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

Cell = str | Text  # a str is shown as it is (never read as rich markup)


@dataclass(frozen=True)
class Column:
    name: str
    right: bool = False  # numbers: right-aligned
    wrap: bool = False  # prose that may wrap onto more lines; other cells stay whole
    drop_first: bool = False  # on a narrow terminal, left out before the other columns


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Cell]], right: Sequence[bool] = ()) -> str:
    """A Markdown table; `right[i]` right-aligns column i."""
    def cell(value: Cell) -> str:
        text = value.plain if isinstance(value, Text) else str(value)
        return text.replace("|", "\\|").replace("\n", " ")

    aligns = [right[i] if i < len(right) else False for i in range(len(header))]
    lines = ["| " + " | ".join(map(cell, header)) + " |",
             "|" + "|".join("---:" if r else "---" for r in aligns) + "|"]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def print_table(console: Console, columns: Sequence[Column], rows: Sequence[Sequence[Cell]], *,
                title: str | None = None, keep: int = 1, elsewhere: str | None = None) -> None:
    """`rows` under `columns` on `console`: Markdown when it is not a terminal; on a narrow one the
    first `keep` columns and as many of the rest as fit (`Column.drop_first` ones go first, then
    from the right), with a line naming the others and where they are (`elsewhere`, e.g. the
    report file)."""
    header = [c.name for c in columns]
    if not console.is_terminal:
        text = (f"{title}\n\n" if title else "") + markdown_table(header, rows, [c.right for c in columns])
        console.print(text, end="", markup=False, highlight=False, soft_wrap=True)
        return
    shown = list(range(len(columns)))
    droppable = [i for i in reversed(shown[keep:]) if columns[i].drop_first] + \
                [i for i in reversed(shown[keep:]) if not columns[i].drop_first]
    while _width(columns, rows, shown) > console.width and droppable:
        shown.remove(droppable.pop(0))
    pick = [[row[i] for i in shown] for row in rows]
    if _width(columns, rows, shown) > console.width:  # even the leading columns do not fit: Markdown lines wrap whole
        console.print(markdown_table([header[i] for i in shown], pick, [columns[i].right for i in shown]),
                      end="", markup=False, highlight=False)
    else:
        table = Table(title=Text(title) if title else None)
        for i in shown:
            c = columns[i]
            table.add_column(c.name, justify="right" if c.right else "left", no_wrap=not c.wrap,
                             overflow="fold" if c.wrap else "ellipsis")
        for row in pick:
            table.add_row(*(cell if isinstance(cell, Text) else Text(str(cell)) for cell in row))
        console.print(table)
    left_out = [header[i] for i in range(len(columns)) if i not in shown]
    if left_out:
        where = f"they are in {elsewhere}" if elsewhere else "widen the terminal, or pipe the output for Markdown"
        console.print(f"{len(left_out)} more column(s) not shown ({', '.join(left_out)}): {where}",
                      markup=False, highlight=False)


def _width(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], shown: list[int]) -> int:
    """The narrowest a rich table of the `shown` columns can be with no cell cut: whole lines of
    every cell, the longest word of prose columns, and rich's borders and padding (3 per column + 1)."""
    def need(text: str, wrap: bool) -> int:
        pieces = text.split() if wrap else text.splitlines()
        return max((cell_len(p) for p in pieces), default=0)

    total = 0
    for i in shown:
        cells = [columns[i].name] + [row[i].plain if isinstance(row[i], Text) else str(row[i]) for row in rows]
        total += max(need(cell, columns[i].wrap) for cell in cells)
    return total + 3 * len(shown) + 1


def short_path(text: str) -> str:
    """A file-system path as the name a person knows it by: a checkpoint as RUN/step_XXXX, anything
    else by its last part; names that are not paths (hub ids, catalog names) stay as they are.

    >>> short_path("/home/me/runs/demo/train/checkpoints/step_0030")
    'train/step_0030'
    >>> short_path("runs/eval/hotpotqa-r1searcher"), short_path("HuggingFaceTB/SmolLM2-135M")
    ('hotpotqa-r1searcher', 'HuggingFaceTB/SmolLM2-135M')
    """
    if not (text.startswith(("/", "./", "../", "~")) or text.count("/") >= 2):
        return text
    parts = PurePath(text).parts
    if "checkpoints" in parts[1:-1]:
        i = len(parts) - 1 - parts[::-1].index("checkpoints")
        return f"{parts[i - 1]}/{parts[i + 1]}"
    return parts[-1]
