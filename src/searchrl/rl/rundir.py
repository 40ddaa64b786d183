"""The run directory: where a (re)started run begins (`open_run`). One process owns it while it
trains (`searchrl.runlock.RunLock`).

Resuming continues after the newest *intact* checkpoint (its checksums match and its state
loads); newer, corrupt ones are skipped with a warning. A checkpoint whose files cannot all be
checked (no `checksums.json`, or an older searchrl's pickled `trainer_state.pt`, which its
checksums do not cover) stops the resume unless the user passes `--trust-unverified`. A run
stopped before its first checkpoint restarts from step 0. A resume may not renumber steps already taken: a finished stage keeps its
length, and the current stage may grow but not shrink below where it stands.
"""

from __future__ import annotations

import shutil
import sys
from datetime import datetime
from pathlib import Path

from searchrl.errors import SearchRLError
from searchrl.rl import checkpoint as ckpt
from searchrl.rl.config import TrainConfig
from searchrl.rl.health import trim_alarms
from searchrl.rl.integrity import CHECKSUMS, verify_checksums
from searchrl.runkind import claim
from searchrl.runlog import METRICS_FILE, truncate_metrics


def _warn(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_dir_for(cfg: TrainConfig, resume: Path | None) -> Path:
    """The run directory a fresh run writes (`cfg.out` or a dated name) or a resumed one continues."""
    if resume is None:
        return Path(cfg.out or f"runs/train-{datetime.now():%Y%m%d-%H%M%S}")
    if not (Path(resume) / "config.yaml").is_file():
        raise SearchRLError(f"cannot resume: {resume} is not a run directory (it has no config.yaml)")
    return Path(resume)


class UnverifiedCheckpoint(SearchRLError):
    """A checkpoint some of whose files cannot be checked: resumed only with `--trust-unverified`."""


def open_run(cfg: TrainConfig, resume: Path | None, stages: list[int] | None,
             trust_unverified: bool = False) -> tuple[Path, ckpt.TrainerState | None, Path | None]:
    """(run dir, trainer state to resume from, its checkpoint folder); no state: start at step 0.
    Resuming trims what the stopped run wrote after that checkpoint (metrics, samples)."""
    run_dir = run_dir_for(cfg, resume)
    claim(run_dir, "train", "--out" if resume is None else "--resume")  # an evaluation's folder is never trained into
    if resume is None:
        if (run_dir / METRICS_FILE).exists() or (run_dir / "checkpoints").exists():
            raise SearchRLError(f"{run_dir} already holds a run; continue it with --resume {run_dir} or choose another --out")
        run_dir.mkdir(parents=True, exist_ok=True)
        return run_dir, None, None
    ckpt.clean_temp(run_dir)
    skipped: list[str] = []
    found = newest_intact_checkpoint(run_dir, trust_unverified, skipped=skipped)
    if found is None:
        if ckpt.complete_checkpoints(run_dir):
            raise SearchRLError(
                f"cannot resume {run_dir}: none of its checkpoints is intact (the newest: {skipped[0]}; the others in the "
                f"warnings above); move {run_dir / 'checkpoints'} aside to restart the run from step 0"
            )
        _warn(f"{run_dir} has no checkpoint (its run stopped before the first one): restarting it from step 0")
        _trim(run_dir, 0, 0)
        shutil.rmtree(run_dir / "tb", ignore_errors=True)
        return run_dir, None, None
    folder, state = found
    check_resume(cfg, state, folder, stages)
    _trim(run_dir, state.step, state.metrics_lines)
    return run_dir, state, folder


def newest_intact_checkpoint(run_dir: Path, trust_unverified: bool = False, action: str = "resume",
                             skipped: list[str] | None = None) -> tuple[Path, ckpt.TrainerState] | None:
    """The newest checkpoint whose files match their checksums (which cover every file it holds),
    whose state loads and whose stage-end checkpoints (where later stages start) are intact;
    corrupt ones are skipped with a warning (and `skipped` gets "folder: problem" of each). One
    that cannot be checked raises `UnverifiedCheckpoint` unless `trust_unverified`. `action`:
    what the caller does with it (resume, export), for the messages."""
    for _, folder in reversed(ckpt.complete_checkpoints(run_dir)):
        try:
            state = intact_state(folder, trust_unverified, action)
        except UnverifiedCheckpoint:
            raise
        except SearchRLError as exc:
            _warn(f"warning: skipping corrupt checkpoint {folder}: {exc}; trying an older one")
            if skipped is not None:
                skipped.append(f"{folder.name}: {exc}")
            continue
        return folder, state
    return None


def intact_state(folder: Path, trust_unverified: bool = False, action: str = "resume") -> ckpt.TrainerState:
    """The state of checkpoint `folder` once its files (and its stage ends') are verified;
    `SearchRLError` says what is damaged (`UnverifiedCheckpoint`: what cannot be checked)."""
    problem = _check_files(folder, trust_unverified, action=action)
    if problem:
        raise SearchRLError(problem)
    state = ckpt.load_state(folder)  # after the check: a damaged file is never parsed
    for name in set(state.stage_ends.values()) - {folder.name}:
        end = folder.parent / name
        problem = _check_files(end, trust_unverified, reads_state=False, action=action) if end.is_dir() else "it is missing"
        if problem:
            raise SearchRLError(f"the stage-end checkpoint it builds on, {name}, is corrupt: {problem}")
    return state


# What an older searchrl's checkpoint holds outside its checksums: its pickled state, a rank's RNG.
LEGACY_UNCOVERED = (ckpt.LEGACY_STATE_FILE, "rng_rank_*.pt")


def _check_files(folder: Path, trust_unverified: bool, reads_state: bool = True, action: str = "resume") -> str | None:
    """What is wrong with `folder`'s files (None: nothing). One whose files cannot all be checked
    is refused (`UnverifiedCheckpoint`), or with `trust_unverified` checked as far as it can be.
    `reads_state=False`: only its model is used (a stage's start), which a legacy checkpoint's
    checksums do cover."""
    legacy = ckpt.is_legacy(folder)
    uncovered = LEGACY_UNCOVERED if legacy else ()
    if reads_state and legacy:
        why = f"was written by an older searchrl: its {ckpt.LEGACY_STATE_FILE} is a pickle that no {CHECKSUMS} covers"
        other = f"start a new run from its weights (model={folder})"
    elif not (folder / CHECKSUMS).is_file():
        why = f"has no {CHECKSUMS} (it was deleted, or the checkpoint copied without it)"
        other = f"move {folder} aside to {action} an older checkpoint"
    else:
        return verify_checksums(folder, uncovered)
    if not trust_unverified:
        raise UnverifiedCheckpoint(
            f"cannot {action} {folder.parent.parent}: checkpoint {folder} {why}, so a corrupted or altered file would go "
            f"unnoticed; if you trust where this run directory came from, {action} with --trust-unverified (its files are "
            f"still read without running code), or {other}"
        )
    _warn(f"warning: using checkpoint {folder} unverified (--trust-unverified): it {why}")
    return verify_checksums(folder, uncovered) if (folder / CHECKSUMS).is_file() else None


def check_resume(cfg: TrainConfig, state: ckpt.TrainerState, folder: Path, stages: list[int] | None) -> None:
    """Refuse a resume that would renumber steps already taken. The current stage may be
    lengthened (its LR schedule then stretches over the new length) or ended where it stands."""
    where = f"cannot resume {folder.parent.parent}"
    if stages is not None and list(stages) != state.plan:
        raise SearchRLError(f"{where} with --stage {' '.join(map(str, stages))}: the run trains stages {state.plan}; drop --stage")
    offset = 0  # steps before the stage
    for s in state.plan:
        steps = cfg.stage(s).steps
        if s in state.stage_ends:
            end = int(state.stage_ends[s].split("_")[1])
            if steps != end - offset:
                raise SearchRLError(
                    f"{where} with stage{s}.steps={steps}: Stage {s} finished after {end - offset} steps "
                    f"(checkpoint {state.stage_ends[s]}), and changing a finished stage's length would renumber "
                    f"and overwrite its steps; set stage{s}.steps={end - offset}, or start a new run from that checkpoint (model=...)"
                )
            offset = end
        elif s == state.stage:
            if steps < state.stage_step:
                raise SearchRLError(
                    f"{where} with stage{s}.steps={steps}: Stage {s} already stands at step {state.stage_step} "
                    f"(checkpoint {folder.name}); set stage{s}.steps to {state.stage_step} or more"
                )
            if steps == state.stage_step:  # the stage ends at this checkpoint: the next starts from it
                state.stage_ends[s] = folder.name
            return


def _trim(run_dir: Path, step: int, metrics_lines: int) -> None:
    """Drop what a stopped run wrote after `step`: metrics records, alarms and sample dumps."""
    truncate_metrics(run_dir, metrics_lines)
    trim_alarms(run_dir, step)
    for f in (run_dir / "samples").glob("step_*.jsonl") if (run_dir / "samples").is_dir() else []:
        if int(f.stem.split("_")[1]) > step:
            f.unlink()
