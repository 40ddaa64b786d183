"""`searchrl data select`: sort questions by how many rollouts a reference model needs to answer
them (docs/guides/data-selection.md; R1-Searcher §4.1: Easy < 10, Medium 10-20, Difficult > 20).

Questions advance in rounds. Each round samples `rollouts_per_round` rollouts (the rollout
engine, with the configured backend and retriever) for each of up to `questions_per_round`
questions; a question leaves the pool once a rollout is correct or `max_rollouts` have been
sampled, and the next question takes its place, so every generation batch stays full.

The count of a question is the position, in sampling order, of its first correct rollout: a round
draws its samples at once, but sample j of a round is rollout `sampled_before + j + 1`, exactly as
if they had been drawn one by one. Samples drawn after the first correct one in that round do not
change the count (they only add to `rollouts_correct`).

Resuming: every round is one line of `progress.jsonl` (its questions' per-sample correctness),
appended and synced before the next round starts. Running the same command again with the same
`out` reads it back and samples only what is missing: finished questions are never redone, an
unfinished one continues from the rollouts it has. A line cut off by a kill is dropped (that round
runs again). Settings that would change what a rollout is (model, data, protocol, sampling,
retrieval, metric) must match; the cap, the bucket thresholds and the pool sizes may change (a
higher cap continues the unsolved questions; other thresholds re-bucket without sampling).
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import deque
from pathlib import Path

from searchrl.config import dump_config
from searchrl.data.textio import read_appended_jsonl
from searchrl.data.types import Question
from searchrl.errors import SearchRLError, listing
from searchrl.profiles import announce
from searchrl.rollout.agent import build_agent
from searchrl.runkind import check_kind, claim
from searchrl.select.buckets import BUCKETS, Tally, bucket_of
from searchrl.select.config import SelectConfig

PROGRESS = "progress.jsonl"

# Keys that change no rollout's outcome: how many are drawn, how they are grouped, how the counts
# are bucketed, where the run lives, how long services are waited for.
FREE_TO_CHANGE = (
    "out",
    "limit",
    "max_rollouts",
    "medium_from",
    "difficult_from",
    "rollouts_per_round",
    "questions_per_round",
    "rollout.batch_size",
    "retrieval.retry.",
    "retrieval.web.retry.",
    "retrieval.web.budget.",
    "retrieval.web.workers",
)


def round_seed(seed: int, rnd: int) -> int:
    """The sampler seed of round `rnd` (deterministic, unrelated across rounds and seeds)."""
    return random.Random(f"select:{seed}:{rnd}").getrandbits(31)


# ----------------------------------------------------------------------------------------------
# Progress file


def read_rounds(out: Path) -> list[dict]:
    """The rounds recorded in `out/progress.jsonl` (a torn last line, from a kill mid-write, is
    dropped and cut from the file, so appending goes on from there)."""
    return read_appended_jsonl(out / PROGRESS, "its round is then sampled again")


def append_round(out: Path, record: dict) -> None:
    """Add one round to progress.jsonl, on disk when this returns."""
    with (out / PROGRESS).open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def tallies_of(questions: list[Question], rounds: list[dict]) -> dict[str, Tally]:
    """Per question id, what the recorded rounds found (ids not in `questions` are ignored: a run
    resumed with a smaller `limit`)."""
    tallies = {q.id: Tally() for q in questions}
    for rnd in rounds:
        for qid, flags in rnd["questions"].items():
            if qid in tallies:
                tallies[qid].add(flags)
    return tallies


# ----------------------------------------------------------------------------------------------
# Running


def load_candidates(cfg: SelectConfig) -> list[Question]:
    from searchrl.data.catalog import load_dataset

    questions = load_dataset(cfg.dataset)[: cfg.limit]
    if not questions:
        raise SearchRLError(f"dataset {cfg.dataset!r} holds no questions")
    seen: set[str] = set()
    dupes = [q.id for q in questions if q.id in seen or seen.add(q.id)]
    if dupes:
        raise SearchRLError(
            f"dataset {cfg.dataset!r}: question ids {listing(dupes)} occur more than once; selection keys its progress "
            "by id, so give every question its own id"
        )
    return questions


def _check_resumable(out: Path, cfg: SelectConfig) -> None:
    from searchrl.config import load_config
    from searchrl.eval.resume import check_same_config

    saved = out / "config.yaml"
    if not saved.is_file():
        raise SearchRLError(
            f"{out / PROGRESS} exists but {saved} does not; delete the folder or choose another out"
        )
    first = load_config(SelectConfig, saved)
    check_same_config(
        out, first.model_dump(mode="json"), cfg.model_dump(mode="json"), free=FREE_TO_CHANGE
    )


def run_select(cfg: SelectConfig, backend=None, progress: bool = True) -> dict:
    """Sample what `cfg.out` still lacks, then write the buckets and the report; return the
    summary (`select_report.summary`). `backend` may be given to reuse a loaded model (tests); it
    is built from `cfg.model` otherwise, and only when questions are left."""
    from searchrl.select import report as select_report

    if cfg.out is None:
        raise SearchRLError("no output folder: give --out DIR")
    out = Path(cfg.out)
    check_kind(out, "select")
    questions = load_candidates(cfg)
    claim(out, "select")
    rounds = read_rounds(out)
    if rounds:
        _check_resumable(out, cfg)
    dump_config(cfg, out / "config.yaml")
    tallies = tallies_of(questions, rounds)
    todo = [q for q in questions if not tallies[q.id].done(cfg.max_rollouts)]
    if todo:
        if rounds and progress:
            print(
                f"resuming {out}: {len(questions) - len(todo)} of {len(questions)} questions done",
                flush=True,
            )
        rounds += _sample(cfg, questions, todo, tallies, len(rounds), backend, progress)
    summary = select_report.write_all(cfg, questions, tallies, rounds)
    return summary


def _sample(
    cfg: SelectConfig,
    questions: list[Question],
    todo: list[Question],
    tallies: dict[str, Tally],
    first_round: int,
    backend,
    progress: bool,
) -> list[dict]:
    """Run rounds until every question of `todo` is done; each round goes to progress.jsonl as it ends."""
    from searchrl.metrics import ANSWER_METRICS

    out, cap, metric = Path(cfg.out), cfg.max_rollouts, ANSWER_METRICS.get(cfg.metric)
    agent = build_agent(cfg, backend, run=str(out.resolve()), new_run=first_round == 0)
    announce(cfg)  # once the retriever and model are up: a config they refuse prints its error alone
    engine, bar, new_rounds = agent.engine, None, []
    try:
        if progress:
            from tqdm import tqdm

            bar = tqdm(
                total=len(questions), initial=len(questions) - len(todo), desc="questions", unit="q"
            )
        queue, active, rnd = deque(todo), [], first_round
        while queue or active:
            while queue and len(active) < cfg.questions_per_round:
                active.append(queue.popleft())
            sizes = [min(cfg.rollouts_per_round, cap - tallies[q.id].sampled) for q in active]
            engine.cfg = cfg.rollout.model_copy(update={"seed": round_seed(cfg.seed, rnd)})
            started = time.perf_counter()
            trajs = iter(engine.run([q for q, n in zip(active, sizes) for _ in range(n)], n=1))
            flags = {
                q.id: [
                    int(metric(next(trajs).answer, q.answers) >= cfg.min_score) for _ in range(n)
                ]
                for q, n in zip(active, sizes)
            }
            record = {
                "round": rnd,
                "seconds": round(time.perf_counter() - started, 3),
                "questions": flags,
            }
            append_round(out, record)
            new_rounds.append(record)
            for q in active:
                tallies[q.id].add(flags[q.id])
            finished = [q for q in active if tallies[q.id].done(cap)]
            active = [q for q in active if not tallies[q.id].done(cap)]
            rnd += 1
            if bar is not None:
                bar.update(len(finished))
                counts = _bucket_counts(cfg, questions, tallies)
                bar.set_postfix({b: counts[b] for b in BUCKETS}, refresh=False)
    finally:
        if bar is not None:
            bar.close()
        agent.close()
    return new_rounds


def _bucket_counts(
    cfg: SelectConfig, questions: list[Question], tallies: dict[str, Tally]
) -> dict[str, int]:
    """Finished questions per bucket."""
    counts = dict.fromkeys(BUCKETS, 0)
    for q in questions:
        t = tallies[q.id]
        if t.done(cfg.max_rollouts):
            counts[bucket_of(t.needed(cfg.max_rollouts), cfg.medium_from, cfg.difficult_from)] += 1
    return counts


def select_command(config: str | None, overrides: list[str], flags: dict) -> dict:
    """`searchrl data select`: YAML file, then `--set` overrides, then the explicit flags win."""
    from rich.console import Console
    from rich.markdown import Markdown

    from searchrl.config import flag_overrides, load_config
    from searchrl.select.report import summary_markdown

    cfg = load_config(SelectConfig, config, list(overrides) + flag_overrides(flags, overrides))
    summary = run_select(cfg)
    console = Console()
    markdown = summary_markdown(summary)  # piped: the Markdown itself, whose tables rich would wrap
    console.print(Markdown(markdown) if console.is_terminal else markdown, markup=False, highlight=False)
    console.print(
        f"wrote {', '.join(b + '.jsonl' for b in BUCKETS)}, summary.md, summary.json, histogram.png to {cfg.out}",
        highlight=False,
    )
    return summary
