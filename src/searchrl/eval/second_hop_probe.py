"""`searchrl eval second-hop`: where a model's second hop fails, measured on the multi-hop
questions of an evaluation config (docs/results.md#multi-hop-where-the-second-hop-fails).

1. The retrieval ceiling (`eval.second_hop.hop_ranks`): each supporting passage's rank for its
   title as the query and for the question as the query.
2. The next step: the gold first search (`rollout.gold`: the first supporting passage's title as
   the query, in the SFT trajectories' words "First I search for Q.") and the documents it
   returns are written after the prompt, then the model goes on greedily as in `eval run`, with
   the searches and policy tokens that remain; its next step is read by
   `eval.second_hop.next_step`.

The continuation starts from the text prompt + first turn + documents, encoded as one prompt; the
record says whether those ids equal the engine's own (each piece encoded on its own).

3. With agent runs (`--run`): how their own queries name the entities (`eval.second_hop.copy_rows`).

Writes `OUT/second_hop.md` (the tables) and `OUT/second_hop.jsonl` (a record per question).
Tag protocols only: the probe writes the first turn as text.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path

from searchrl.config import dump_config, flag_overrides, load_config
from searchrl.data.types import Question
from searchrl.datatext import data
from searchrl.errors import SearchRLError
from searchrl.eval.config import EvalConfig
from searchrl.eval.second_hop import (
    COPY_HEADER,
    NEXT_HEADER,
    ceiling_rows,
    copy_rows,
    hop_ranks,
    next_step,
    next_step_rows,
)
from searchrl.protocols.format_rules import final_answer
from searchrl.protocols.tagged import TagProtocol
from searchrl.rollout.agent import Agent, build_agent
from searchrl.rollout.config import RolloutConfig
from searchrl.runkind import claim
from searchrl.tables import markdown_table

TYPES = ("bridge-2hop", "bridge-3hop", "inference")
KS = (1, 3, 5)
MIN_LEFT = 16  # policy tokens the continuation needs at least: a short query or answer


def probe(agent: Agent, rollout: RolloutConfig, questions: Sequence[Question], hops: int = 1) -> tuple[list[dict], int]:
    """(a record per question whose first `hops` supporting passages gold queries find, questions
    left out): the model's continuation after those gold searches, read by `next_step` against
    the next supporting passage (none after the last: the step can only answer right or not).
    `rollout`: the settings of a whole rollout; the continuation gets the searches left (at least
    one) and the policy tokens the written turns left."""
    from searchrl.rollout.engine import RolloutEngine
    from searchrl.rollout.gold import gold_paths, support_passages

    protocol, backend = agent.protocol, agent.backend
    first_hops = [dataclasses.replace(q, supporting_ids=q.supporting_ids[:hops]) for q in questions]
    paths = gold_paths(first_hops, agent.retriever, rollout.k, hops)
    kept = [(q, p) for q, p in zip(questions, paths) if p is not None]
    nexts = {q.supporting_ids[hops] for q, _ in kept if len(q.supporting_ids) > hops}
    titles = {pid: p.title for pid, p in support_passages(agent.retriever, nexts).items()}
    turns = [protocol.script_texts(path.script())[:hops] for _, path in kept]
    written = max((sum(len(backend.encode(t)) for t in texts) for texts in turns), default=0)
    if rollout.max_new_tokens - written < MIN_LEFT:  # the model needs room for a query or an answer
        raise SearchRLError(f"the written turns take up to {written} policy tokens of rollout.max_new_tokens="
                            f"{rollout.max_new_tokens}, leaving the model fewer than {MIN_LEFT}: raise it")
    engine = RolloutEngine(backend, agent.retriever, protocol, rollout.model_copy(
        update={"max_searches": max(rollout.max_searches - hops, 1), "max_new_tokens": rollout.max_new_tokens - written}))
    prompts, seen, same = [], [], []
    for (q, path), texts in zip(kept, turns):
        # The question and passages are data (searchrl.datatext): marked, so that the engine
        # tokenizes this prompt as it inserts documents blocks, without control tokens from them.
        prompt = protocol.prompt(data(q.question), backend.tokenizer)
        ids, docs = backend.encode(prompt, prompt=True), []
        for text, (_, passages) in zip(texts, path.searches):
            doc_ids, block = protocol.documents(passages, backend)
            prompt += text + protocol.marked_documents(passages)
            ids += backend.encode(text) + doc_ids
            docs.append(block)
        prompts.append(prompt)
        seen.append("\n".join(docs))
        same.append(backend.encode(prompt, prompt=True) == ids)
    trajs = engine.run([q for q, _ in kept], prompts)
    out = []
    for (q, path), docs, t, exact in zip(kept, seen, trajs, same):
        nxt = q.supporting_ids[hops] if len(q.supporting_ids) > hops else None
        query = t.queries[0] if t.queries else None
        found = bool(t.retrieved_ids) and nxt in t.retrieved_ids[0]
        final = final_answer(t, protocol, cut_short=True)
        title = titles.get(nxt, "")
        step = next_step(q, path.searches[-1][0], docs, title, query, found, None if query is not None else final, final)
        out.append({"id": q.id, "type": q.type, "question": q.question, "answers": list(q.answers),
                    "written_queries": [s[0] for s in path.searches], "written_docs": docs, "next_title": title,
                    "continuation": "".join(s.text for s in t.segments), "query": query, "final": final,
                    "prompt_ids_exact": exact, **dataclasses.asdict(step)})
    return out, len(questions) - len(kept)


def second_hop_command(config: str | None, overrides: Sequence[str], flags: dict, types: Sequence[str] | None,
                       out: str, runs: Sequence[str] = (), run_probe: bool = True, hops: int = 1) -> str:
    """Run the measurements on `types` of the config's questions; write and return the Markdown.
    `runs`: `eval run` folders of agents on those questions, whose own queries are read for the
    entities (`copy_rows`); `run_probe` False: no model, the retrieval and query tables only;
    `hops`: gold searches written before the model goes on."""
    from searchrl.data.catalog import load_dataset
    from searchrl.eval.second_hop import NextStep
    from searchrl.rollout.gold import support_passages

    if Path(out).exists() and not Path(out).is_dir():
        raise SearchRLError(f"--out {out} is a file; give a folder for second_hop.md and second_hop.jsonl")
    cfg = load_config(EvalConfig, config, list(overrides) + flag_overrides(flags, overrides))
    types = tuple(types or TYPES)
    questions = load_dataset(cfg.dataset)[: cfg.limit]
    chosen = [q for q in questions if q.type in types and len(q.supporting_ids) >= 2]
    if not chosen:
        raise SearchRLError(f"no question of type {', '.join(types)} with two or more supporting passages in "
                            f"the first {len(questions)} of {cfg.dataset}")
    agent_records = {run: _records(Path(run), {q.id for q in chosen}) for run in runs}
    folder = Path(out)
    claim(folder, "second-hop")
    started = time.perf_counter()
    retriever = cfg.retrieval.open()
    try:
        ids = {i for q in chosen for i in q.supporting_ids}
        titles = {pid: p.title for pid, p in support_passages(retriever, ids).items()}
        ranks = hop_ranks(chosen, titles, retriever, max(KS))
        records, left_out = [], 0
        if run_probe:
            agent = build_agent(cfg, retriever=retriever)
            try:
                if cfg.protocol.format != TagProtocol.format:
                    raise SearchRLError("eval second-hop writes the first search as text: use a tag protocol (protocol.format: tags)")
                records, left_out = probe(agent, cfg.rollout, chosen, hops)
            finally:
                agent.close()
    finally:
        retriever.close()
    header, rows = ceiling_rows(ranks, KS)
    parts = [f"{len(chosen)} questions ({', '.join(types)}) of the first {len(questions)} of {cfg.dataset}; model "
             f"{cfg.model}, k = {cfg.rollout.k}, {time.perf_counter() - started:.0f} s.\n\n"
             "Retrieval ceiling: each supporting passage in the top k for its title, and for the question\n\n"
             + markdown_table(header, rows, [h not in ("type", "hop") for h in header])]
    if run_probe:
        steps = [NextStep(**{f.name: r[f.name] for f in dataclasses.fields(NextStep)}) for r in records]
        exact = sum(r["prompt_ids_exact"] for r in records)
        parts.append(f"After the first {hops} gold search(es) ({len(records)} questions; {left_out} whose passages no gold "
                     f"query finds at k = {cfg.rollout.k} left out; continuation ids equal the engine's for {exact}):\n\n"
                     + markdown_table(NEXT_HEADER, next_step_rows(steps), [h != "type" for h in NEXT_HEADER]))
    for run, recs in agent_records.items():
        parts.append(f"The entities in the queries of {run} ({len(recs)} of these questions):\n\n"
                     + markdown_table(COPY_HEADER, copy_rows(recs, titles), [h != "type" for h in COPY_HEADER]))
    text = "\n".join(parts)
    (folder / "second_hop.md").write_text(text, encoding="utf-8")
    if run_probe:
        with open(folder / "second_hop.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    dump_config(cfg, folder / "config.yaml")
    print(text)
    return text


def _records(folder: Path, ids: set[str]) -> list[dict]:
    """The predictions.jsonl records of `ids` in an `eval run` folder of an agent."""
    from searchrl.data.textio import iter_json_lines

    path = folder / "predictions.jsonl"
    if not path.is_file():
        raise SearchRLError(f"--run {folder}: no predictions.jsonl there; give a folder written by `searchrl eval run --out`")
    found = [rec for _, rec in iter_json_lines(path) if rec.get("id") in ids]
    if not found:
        raise SearchRLError(f"--run {folder}: answered none of the questions probed (same --dataset and --limit?)")
    if any(rec.get("method") != "agent" for rec in found):
        raise SearchRLError(f"--run {folder}: not an agent's run; only an agent writes its own queries")
    return found
