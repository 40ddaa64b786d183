"""`searchrl eval run`: answer a dataset with one method and write predictions, metrics and config.

Three methods, all recorded as `Trajectory`s so that one file format serves every run:

- `agent`  — the search-interleaved rollout of the `RolloutEngine` (greedy): the model decides
  when and what to search; the prediction is its last complete answer block.
- `rag`    — the pipeline retrieves the top-k passages for the question ONCE, puts them in the
  prompt, and the model answers greedily. The trajectory records that one retrieval as its query
  (`queries == [question]`, `n_searches == 1`, `retrieved_ids == [top-k ids]`); the passages are
  part of the prompt, not of the response, so no token of it has loss mask 0.
- `direct` — no retrieval; the same answer prompt without passages.

The rag/direct prompts (`searchrl.eval.answer_prompts`) show worked examples of their own and end
with the opening answer tag, so whatever the model writes up to the closing tag is its answer;
generation stops there or where the model ends its turn. When it never closes the tag, the first
non-empty line it wrote before the turn end is the prediction; its format is OK only if that line
was all it wrote before ending its turn (one line, then `User:` or EOS). The agent
has no such fallback beyond an answer block the budget cut short (first line after its last
opening answer tag); a rollout without any answer tag predicts None (scored 0).

The format check of the rewards is reported for every method. Rag/direct responses hold no think
block, so they are checked as if an empty one had been closed right before the answer: every other
rule (one closed non-empty answer, nothing garbled, no protocol tags) applies unchanged.

With a judge (`judge.url`, `--judge-url`) every prediction gets an ACC_L verdict (`judge` in its
record) as its batch finishes; `metrics.json` then holds `acc_l` and what the judge and web search
cost (`searchrl.eval.spending`).

Output folder: `predictions.jsonl`, `metrics.json`, `metrics.md`, `config.yaml`, and for live web
search `web_record/`, what every search and page read gave (`searchrl.retrieval.web.record`;
`--web-replay` answers from it). Predictions are written batch by batch as they finish, so
`--resume` continues a run that was stopped (`searchrl.eval.resume`); batches are fixed slices of
the question list, so a resumed run generates exactly what an uninterrupted one would have.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from searchrl.config import dump_config
from searchrl.data.trajectory import Segment, Trajectory
from searchrl.data.types import Passage, Question
from searchrl.datatext import data, data_passage
from searchrl.errors import SearchRLError
from searchrl.eval import result_names as rn
from searchrl.eval import resume as saved
from searchrl.eval.answer_prompts import (
    answer_prompt,
    answer_protocol,
    closed_response,
)
from searchrl.eval.config import EvalConfig
from searchrl.eval.multihop import HEADER, right_aligned, type_rows
from searchrl.eval.spending import Spending, judge_records
from searchrl.eval.summary import METRICS_HEADER, metrics_markdown, metrics_rows, summarize
from searchrl.profiles import announce
from searchrl.protocols.base import Protocol
from searchrl.protocols.tagged import TagProtocol
from searchrl.protocols.tags import get_tags
from searchrl.retrieval.base import Retriever
from searchrl.retrieval.web.record import RECORD_DIR
from searchrl.rollout.agent import Agent, build_agent
from searchrl.runinfo import recorded_run, retrieval_record
from searchrl.runkind import claim
from searchrl.runlock import RunLock
from searchrl.tables import Column, print_table

# ----------------------------------------------------------------------------------------------
# Retrievers


class NoRetriever(Retriever):
    """Stands in where nothing may be retrieved (direct answers, rag's generation step)."""

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        raise RuntimeError("this evaluation method performs no search during generation")


# ----------------------------------------------------------------------------------------------
# Predictions and format


def predict(traj: Trajectory, method: str, protocol: Protocol) -> str | None:
    """The prediction of one trajectory (module docstring: an agent's answer the budget cut is its
    first line; rag/direct fall back to the first line)."""
    from searchrl.protocols.format_rules import final_answer

    if method == "agent":
        return final_answer(traj, protocol, cut_short=True)
    return protocol.answer(traj.segments, opened=True)


def format_verdict(traj: Trajectory, method: str, protocol: Protocol, require_think: bool = True):
    """The rewards' format check; rag/direct as if an empty think block preceded the answer, and
    with a one-line answer the model ended its turn after taken as closed (`closed_response`)."""
    from searchrl.protocols.format_rules import check_segments

    if method == "agent":
        return protocol.check_format(traj, require_think=require_think)
    tags = protocol.tags
    response = closed_response("".join(s.text for s in traj.segments), traj.stop_reason, tags)  # all policy text
    segments = [Segment(tags.think_close + tags.answer_open + response, "policy")]
    return check_segments(segments, tags, question=traj.question, think_opened_in_prompt=True, require_think=require_think)


# ----------------------------------------------------------------------------------------------
# Running


def generate(cfg: EvalConfig, questions: Sequence[Question], agent: Agent) -> list[Trajectory]:
    """One trajectory per question with `cfg.method`."""
    if cfg.method == "agent":
        return agent.engine.run(questions)
    protocol = scoring_protocol(cfg, agent)
    rollout = cfg.rollout.model_copy(update={"max_searches": 0, "max_new_tokens": cfg.answer_max_new_tokens})
    found: list[list[Passage]] | None = None
    if cfg.method == "rag":
        found = []
        for start in range(0, len(questions), rollout.batch_size):
            batch = questions[start : start + rollout.batch_size]
            found.extend(agent.retriever.search([q.question for q in batch], rollout.k))
    # Questions and passages are data (searchrl.datatext): a page or passage holding a control
    # token's text is tokenized as that text, never as the token.
    prompts = [
        answer_prompt(data(q.question), [data_passage(p) for p in found[i]] if found is not None else None,
                      protocol.tags, protocol.template, agent.backend.tokenizer)
        for i, q in enumerate(questions)
    ]
    answering = build_agent(cfg, agent.backend, NoRetriever(), protocol=answer_protocol(protocol), rollout=rollout)
    trajs = answering.engine.run(questions, prompts)
    for i, (q, t) in enumerate(zip(questions, trajs)):
        t.answer = predict(t, cfg.method, protocol)
        if found is not None:
            t.queries, t.retrieved_ids, t.n_searches = [q.question], [[p.id for p in found[i]]], 1
    return trajs


def scoring_protocol(cfg: EvalConfig, agent: Agent) -> Protocol:
    """The protocol answers are read and checked by: the agent's; for rag/direct under a
    tool-call config, its tags in chat form (the answer prompts are tag prompts)."""
    if cfg.method == "agent" or cfg.protocol.format == TagProtocol.format:
        return agent.protocol
    return TagProtocol(get_tags(cfg.protocol.tags), "chat", cfg.protocol.doc_style)


def records(cfg: EvalConfig, questions: Sequence[Question], trajs: Sequence[Trajectory],
            protocol: Protocol) -> list[dict]:
    """One predictions.jsonl record per trajectory: the trajectory plus gold, prediction, scores."""
    from searchrl.metrics import answer_scores

    out = []
    for q, t in zip(questions, trajs):
        prediction = predict(t, cfg.method, protocol)
        verdict = format_verdict(t, cfg.method, protocol, cfg.require_think)
        rec = t.to_dict(tokens=cfg.dump_tokens)
        rec.update(
            id=q.id,
            answers=list(q.answers),
            prediction=prediction,
            method=cfg.method,
            scores=answer_scores(prediction, q.answers),
            format_ok=verdict.ok,
            format_failed=list(verdict.failed),
            supporting_ids=list(q.supporting_ids),
            type=q.type,
            n_policy_tokens=sum(t.loss_mask),
        )
        out.append(rec)
    return out


def run_eval(cfg: EvalConfig, progress: bool = True, backend=None, resume: bool = False, overwrite: bool = False) -> dict:
    """Run `cfg` into `cfg.out`: predictions appended batch by batch, then metrics.json/.md;
    return the metrics. `resume`: keep the predictions an interrupted run of the same config left
    there and answer only the rest. A folder that holds a run is refused unless `resume` or
    `overwrite` (start over). `backend` may be given to reuse a loaded model (tests, sweeps); it
    is built from `cfg.model` otherwise, and only when questions are left.

    The folder is locked while the run writes (`RunLock`), and an earlier run's files are
    replaced only once the retriever, the judge and the model are up: a mistake loses nothing."""
    from searchrl.data.catalog import load_dataset

    out = saved.output_dir(cfg.out)
    questions = load_dataset(cfg.dataset)
    if cfg.limit is not None:
        questions = questions[: cfg.limit]
    if not questions:
        raise SearchRLError(f"dataset {cfg.dataset!r} holds no questions")
    with RunLock(out):
        claim(out, "eval", "--resume" if resume else "--out")  # a training run's folder is never overwritten
        if resume:
            recs, spent = saved.finished_records(out, questions), saved.spent_so_far(out)
        else:
            if not overwrite:
                saved.refuse_existing(out)
            recs, spent = [], {rn.SECONDS: 0.0}
        with recorded_run(out, "eval run", extra=retrieval_record(cfg.retrieval)):
            return _run_in(cfg, questions, out, recs, spent, backend, resume, progress)


def _run_in(cfg: EvalConfig, questions: Sequence[Question], out: Path, recs: list[dict], spent: dict, backend, resume: bool,
            progress: bool) -> dict:
    """The rest of `run_eval`, in its locked folder, recorded (`run_info.json`, `console.log`)."""
    if len(recs) < len(questions):
        with _services(cfg, questions, out, backend, fresh=not resume) as services:
            announce(cfg)  # once the services are up: a config they refuse prints its error alone
            if not resume:
                saved.start_fresh(out)
            dump_config(cfg, out / "config.yaml")
            spent = _answer_the_rest(cfg, questions, recs, spent, *services, progress)
    metrics = summarize(cfg, recs, spent)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    (out / "metrics.md").write_text(metrics_markdown(metrics))
    saved.finish(out)
    return metrics


@contextlib.contextmanager
def _services(cfg: EvalConfig, questions: Sequence[Question], out: Path, backend, fresh: bool):
    """(judge, agent) for generating into `out`, each checked as it opens, in the order of how
    fast they fail: the judge, then the agent's retriever (the server) in a second, its model in
    minutes; then whether an agent's rollouts over `questions` fit the model's context. `fresh`: a
    new run, whose web search budget starts from zero."""
    with contextlib.ExitStack() as stack:
        judge = None
        if cfg.judge.url is not None:
            judge = stack.enter_context(contextlib.closing(cfg.judge.build()))
        agent = stack.enter_context(contextlib.closing(
            build_agent(cfg, backend, search=cfg.method != "direct", run=str(out.resolve()), new_run=fresh,
                        web_record=str(out / RECORD_DIR))
        ))
        if cfg.method == "agent":
            from searchrl.rollout.bounds import check_rollout_fits

            check_rollout_fits(cfg.rollout, agent.protocol, agent.backend.tokenizer, agent.backend.max_context,
                               questions, agent.retriever, cfg.retrieval.index)
        yield judge, agent


def _answer_the_rest(cfg: EvalConfig, questions: Sequence[Question], recs: list[dict], spent: dict, judge, agent: Agent,
                     progress: bool) -> dict:
    """Generate (and judge) the questions after `recs` batch by batch, appending each batch's
    records to `recs` and to predictions.jsonl; return what all runs so far spent."""
    out, size = Path(cfg.out), cfg.rollout.batch_size
    tally = Spending(spent, judge, agent.retriever)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(questions), initial=len(recs), desc="questions", unit="q")
    try:
        # A batch partly written before a stop runs whole again: the same batch, the same tokens.
        for start in range(len(recs) // size * size, len(questions), size):
            batch = questions[start : start + size]
            started = time.perf_counter()
            trajs = generate(cfg, batch, agent)
            tally.seconds += time.perf_counter() - started
            new = records(cfg, batch, trajs, scoring_protocol(cfg, agent))[len(recs) - start :]
            if judge is not None:
                judge_records(judge, new)
            saved.append_records(out, new)
            spent = tally.totals()
            saved.save_progress(out, spent)
            recs.extend(new)
            if bar is not None:
                bar.update(len(new))
    finally:
        if bar is not None:
            bar.close()
    return spent


def eval_command(config: str | None, overrides: Sequence[str], flags: dict, as_json: bool = False, resume: str | None = None,
                 overwrite: bool = False) -> dict:
    """`searchrl eval run`: YAML file, then `--set` overrides, then the explicit flags win; `flags`
    are keyed by their config keys (`rollout.k`). `resume`: the folder of an interrupted run,
    whose config.yaml is the YAML file unless one is given; the result must equal that config.
    `overwrite`: start over in a folder that holds a run. Ctrl-C exits 130 with the command that
    continues the run."""
    from searchrl.config import flag_overrides, load_config

    if resume is not None and overwrite:
        raise SearchRLError("--resume continues a run and --overwrite starts it over: give one of them")
    from searchrl.runinfo import note_overrides

    note_overrides(list(overrides) + flag_overrides(flags, overrides))
    if resume is None:
        cfg = load_config(EvalConfig, config, list(overrides) + flag_overrides(flags, overrides))
    else:
        cfg = saved.resumed_config(EvalConfig, Path(resume), config, list(overrides), flags)
    try:
        metrics = run_eval(cfg, progress=not as_json, resume=resume is not None, overwrite=overwrite)
    except KeyboardInterrupt:
        print(f"\n{saved.interrupted(Path(cfg.out))}", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    if as_json:
        print(json.dumps(metrics))
        return metrics
    from rich.console import Console

    console = Console()
    columns = [Column(METRICS_HEADER[0], wrap=True), Column(METRICS_HEADER[1], right=True, wrap=True)]
    print_table(console, columns, metrics_rows(metrics), keep=2)  # a value without its label says nothing
    if by_type := type_rows(metrics):  # multi-hop behaviour per question type (eval/multihop.py)
        console.print()
        print_table(console, [Column(h, right=r) for h, r in zip(HEADER, right_aligned(HEADER))], by_type)
    record = f", {RECORD_DIR}/" if (Path(cfg.out) / RECORD_DIR).is_dir() else ""
    console.print(f"wrote predictions.jsonl, metrics.json, metrics.md, config.yaml{record} to {cfg.out}", highlight=False, markup=False)
    return metrics
