"""`searchrl demo`: the whole method on the embedded default, end to end on a laptop CPU.

1. build the toy world and its BM25 index (cached after the first run);
2. serve the index over HTTP in-process; every search of the demo goes through that server;
3. evaluate the untrained SmolLM2 on toy-world test questions: agent (search-interleaved) and rag;
4. train Stage 1 then Stage 2 (`configs/demo-cpu.yaml`) into `OUT/train`;
5. evaluate the trained policy as an agent (the rag baseline is the untrained model's: the
   baselines' worked examples made it the slower eval, and the demo has 20 minutes);
6. write `OUT/report.md` with the before/after table, the stage figures and the training curves.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Sequence

from pydantic import Field
from rich.console import Console

from searchrl import metric_names as mn
from searchrl import runinfo
from searchrl.config import StrictModel, load_config
from searchrl.errors import SearchRLError
from searchrl.eval import result_names as rn
from searchrl.runkind import check_kind, claim

console = Console()


class DemoConfig(StrictModel):
    """What the demo runs; the training recipe itself lives in a train config file."""

    out: str = Field("runs/demo", description="Folder for everything the demo writes.")
    train_config: str = Field(
        "demo-cpu", description="Training recipe: a packaged config name (demo-cpu) or a YAML path."
    )
    dataset: str = Field("toyworld:test", description="Questions evaluated before and after training.")
    eval_limit: int = Field(20, ge=1, description="How many of those questions (the first N).")
    eval_max_new_tokens: int = Field(160, ge=16, description="Policy tokens per evaluated question.")
    train: bool = Field(
        True, description="Train both stages and evaluate again; False stops after the untrained evaluation."
    )
    resume: bool = Field(
        False, description="Continue a stopped demo in `out`: finished evaluations are kept, an interrupted one "
        "goes on, training resumes from its newest checkpoint.",
    )


def check_out(cfg: DemoConfig) -> None:
    """A fresh demo starts only in a folder that holds no demo (an earlier run is never overwritten);
    `resume` needs one to continue."""
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise SearchRLError(f"--out {out} is a file; give a folder for the demo to write into")
    earlier = sorted(p.name for p in (out.iterdir() if out.is_dir() else ()) if p.name == "train" or p.name.startswith("eval-"))
    check_kind(out, "demo")  # a training run or an evaluation is never written into
    if earlier and not cfg.resume:
        raise SearchRLError(
            f"{out} already holds a demo ({', '.join(earlier)}): continue it with `searchrl demo --resume --out {out}`, "
            "or choose another --out (or remove that folder to start over)"
        )
    claim(out, "demo")


def _evaluate(
    label: str, model: str, method: str, train_cfg, cfg: DemoConfig, out: Path, backend, retrieval
) -> Path:
    """Evaluate `model` as it trained: the training run's protocol, retrieval and rollout settings,
    decoded greedily within the demo's evaluation budget."""
    from searchrl.eval.run import EvalConfig, run_eval
    from searchrl.rollout.config import EVAL_ROLLOUT

    ecfg = EvalConfig(
        method=method,
        model=model,
        dataset=cfg.dataset,
        limit=cfg.eval_limit,
        protocol=train_cfg.protocol,
        rollout=train_cfg.rollout.model_copy(
            update={"greedy": True, "max_new_tokens": cfg.eval_max_new_tokens, "batch_size": EVAL_ROLLOUT["batch_size"]}
        ),
        retrieval=retrieval,
        require_think=train_cfg.stage2.reward.require_think,  # the format rules the model trained on
        out=str(out / f"eval-{label}-{method}"),
    )
    console.print(f"[bold]evaluate[/] {label} model, method {method}, {cfg.eval_limit} questions of {cfg.dataset}")
    resume = cfg.resume and (Path(ecfg.out) / "config.yaml").is_file()
    metrics = run_eval(ecfg, progress=True, backend=backend, resume=resume)
    console.print(
        f"  cover-EM {metrics['cover_em']:.1%}  F1 {metrics['f1']:.1%}  searched {metrics['search_rate']:.0%}"
        f"  format ok {metrics['format_ok_rate']:.0%}"
        + (f"  echo {metrics[mn.QUERY_ECHO_RATE]:.0%}" if metrics.get(mn.QUERY_ECHO_RATE) is not None else "")
        + f"  ({metrics['seconds']:.0f} s)"
    )
    return Path(ecfg.out)


