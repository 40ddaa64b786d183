"""Asynchronous vs synchronous training at equal resources: the same recipe, one run in each mode,
in ONE invocation, each run in its own subprocess.

Resources: two CPU cores (--cpus, default 0,1). The trainer process is pinned to the second and
runs torch with one thread; async mode's rollout worker is pinned to the first
(`rollout.worker_cpus`, one thread). The sync run gets the same two cores: its trainer generates
on its own core and the other idles, which is what lockstep costs (generation waits for the
update and the update for generation).

Workload: `searchrl.rl.trainer.train` on the demo recipe (configs/demo-cpu.yaml: BM25 over the toy
world, Reinforce++, one optimizer step per batch) with the update in bf16 autocast over float32
weights (`dtype: bfloat16`, as configs/toolcall-demo-cpu.yaml; --dtype float32 for the demo's own
setting, whose update takes ~2x as long), Stage 1 only, sampling at temperature 1, with a
long tail of searches. A model that is not trained to search rarely does, so the hf backend is
wrapped (`LongTailBackend`) to search on a fixed plan: every `--chunk` sampled tokens a rollout
either writes a query (`<search> ... </search>`, a toy-world question's first words; the engine
serves it: a batched BM25 search, a documents block fed to the model) or, its searches done, an
answer (`<answer> ... </answer>`), which ends it. Rollout h searches SEARCHES[h % 8] times:
1, 1, 2, 1, 1, 1, 2, 4 -- most once, one in eight four times, so each batch waits for its
four-search rollouts, as the search agents' batches do. The written tags count as policy tokens
(they are in the loss) with a behaviour log-prob of 0; sampled text is the model's. Rewards are
the stage's plus bench/trainer.py's `toy_reward` (a hash of the text), so every group has variance
and no update is skipped. Generation is float32 in both modes whatever --dtype (the hf backend on
CPU, `rollout.precision.rollout_autocast`).

Measured: the first --warmup steps of each run are dropped (model load, the async pipeline
filling); over the rest, from each run's metrics.jsonl: updates per hour (3600 / mean
`step_seconds`), policy tokens per second (policy tokens of the rollouts / step seconds), the
async run's mean `staleness_mean` and `trainer_idle_share`, each run's `update_seconds` (async's
holds the weights hand-off) and the async trainer's seconds in `rollout.weights.publish`.
`update_slowdown` is async's update, the hand-off taken out, over sync's: what sharing memory
bandwidth and cache with the generating worker costs. The ideal overlap bound is the sync run's
step time over the larger of its generation (`rollout_seconds`) and the rest of its step
(scoring, log-probs, `update_seconds`: all that stays in the trainer): what perfect overlap of
the two could give. Goal on a 2-core machine: async >= 1.3x sync updates/hour at max_staleness 1,
and >= 0.85 of the bound. The last line holds `name=value` pairs, ratios first. The machine must
be otherwise idle: other jobs' threads move to whichever core is free, so they slow sync and
async unequally (beside ~8 other jobs, 3 timed steps of the same mode spread 136-327 s).

    python bench/async.py                 # SmolLM2-135M, 4+1 steps per mode, ~7 min on 2 cores
    python bench/async.py --quick         # tiny-random, a few tokens: seconds (a smoke run, not a measurement)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))  # bench/trainer.py's toy reward
RESULT = "RESULT "  # prefix of the one stdout line a run reports on
SEARCHES = (1, 1, 2, 1, 1, 1, 2, 4)  # searches of rollout h: SEARCHES[h % 8]
PROMPT = "Question: {question}\nSearch with {query_open} query {query_close}, then answer.\n{think_open}"


def settings(args) -> dict:
    """The workload: --quick's or the measurement's, with any of its keys given on the command line."""
    if args.quick:
        s = {"model": "tiny-random", "dtype": "bfloat16", "prompts": 1, "group": 8, "chunk": 4, "micro_batch": 2, "steps": 3, "warmup": 1}
    else:
        s = {"model": "smollm2-135m", "dtype": "bfloat16", "prompts": 1, "group": 8, "chunk": 32, "micro_batch": 2, "steps": 4, "warmup": 1}
    return {**s, **{k: getattr(args, k) for k in s if getattr(args, k) is not None}}


# ------------------------------------------------------------------------------------------------
# the workload: the hf backend, searching on a plan


def install_workload(chunk: int, tags) -> None:
    """Make every `HFBackend` built from now on in this process a `LongTailBackend` (the trainer's,
    in sync mode, and the rollout worker's, in async mode, both import it when they build it)."""
    from searchrl.data.catalog import load_dataset
    from searchrl.rollout import hf_backend
    from searchrl.rollout.backend import Continuation, per_sequence_budgets

    queries = [" ".join(q.question.rstrip("?").split()[:6]) for q in load_dataset("toyworld:train")[:32]]
    real = getattr(hf_backend.HFBackend, "_bench_real", hf_backend.HFBackend)

    class LongTailBackend(real):
        """Every `chunk` sampled tokens: a query while rollout h has searches of its plan left,
        then an answer (module docstring). Natural stops (EOS, a tag the model writes) pass."""

        _bench_real = real

        def start(self, prompts, params):
            handles = super().start(prompts, params)
            self._done = {**getattr(self, "_done", {}), **{h: 0 for h in handles}}
            return handles

        def generate(self, handles, max_new_tokens, stop=(), quorum=1.0):
            budgets = per_sequence_budgets(handles, max_new_tokens)
            outs = super().generate(handles, [min(b, chunk) for b in budgets], stop, quorum)
            result = []
            for h, b, o in zip(handles, budgets, outs):
                if o.finish_reason == "length" and len(o.token_ids) == chunk and b > chunk:
                    if self._done[h] < SEARCHES[h % len(SEARCHES)]:
                        text, close = f" {tags.query_open} {queries[(h + self._done[h]) % len(queries)]} {tags.query_close}", tags.query_close
                        self._done[h] += 1
                    else:
                        text, close = f" {tags.answer_open} {queries[h % len(queries)].split()[0]} {tags.answer_close}", tags.answer_close
                    ids = self.encode(text)
                    self.append([h], [ids])
                    o = Continuation(o.token_ids + ids, o.logprobs + [0.0] * len(ids), "stop", close)
                result.append(o)
            return result

    hf_backend.HFBackend = LongTailBackend


def _worker_main(cfg, *args):
    """The rollout worker process's entry: the workload installed, then the library's worker."""
    from searchrl.protocols.tagged import TagProtocol
    from searchrl.rollout import worker_process

    install_workload(int(os.environ["SEARCHRL_BENCH_CHUNK"]), TagProtocol.named(cfg.protocol.tags).tags)
    return worker_process.worker_main(cfg, *args)  # this process imported the library afresh: unpatched


# ------------------------------------------------------------------------------------------------
# one run (a subprocess)


def run_one(args) -> None:
    s = settings(args)
    trainer_cpu = args.cpus[1]
    from searchrl.rollout.worker_process import pin_cpus

    pin_cpus([trainer_cpu], "the trainer")  # before torch starts its threads (the worker re-pins itself)
    from trainer import toy_reward

    from searchrl.config import load_config
    from searchrl.protocols.tagged import TagProtocol
    from searchrl.rl import step
    from searchrl.rl import trainer as rl_trainer
    from searchrl.rl.config import TrainConfig
    from searchrl.rollout import async_worker as async_rollouts
    from searchrl.runlog import read_metrics

    install_workload(s["chunk"], TagProtocol.named("search-r1").tags)
    os.environ["SEARCHRL_BENCH_CHUNK"] = str(s["chunk"])
    async_rollouts.worker_main = _worker_main  # spawn pickles it by name: this script, run again in the worker
    real_reward = step.compute_reward

    def reward(traj, *a, **kw):  # an untrained model's reward is flat: add a hash of its text
        r = real_reward(traj, *a, **kw)
        return dataclasses.replace(r, total=r.total + toy_reward("".join(x.text for x in traj.segments if x.source == "policy")))

    step.compute_reward = reward
    published = []  # seconds of each weights hand-off on the trainer's side (in sync mode: none)
    real_publish = async_rollouts.publish

    def publish(*a, **kw):
        t = time.perf_counter()
        out = real_publish(*a, **kw)
        published.append(time.perf_counter() - t)
        return out

    async_rollouts.publish = publish
    template = Path(args.work) / "prompt.txt"
    template.write_text(PROMPT)
    run_dir = Path(args.work) / args.mode
    budget = (max(SEARCHES) + 1) * (s["chunk"] + 24)  # the longest plan, with room for each written tag
    overrides = [
        f"model={s['model']}", "device=cpu", f"dtype={s['dtype']}", f"out={run_dir}", "seed=0",
        f"protocol.template={template}", "rollout.temperature=1.0", "rollout.top_p=1.0", "rollout.k=1",
        f"rollout.max_searches={max(SEARCHES)}", f"rollout.max_new_tokens={budget}",
        f"rollout.batch_size={s['prompts'] * s['group']}",
        f"stage1.steps={s['warmup'] + s['steps']}", f"stage1.prompts_per_step={s['prompts']}",
        f"stage1.samples_per_prompt={s['group']}", "stage2.steps=0",
        "algorithm.mini_batch_size=null", f"algorithm.micro_batch_size={s['micro_batch']}",
        "logging.progress=false", "logging.tensorboard=false", "logging.sample_every=0", "logging.checkpoint_every=0",
        f"rollout.mode={'async' if args.mode == 'async' else 'sync'}", f"rollout.max_staleness={args.max_staleness}",
        f"rollout.worker_cpus=[{args.cpus[0]}]",
    ]
    cfg = load_config(TrainConfig, str(ROOT / "configs" / "demo-cpu.yaml"), overrides)
    t0 = time.perf_counter()
    rl_trainer.train(cfg)
    wall = time.perf_counter() - t0
    rows = read_metrics(run_dir)
    timed = rows[s["warmup"]:]
    if any(r["updates"] < 1 for r in timed):
        raise SystemExit(f"a timed step made no update: {[r['updates'] for r in timed]}")
    rollouts = s["prompts"] * s["group"]

    def mean(key, default=0.0):
        return statistics.fmean(r.get(key, default) for r in timed)

    print(RESULT + json.dumps({
        "step_s": mean("step_seconds"), "rollout_s": mean("rollout_seconds"), "update_s": mean("update_seconds"),
        "trainer_s": mean("step_seconds") - mean("rollout_seconds"),
        "policy_tokens": mean("response_tokens") * rollouts, "searches": mean("searches"),
        "staleness": mean("staleness_mean"), "idle": mean("trainer_idle_share"), "wall_s": wall, "steps": len(timed),
        "publish_s": statistics.fmean(published[-len(timed):]) if published else 0.0,
        "each_step_s": [r["step_seconds"] for r in timed], "each_update_s": [r["update_seconds"] for r in timed],
    }), flush=True)


# ------------------------------------------------------------------------------------------------
# both runs and the report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny-random and a few tokens: a smoke run of seconds")
    ap.add_argument("--max-staleness", type=int, default=1, help="the async run's rollout.max_staleness")
    ap.add_argument("--cpus", default="0,1", help="two cores: the rollout worker's, then the trainer's")
    ap.add_argument("--model", help="model name or folder (default: smollm2-135m; --quick: tiny-random)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], help="the recipe's compute dtype (default: bfloat16, "
                    "as configs/toolcall-demo-cpu.yaml: bf16 autocast over float32 weights in the update)")
    for k, what in (("prompts", "questions a step"), ("group", "rollouts per question"), ("chunk", "sampled tokens between tags"),
                    ("micro_batch", "rows per update micro-batch"),
                    ("steps", "timed steps per run"), ("warmup", "steps dropped first")):
        ap.add_argument(f"--{k}", type=int, help=f"{what} (default: the workload's)")
    ap.add_argument("--only", choices=["sync", "async"], help="run one mode and print its figures (calibration)")
    ap.add_argument("--mode", choices=["sync", "async"], help=argparse.SUPPRESS)  # one run, in a subprocess
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.cpus = [int(c) for c in args.cpus.split(",")]
    if len(args.cpus) != 2 or len(set(args.cpus)) != 2:
        raise SystemExit(f"--cpus takes two distinct cores, the worker's and the trainer's (got {args.cpus})")
    if args.mode:
        return run_one(args)
    s = settings(args)
    res = {}
    with tempfile.TemporaryDirectory(prefix="bench-async-") as work:
        for mode in [args.only] if args.only else ["sync", "async"]:
            cmd = [sys.executable, __file__, "--mode", mode, "--work", work, "--cpus", ",".join(map(str, args.cpus)),
                   "--max-staleness", str(args.max_staleness)] + (["--quick"] if args.quick else [])
            cmd += [a for k, v in s.items() for a in (f"--{k}", str(v))]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env={**os.environ, "OMP_NUM_THREADS": "1"})
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)]
            if proc.returncode != 0 or not lines:
                sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-5000:])
                raise SystemExit(f"the {mode} run failed (exit {proc.returncode})")
            res[mode] = json.loads(lines[-1][len(RESULT):])
    if args.only:
        print(json.dumps(res[args.only]))
        return
    sy, asy = res["sync"], res["async"]
    for r in (sy, asy):
        r["updates_per_h"] = 3600 / r["step_s"]
        r["tok_s"] = r["policy_tokens"] / r["step_s"]
    bound = sy["step_s"] / max(sy["rollout_s"], sy["trainer_s"])
    ratio = asy["updates_per_h"] / sy["updates_per_h"]
    print(f"{s['model']} ({s['dtype']} update): {s['prompts']} questions x {s['group']} rollouts a step, searches per rollout {SEARCHES} "
          f"(mean {statistics.fmean(SEARCHES):.2f}), {s['chunk']} sampled tokens between tags; {s['steps']} timed steps "
          f"after {s['warmup']}; worker core {args.cpus[0]}, trainer core {args.cpus[1]}, 1 thread each; "
          f"async max_staleness {args.max_staleness}")
    print(f"{'mode':6} {'s/step':>8} {'gen s':>8} {'trainer s':>10} {'update s':>9} {'publish s':>10} {'updates/h':>10} "
          f"{'policy tok/s':>13} {'searches':>9} {'staleness':>10} {'idle':>6}  each step s")
    for name, r in (("sync", sy), ("async", asy)):
        print(f"{name:6} {r['step_s']:8.2f} {r['rollout_s']:8.2f} {r['trainer_s']:10.2f} {r['update_s']:9.2f} {r['publish_s']:10.2f} "
              f"{r['updates_per_h']:10.1f} {r['tok_s']:13.1f} {r['searches']:9.1f} {r['staleness']:10.2f} {r['idle']:6.2f}  "
              + " ".join(f"{x:.1f}" for x in r["each_step_s"]))
    # What sharing the machine with a generating worker costs the update (the hand-off taken out).
    slowdown = (asy["update_s"] - asy["publish_s"]) / sy["update_s"]
    print(f"async update (hand-off taken out) / sync update {slowdown:.3f}; async publishes weights in {asy['publish_s']:.2f} s a step")
    print(f"async/sync updates per hour {ratio:.3f}; ideal overlap bound {bound:.3f} (sync step / max(generation, "
          f"trainer)); async reaches {ratio / bound:.3f} of it. Goal: >= 1.3 and >= 0.85.")
    pairs = {
        "ratio_updates_per_h": ratio, "ratio_tok_s": asy["tok_s"] / sy["tok_s"], "ratio_of_bound": ratio / bound,
        "bound": bound, "sync_updates_per_h": sy["updates_per_h"], "async_updates_per_h": asy["updates_per_h"],
        "sync_tok_s": sy["tok_s"], "async_tok_s": asy["tok_s"], "staleness_mean": asy["staleness"],
        "trainer_idle_share": asy["idle"], "sync_gen_s": sy["rollout_s"], "sync_trainer_s": sy["trainer_s"],
        "sync_update_s": sy["update_s"], "async_update_s": asy["update_s"], "async_publish_s": asy["publish_s"],
        "update_slowdown": slowdown,
    }
    print(" ".join(f"{k}={v:.3f}" for k, v in pairs.items()) + f" model={s['model']} dtype={s['dtype']} steps={s['steps']} max_staleness={args.max_staleness}")


if __name__ == "__main__":
    main()
