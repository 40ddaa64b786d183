"""What a run folder holds — a training run, an evaluation, a demo, an evaluation report, a data
selection, a second-hop probe — recorded in the folder (`run.json`, `{"kind": ...}`) by the
command that first writes there, and checked by every command that writes into a folder it is
given (`train --out/--resume`, `eval run --out/--resume`, `demo --out`, `eval report --out`, `data
select --out`, `eval second-hop --out`). A command never writes into a folder of another kind, not
even with `--overwrite`: `train --out` on an evaluation would replace its config (and the
evaluation could not resume), `eval run --overwrite` on a training run its config.

Folders written before the record existed are known by what they hold (`_signs`): a training run
by `checkpoints/` or `metrics.jsonl`, an evaluation by its predictions or metrics, a demo by its
`train/` or `eval-*/` folders, a report by `report.md` beside `runs/`, a selection by its
`progress.jsonl`, a probe by `second_hop.md`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from searchrl.errors import SearchRLError

KIND_FILE = "run.json"
KINDS = {"train": "a training run", "eval": "an evaluation", "demo": "a demo", "report": "an evaluation report",
         "select": "a data selection", "second-hop": "a second-hop probe"}
# The command that writes each kind, for the messages.
COMMANDS = {"train": "searchrl train", "eval": "searchrl eval run", "demo": "searchrl demo", "report": "searchrl eval report",
            "select": "searchrl data select", "second-hop": "searchrl eval second-hop"}


def _signs(folder: Path) -> tuple[str, str] | None:
    """(kind, what shows it) of a folder without `run.json`, from what it holds; None: nothing of a run."""
    for kind, names in (("train", ("checkpoints", "metrics.jsonl")),
                        ("eval", ("predictions.jsonl", "progress.json", "metrics.json")),
                        ("select", ("progress.jsonl",)), ("second-hop", ("second_hop.md",))):
        for name in names:
            if (folder / name).exists():
                return kind, name
    if (folder / "train").is_dir():
        return "demo", "train/"
    demo_evals = sorted(p.name for p in folder.glob("eval-*") if p.is_dir())
    if demo_evals:
        return "demo", f"{demo_evals[0]}/"
    if (folder / "runs").is_dir() and (folder / "report.md").is_file():
        return "report", "runs/ and report.md"
    return None


def kind_of(folder: str | Path) -> tuple[str, str] | None:
    """(kind, where it is said) of `folder`: its `run.json`, or what it holds; None for a folder
    (or path) that holds no run. A `run.json` that names no kind is an error."""
    folder = Path(folder)
    record = folder / KIND_FILE
    if record.is_file():
        try:
            kind = json.loads(record.read_text(encoding="utf-8")).get("kind")
        except (OSError, ValueError, AttributeError) as exc:
            raise SearchRLError(f"{record} is damaged ({type(exc).__name__}); it says what kind of run {folder} holds "
                                f"({', '.join(KINDS)}): rewrite it as {{\"kind\": \"...\"}}") from None
        if kind not in KINDS:
            raise SearchRLError(f"{record} names the kind {str(kind)[:40]!r}, none of {', '.join(KINDS)}: rewrite it as "
                                "{\"kind\": \"...\"}")
        return kind, KIND_FILE
    if not folder.is_dir():
        return None
    return _signs(folder)


def check_kind(folder: str | Path, kind: str, flag: str = "--out") -> None:
    """Refuse to write a `kind` run into `folder` (given as `flag`) when it holds another kind."""
    found = kind_of(folder)
    if found is None or found[0] == kind:
        return
    other, said = found
    raise SearchRLError(f"{flag} {folder} holds {KINDS[other]} (its {said}), and `{COMMANDS[kind]}` writes {KINDS[kind]}: "
                        "nothing was written; choose another folder")


def claim(folder: str | Path, kind: str, flag: str = "--out") -> None:
    """`check_kind`, then record `kind` in `folder` (created if missing) unless recorded already."""
    check_kind(folder, kind, flag)
    folder = Path(folder)
    record = folder / KIND_FILE
    if record.is_file():
        return
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{KIND_FILE}.tmp"
    tmp.write_text(json.dumps({"kind": kind}) + "\n", encoding="utf-8")
    os.replace(tmp, record)
