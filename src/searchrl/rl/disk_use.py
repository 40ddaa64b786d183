"""What a run's checkpoints take on disk, said when one is written, and the optimizer state kept
only in the newest checkpoint (`logging.optimizer_in_latest_only`).

The optimizer's Adam moments are float32 and twice the weights: most of a checkpoint. Older
checkpoints without them still evaluate, export and start new runs; resuming from one (a rollback,
or a newest checkpoint found damaged) starts a fresh optimizer and says so.
"""

from __future__ import annotations

from pathlib import Path

from searchrl.rl import checkpoint as ckpt
from searchrl.rl.integrity import drop_file


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def human_bytes(n: float) -> str:
    """A size in the units people say it in.

    >>> human_bytes(538_000_000), human_bytes(4.6e9), human_bytes(900)
    ('538 MB', '4.6 GB', '900 B')
    """
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            value = n / size
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{n:.0f} B"


def drop_old_optimizers(run_dir: Path) -> int:
    """Delete the optimizer state of every complete checkpoint but the newest (its checksums
    updated, so the folder stays verified); returns the bytes freed. One-process checkpoints only:
    a sharded one keeps its optimizer shards inside its DCP folder."""
    freed = 0
    for _, folder in ckpt.complete_checkpoints(run_dir)[:-1]:
        path = folder / ckpt.OPTIMIZER_FILE
        if path.is_file():
            freed += path.stat().st_size
            drop_file(folder, ckpt.OPTIMIZER_FILE)
    return freed


def disk_line(run_dir: Path, folder: Path, freed: int = 0) -> str:
    """One line for the console when `folder` is written: its size (and its optimizer's share),
    all checkpoints of the run together, and what dropping older optimizer states freed."""
    size = folder_bytes(folder)
    optimizer = folder / ckpt.OPTIMIZER_FILE
    share = f" (optimizer state {human_bytes(optimizer.stat().st_size)})" if optimizer.is_file() else ""
    total = folder_bytes(Path(run_dir) / "checkpoints")
    line = f"checkpoint {folder.name}: {human_bytes(size)}{share}; checkpoints/ holds {human_bytes(total)}"
    return line + (f" ({human_bytes(freed)} of older optimizer states freed)" if freed else "")
