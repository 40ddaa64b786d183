"""Headline results as recorded: `results/recorded.json`, and recording a demo's into it.

The README and the docs state figures a rerun can change (a thread count, a library version or a
seed moves float sums and so the samples). They take them from this registry: each entry says
what was run, when, on which machine, at how many threads and with which library versions, and
holds its figures as fractions or ratios. tests/unit/test_recorded_numbers.py fails when a page
states a headline figure that differs from its entry, so a rerun that changes a number is recorded
here (`python -m searchrl.recorded NAME RUN_FOLDER` for a demo's folder) and then every page that
states it fails until it says the new figure.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from searchrl.errors import SearchRLError
from searchrl.runinfo import read_info

REGISTRY = Path(__file__).resolve().parents[2] / "results" / "recorded.json"
# The demo's evaluations (folder under its OUT) and the metrics.json keys recorded of each.
_DEMO_EVALS = {
    "untrained_agent": ("eval-untrained-agent", ("em", "f1")),
    "untrained_rag": ("eval-untrained-rag", ("em",)),
    "trained_agent": ("eval-trained-agent", ("em", "f1", "cover_em", "retrieval_recall", "query_echo_rate")),
}
_SHORT = {"retrieval_recall": "support", "query_echo_rate": "echo"}


def load(path: str | Path = REGISTRY) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def figure(name: str, key: str, path: str | Path = REGISTRY) -> float:
    """One recorded figure, e.g. `figure("demo", "trained_agent_em")`."""
    entries = load(path)
    if name not in entries or key not in entries[name]["figures"]:
        raise SearchRLError(f"{path}: no recorded figure {name}.{key}")
    return entries[name]["figures"][key]


def demo_figures(out: str | Path) -> dict[str, float]:
    """The headline figures of a `searchrl demo --out OUT` folder: its summary.json (Stage 1 first
    and last step, Stage 2 first and last quarter) and its three evaluations' metrics.json."""
    out = Path(out)
    summary_path = out / "summary.json"
    if not summary_path.is_file():
        raise SearchRLError(f"{out}: no summary.json; give a folder written by `searchrl demo --out` that trained")
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    s1, s2 = summary.get("stage1", {}), summary.get("stage2", {})
    figures = {
        "stage1_search_first": s1.get("search_rate_first"), "stage1_search_last": s1.get("search_rate_last"),
        "stage1_format_first": s1.get("format_ok_first"), "stage1_format_last": s1.get("format_ok_last"),
        "stage2_f1_first_quarter": s2.get("answer_f1_first_quarter"),
        "stage2_f1_last_quarter": s2.get("answer_f1_last_quarter"),
        "stage2_format_first_quarter": s2.get("format_ok_first_quarter"),
        "stage2_format_last_quarter": s2.get("format_ok_last_quarter"),
    }
    for prefix, (folder, keys) in _DEMO_EVALS.items():
        metrics_path = out / folder / "metrics.json"
        if not metrics_path.is_file():
            raise SearchRLError(f"{metrics_path}: missing; the demo did not finish")
        metrics = json.loads(metrics_path.read_text(encoding="utf-8"))
        figures.update({f"{prefix}_{_SHORT.get(key, key)}": metrics.get(key) for key in keys})
    return {key: value for key, value in figures.items() if value is not None}


def demo_entry(out: str | Path, what: str, machine: str) -> dict:
    """A registry entry for a demo folder; date, threads and library versions from its run_info.json."""
    info = read_info(Path(out)) or {}
    libraries = info.get("libraries", {})
    threads = info.get("threads_env", {}).get("OMP_NUM_THREADS") or info.get("accelerators", {}).get("torch_threads")
    return {
        "what": what,
        "date": (info.get("start") or "")[:10] or None,
        "machine": machine,
        "threads": int(threads) if threads else None,
        "libraries": {name: libraries[name] for name in ("torch", "transformers") if name in libraries},
        "figures": demo_figures(out),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m searchrl.recorded", description=__doc__.splitlines()[0])
    parser.add_argument("name", help="the entry to write, e.g. demo")
    parser.add_argument("run", help="a folder written by `searchrl demo --out`")
    parser.add_argument("--what", required=True, help="what was run, in words (the command, the questions)")
    parser.add_argument("--machine", required=True, help="the machine and what else ran on it")
    parser.add_argument("--registry", default=str(REGISTRY))
    args = parser.parse_args(argv)
    path = Path(args.registry)
    entries = load(path) if path.is_file() else {}
    entries[args.name] = demo_entry(args.run, args.what, args.machine)
    path.write_text(json.dumps(entries, indent=2) + "\n", encoding="utf-8")
    print(f"recorded {args.name} in {path}; now run tests/unit/test_recorded_numbers.py to find the pages to update")


if __name__ == "__main__":
    main()
