"""`searchrl data toyworld`: generate, write, and print what was made."""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console
from rich.text import Text

from searchrl.data.toyworld import QUESTION_TYPES, ToyWorld, ToyWorldConfig, generate, write
from searchrl.errors import SearchRLError
from searchrl.tables import Column, print_table


def print_counts(world: ToyWorld, console: Console) -> None:
    """Questions per type and split, and their totals."""
    counts = world.counts()
    rows = [[t, str(counts["train"][t]), str(counts["test"][t])] for t in QUESTION_TYPES]
    rows.append([Text(x, style="bold") for x in ("total", str(len(world.train)), str(len(world.test)))])
    print_table(console, [Column("type"), Column("train", right=True), Column("test", right=True)], rows,
                title=f"toy world: {len(world.passages):,} passages (seed {world.config.seed})")


def toyworld_command(out: Path, **overrides: int | None) -> None:
    try:
        cfg = ToyWorldConfig(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        lines = [f"  --{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
        raise SearchRLError("invalid toy world options:\n" + "\n".join(lines)) from None
    start = time.perf_counter()
    world = generate(cfg)
    write(world, out)
    console = Console()
    print_counts(world, console)
    console.print(f"wrote {out}/corpus.jsonl, train.jsonl, test.jsonl, meta.json "
                  f"in {time.perf_counter() - start:.1f} s")