def stage_summary(records: Sequence[dict]) -> dict:
    """The figures the demo is judged by, read from `metrics.jsonl` records.

    Stage 1: search rate and format-ok rate, first step vs last step (and the best reached);
    Stage 2: mean answer F1 of the first quarter of steps vs the last quarter; an SFT stage: its
    loss at the first and last step.
    """
    out: dict = {}
    for stage in (1, 2):  # an SFT stage (configs/sft-demo-cpu.yaml) has no rollouts: its loss
        sft = [r for r in records if r[mn.STAGE] == stage and mn.SFT_LOSS in r]
        if sft:
            out[f"sft{stage}"] = {
                "steps": len(sft),
                "loss_first": sft[0][mn.SFT_LOSS],
                "loss_last": sft[-1][mn.SFT_LOSS],
            }
    records = [r for r in records if mn.SFT_LOSS not in r]
    s1 = [r for r in records if r[mn.STAGE] == 1]
    if s1:
        out["stage1"] = {
            "steps": len(s1),
            "search_rate_first": s1[0][mn.SEARCH_RATE],
            "search_rate_last": s1[-1][mn.SEARCH_RATE],
            "search_rate_max": max(r[mn.SEARCH_RATE] for r in s1),
            "format_ok_first": s1[0][mn.FORMAT_OK],
            "format_ok_last": s1[-1][mn.FORMAT_OK],
        }
    s2 = [r for r in records if r[mn.STAGE] == 2]
    if s2:
        q = max(1, len(s2) // 4)
        out["stage2"] = {
            "steps": len(s2),
            "answer_f1_first_quarter": sum(r[mn.ANSWER_F1] for r in s2[:q]) / q,
            "answer_f1_last_quarter": sum(r[mn.ANSWER_F1] for r in s2[-q:]) / q,
            "format_ok_first_quarter": sum(r[mn.FORMAT_OK] for r in s2[:q]) / q,
            "format_ok_last_quarter": sum(r[mn.FORMAT_OK] for r in s2[-q:]) / q,
        }
    return out


MULTIHOP_TYPES = ("bridge-2hop", "bridge-3hop", "inference")


def verdict_markdown(eval_dirs: Sequence[Path]) -> list[str]:
    """The trained agent against the untrained rag baseline on the demo's questions: EM and its
    paired bootstrap interval (`searchrl eval by-type`), said in words, so that a few questions'
    difference is not read as a result; nothing when either run is missing."""
    from searchrl.eval.by_type import by_type, read_run

    named = {p.name: p for p in eval_dirs}
    if "eval-trained-agent" not in named or "eval-untrained-rag" not in named:
        return []
    result = by_type([read_run("agent", named["eval-trained-agent"]), read_run("rag", named["eval-untrained-rag"])],
                     baseline="rag")
    agent, rag, diff = result.scores["em"]["agent"], result.scores["em"]["rag"], result.diffs["em"]["agent"]
    n = result.types["all"]
    d = diff["all"]
    if d.low > 0:
        said = "The trained agent is ahead: the interval is above 0."
    elif d.high < 0:
        said = "Rag is ahead: the interval is below 0; here training did not beat retrieval in the prompt."
    else:
        said = f"The interval holds 0: {n} questions cannot tell them apart."
    lines = [
        "## Trained agent against rag",
        "",
        f"EM on these {n} questions: trained agent {agent['all'].cell()} %, untrained rag {rag['all'].cell()} % "
        f"(95 % bootstrap intervals). Difference: {100 * d.mean:+.1f} points, paired 95 % interval "
        f"[{100 * d.low:+.1f}, {100 * d.high:+.1f}]. {said}",
    ]
    lines += echo_lines(named)
    hops = [t for t in MULTIHOP_TYPES if t in result.types]
    if hops:
        cells = ", ".join(f"{t} (n={result.types[t]}) {agent[t].mean:.0%} vs {rag[t].mean:.0%}" for t in hops)
        lines.append(f"Questions that need a second hop, EM agent vs rag: {cells}.")
    lines += [
        "Every method on 200 questions, and the multi-hop recipe that learns the second hop (`searchrl train "
        "--config multihop-cpu`, ~35 min on 2 cores), is in the docs' results page, section *Training for the second hop*.",
        "",
    ]
    return lines


def echo_lines(named: dict[str, Path]) -> list[str]:
    """The agents' echo share (`query_echo_rate`: the answer is the agent's only query, searched
    and answered whatever came back) beside their EM, from the evaluations' metrics.json."""
    cells = []
    for label in ("untrained", "trained"):
        path = named.get(f"eval-{label}-agent", Path("-")) / "metrics.json"
        m = json.loads(path.read_text()) if path.is_file() else {}
        if m.get(mn.QUERY_ECHO_RATE) is not None:
            cells.append(f"{label} agent {round(m[mn.QUERY_ECHO_RATE] * m[rn.N])} of {m[rn.N]} (EM {100 * m[rn.EM]:.1f} %)")
    return [f"Echo, the answer is the agent's only query: {', '.join(cells)}."] if cells else []


def report_markdown(eval_dirs: Sequence[Path], summary: dict, plots: Sequence[Path], out: Path, seconds: float) -> str:
    from searchrl.eval.compare import compare_markdown

    lines = ["# searchrl demo report", "", f"Total time: {seconds / 60:.1f} min.", ""]
    lines += ["## Before and after training", "", compare_markdown(eval_dirs).strip(), ""]
    lines += verdict_markdown(eval_dirs)
    if "stage1" in summary:
        s = summary["stage1"]
        lines += [
            "## Stage 1 (learn to call search)",
            "",
            f"- steps: {s['steps']}",
            f"- share of rollouts that search: {s['search_rate_first']:.2f} at the first step -> "
            f"{s['search_rate_last']:.2f} at the last (max {s['search_rate_max']:.2f})",
            f"- format-ok rate: {s['format_ok_first']:.2f} -> {s['format_ok_last']:.2f}",
            "",
        ]
    if "stage2" in summary:
        s = summary["stage2"]
        lines += [
            "## Stage 2 (learn to use the results)",
            "",
            f"- steps: {s['steps']}",
            f"- mean answer F1, first quarter of steps -> last quarter: "
            f"{s['answer_f1_first_quarter']:.3f} -> {s['answer_f1_last_quarter']:.3f}",
            f"- format-ok rate, first quarter -> last quarter: "
            f"{s['format_ok_first_quarter']:.2f} -> {s['format_ok_last_quarter']:.2f}",
            "",
        ]
    for stage in (1, 2):
        if f"sft{stage}" in summary:
            s = summary[f"sft{stage}"]
            lines += [
                f"## Stage {stage} (supervised fine-tuning on gold trajectories)",
                "",
                f"- steps: {s['steps']}",
                f"- loss per policy token: {s['loss_first']:.3f} at the first step -> {s['loss_last']:.3f} at the last",
                "",
            ]
    if plots:
        lines += ["## Training curves", ""]
        lines += [f"![{p.stem}]({p.relative_to(out).as_posix()})" for p in plots if p.name == "training_curves.png"]
        lines += [""]
    return "\n".join(lines)


def _size(retriever) -> int | None:
    try:
        return len(retriever)
    except TypeError:
        return None


def run_demo(cfg: DemoConfig, overrides: Sequence[str] = ()) -> Path:
    """Run the demo; `overrides` are key=value pairs for the training config. Returns OUT
    (recorded: `run_info.json`, `console.log`)."""
    started = time.perf_counter()
    check_out(cfg)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    runinfo.note_overrides(list(overrides))
    with runinfo.recorded_run(out, "demo", extra={"demo": cfg.model_dump(mode="json")}):
        return _run_demo(cfg, overrides, out, started)


def _run_demo(cfg: DemoConfig, overrides: Sequence[str], out: Path, started: float) -> Path:
    from searchrl.data.catalog import load_dataset
    from searchrl.eval.plots import plot_run
    from searchrl.retrieval import open_retriever
    from searchrl.retrieval.server import serve_in_background
    from searchrl.rl.checkpoint import latest_checkpoint
    from searchrl.rl.config import TrainConfig
    from searchrl.rl.trainer import train
    from searchrl.rollout.agent import load_backend
    from searchrl.runlog import read_metrics

    train_cfg = load_config(TrainConfig, cfg.train_config, list(overrides))
    index_name = train_cfg.retrieval.index or "toyworld"

    console.rule("1. toy world and index")
    questions = load_dataset(cfg.dataset)
    retriever = open_retriever(index_name)
    console.print(f"{len(questions)} questions in {cfg.dataset}; index {index_name!r} ready")

    console.rule("2. retrieval server")
    with serve_in_background(retriever) as url:
        console.print(f"serving {index_name!r} at {url} (POST /search, /queries, /retrieve; GET /health)")
        runinfo.note_served(url, {"index": index_name, "kind": getattr(retriever, "kind", None),
                                  "passages": _size(retriever)})
        served = train_cfg.retrieval.model_copy(update={"index": None, "url": url})
        # SFT's gold trajectories list the index's passages, which a server cannot: an SFT recipe
        # (configs/sft-demo-cpu.yaml) trains on the local index; evaluation still goes through the server.
        sft = "sft" in (train_cfg.stage1.kind, train_cfg.stage2.kind)
        train_cfg = train_cfg.model_copy(
            update={"out": str(out / "train"), "retrieval": train_cfg.retrieval if sft else served}
        )

        console.rule("3. the untrained model")
        backend = load_backend(train_cfg)
        eval_dirs = [
            _evaluate("untrained", train_cfg.model, method, train_cfg, cfg, out, backend, served)
            for method in ("agent", "rag")
        ]
        backend.close()

        summary: dict = {}
        plots: list[Path] = []
        if cfg.train:
            console.rule("4. training: Stage 1 then Stage 2")
            run_dir = train(train_cfg, resume=out / "train" if cfg.resume and (out / "train" / "config.yaml").is_file() else None)
            final = latest_checkpoint(run_dir)
            if final is None:
                raise SearchRLError(f"training wrote no checkpoint under {run_dir}")
            console.rule("5. the trained model")
            trained = load_backend(train_cfg.model_copy(update={"model": str(final)}))
            eval_dirs.append(_evaluate("trained", str(final), "agent", train_cfg, cfg, out, trained, served))
            trained.close()
            summary = stage_summary(read_metrics(run_dir))
            plots = plot_run(run_dir, out / "plots")

    seconds = time.perf_counter() - started
    (out / "summary.json").write_text(json.dumps({"seconds": seconds, **summary}, indent=2) + "\n")
    report = report_markdown(eval_dirs, summary, plots, out, seconds)
    (out / "report.md").write_text(report)
    console.rule("6. report")
    console.print(report)
    console.print(f"[bold green]done[/] in {seconds / 60:.1f} min: {out / 'report.md'}")
    return out
