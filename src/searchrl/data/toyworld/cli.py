"""`searchrl data toyworld`: generate, write, and print what was made."""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from searchrl.data.toyworld import QUESTION_TYPES, ToyWorld, ToyWorldConfig, generate, write
from searchrl.errors import SearchRLError


def counts_table(world: ToyWorld) -> Table:
    counts = world.counts()
    table = Table(title=f"toy world: {len(world.passages):,} passages (seed {world.config.seed})")
    for column in ("type", "train", "test"):
        table.add_column(column, justify="left" if column == "type" else "right")
    for t in QUESTION_TYPES:
        table.add_row(t, str(counts["train"][t]), str(counts["test"][t]))
    table.add_row("total", str(len(world.train)), str(len(world.test)), style="bold")
    return table


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
    console.print(counts_table(world))
    console.print(f"wrote {out}/corpus.jsonl, train.jsonl, test.jsonl, meta.json "
                  f"in {time.perf_counter() - start:.1f} s")
