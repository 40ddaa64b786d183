"""GPU check: rollout speed of our engine against plain `generate`, one RL step's time and peak
memory, and a few asynchronous RL steps, on a randomly initialised ~0.5B Qwen2 model. Driven part by part by `scripts/gpu_check.sh`
(each part its own process, under its own timeout); `--dry` runs the same code on CPU with the
tiny-random model and a handful of tokens, so CI keeps it working.

Parts (all write JSON into --work):

- `prepare`: environment (GPU name, torch/transformers versions, date) and the model: a Qwen2
  with Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads, 2 KV heads, intermediate 4864, vocab
  151936, tied embeddings), random weights, the tokenizer we ship offline (SmolLM2's, through
  `searchrl.assets`; ids past its 49,152 decode to ''), saved with `save_pretrained` so that
  `model=<folder>` works everywhere. Dry: the `tiny-random` model as it is.
- `rollout`: `RolloutEngine` + `HFBackend` with BM25 over the toy world (k passages per search),
  against `model.generate` producing as many new tokens per sequence, no search, same prompts
  (bench/rollout.py's `run_engine` / `run_limit`). A random model never writes a query, so
  `SearchingBackend` writes one for it: every `--search-every` sampled tokens (up to
  `max_searches`) it appends `<search> QUERY </search>` to the sequence (fed to the model like
  any appended tokens) and reports the stop, so the engine runs real search rounds: a batched
  retrieval, documents appended to the KV cache, generation resumed. Those query tokens are not
  counted as sampled: tokens/s counts sampled tokens only.
- `train` (run under `torchrun --nproc_per_node 1`): `searchrl.rl.trainer.train` on the demo
  recipe with this model (FSDP2 on one rank, bf16 on GPU), `--steps` Stage-1 steps, searches
  forced as above, the stage reward plus bench/trainer.py's `toy_reward` (a random model's reward
  is flat, and flat groups skip their update); its metrics.jsonl gives the step timings;
  `torch.cuda.max_memory_allocated` the peak (CPU: peak RSS).
- `async` (one process, no torchrun): the same training with `rollout.mode=async`,
  `max_staleness` 1, `async_steps` steps: a rollout worker process generates (its own copy of the
  model) while the trainer updates (docs/guides/async.md), on cuda:1 when the machine has a second
  GPU, else on the trainer's device (dry: CPU). Its searches are
  not forced (the worker is a process of its own, which the wrapper above does not reach), so its
  rollouts run to the token budget; its metrics.jsonl gives each step's time, staleness, and the
  share of the step the trainer waited for its batch. Then the same run with
  `rollout.weight_transport=broadcast` (the weights go by a torch.distributed broadcast, nccl on
  GPU, gloo in the dry run): its steps' times, and each publish's seconds on the trainer's side
  for both transports. NCCL needs a GPU per process, so on a machine with one GPU that run is
  skipped (the JSON says so).
- `report`: one JSON of the figures; its last printed line is `name=value` pairs, ratios first.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import platform
import resource
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the other bench scripts' helpers

ROOT = Path(__file__).resolve().parents[1]
QWEN2_0_5B = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
              "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768, "rope_theta": 1e6,
              "rms_norm_eps": 1e-6, "tie_word_embeddings": True}


def settings(dry: bool) -> dict:
    """Workload of each mode. GPU: 4 questions x 16 samples (the paper's group size), 512 tokens."""
    # async_steps: from the second step on a batch is one version stale (the first is the stage's start weights)
    if dry:
        return {"device": "cpu", "dtype": "float32", "questions": 1, "samples": 4, "max_new_tokens": 40, "search_every": 4,
                "max_searches": 2, "k": 1, "top_p": 1.0, "steps": 1, "micro_batch": 4, "async_steps": 2}
    return {"device": "cuda", "dtype": "bfloat16", "questions": 4, "samples": 16, "max_new_tokens": 512, "search_every": 128,
            "max_searches": 2, "k": 3, "top_p": 0.95, "steps": 2, "micro_batch": 8, "async_steps": 3}


def peak_gb(device: str) -> float:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def safetensors_params(folder: Path) -> int:
    """Parameters stored in a save_pretrained folder, from the safetensors headers alone."""
    total = 0
    for f in folder.glob("*.safetensors"):
        with f.open("rb") as fh:
            header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        total += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
    return total


def dump(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")
    print(f"  wrote {path}", flush=True)


# ------------------------------------------------------------------------------------------------
# forced searches


class SearchingBackend:
    """Wraps a `GenerationBackend` so that a model that never searches (random weights) still
    does: a `generate` call samples at most `every` tokens; a sequence that used them all, with
    budget and searches left, gets `<query_open> QUERY <query_close>` appended (fed to the model)
    and comes back as stopped at the end-of-query tag. Everything else is the inner backend's."""

    def __init__(self, inner, tags, queries: list[str], every: int, max_searches: int) -> None:
        self.inner, self.tags, self.queries = inner, tags, queries
        self.every, self.max_searches = every, max_searches
        self.searches: dict[int, int] = {}
        self.forced_tokens = 0  # appended query tokens, reported as policy tokens but not sampled

    def __getattr__(self, name):  # encode, decode, eos_token_ids, tokenizer, release, sync_weights, ...
        return getattr(self.inner, name)

    @property
    def stats(self):
        return self.inner.stats

    @stats.setter
    def stats(self, value):
        self.inner.stats = value

    def start(self, prompts, params):
        handles = self.inner.start(prompts, params)
        self.searches.update({h: 0 for h in handles})
        return handles

    def generate(self, handles, max_new_tokens, stop=(), quorum=1.0):
        from searchrl.rollout.backend import Continuation, per_sequence_budgets

        budgets = per_sequence_budgets(handles, max_new_tokens)
        forcing = [self.searches.get(h, 0) < self.max_searches and b > self.every for h, b in zip(handles, budgets)]
        outs = self.inner.generate(handles, [min(b, self.every) if f else b for b, f in zip(budgets, forcing)], stop, quorum)
        result = []
        for h, o, f in zip(handles, outs, forcing):
            if f and o.finish_reason == "length" and len(o.token_ids) == self.every:
                query = self.queries[(h + self.searches[h]) % len(self.queries)]
                ids = self.inner.encode(f" {self.tags.query_open} {query} {self.tags.query_close}")
                self.inner.append([h], [ids])
                self.searches[h] += 1
                self.forced_tokens += len(ids)
                o = Continuation(o.token_ids + ids, o.logprobs + [0.0] * len(ids), "stop", self.tags.query_close)
            result.append(o)
        return result

    def append(self, handles, token_ids):
        self.inner.append(handles, token_ids)


def toyworld_queries(n: int = 32) -> list[str]:
    """The first words of toy-world questions (their entity names): short queries that find passages."""
    from searchrl.data.catalog import load_dataset

    return [" ".join(q.question.rstrip("?").split()[:6]) for q in load_dataset("toyworld:train")[:n]]


# ------------------------------------------------------------------------------------------------
# parts


def prepare(args, s: dict) -> None:
    import torch
    import transformers

    env = {"mode": "dry" if args.dry else "gpu", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
           "host": platform.node(), "device": s["device"], "cuda": torch.version.cuda,
           "gpu": torch.cuda.get_device_name(0) if s["device"] == "cuda" else "none (CPU dry run)",
           "gpu_memory_gb": torch.cuda.get_device_properties(0).total_memory / 2**30 if s["device"] == "cuda" else 0.0,
           "settings": s}
    from searchrl.assets import load_tokenizer, resolve_model

    if args.dry:  # read from the files: importing transformers' model classes takes seconds on CPU
        folder = resolve_model("tiny-random")
        cfg = SimpleNamespace(**json.loads((Path(folder) / "config.json").read_text()))
        params = safetensors_params(Path(folder))
    else:
        from transformers import AutoModelForCausalLM, Qwen2Config

        tok = load_tokenizer(args.tokenizer)
        if len(tok) > QWEN2_0_5B["vocab_size"]:
            raise SystemExit(f"tokenizer {args.tokenizer!r} has {len(tok)} tokens, more than the model's vocabulary")
        cfg = Qwen2Config(**QWEN2_0_5B, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                          pad_token_id=tok.pad_token_id)
        torch.manual_seed(0)
        with torch.device(s["device"]):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        params = sum(p.numel() for p in model.parameters())
        folder = Path(args.work) / "model"
        model.save_pretrained(folder)
        tok.model_max_length = cfg.max_position_embeddings
        tok.save_pretrained(folder)
        del model
    env["model"] = {"folder": str(folder), "params": params, "architecture": (getattr(cfg, "architectures", None) or [cfg.model_type])[0],
                    "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "heads": cfg.num_attention_heads,
                    "kv_heads": cfg.num_key_value_heads, "vocab": cfg.vocab_size}
    # The demo's template (a worked example, ~420 tokens); dry: a one-line prompt keeps CPU passes short.
    env["template"] = "oneshot"
    if args.dry:
        env["template"] = str(Path(args.work) / "prompt.txt")
        Path(env["template"]).write_text("Question: {question}\nSearch with {query_open} ... {query_close}.\nAnswer: {think_open}")
    print(f"  model: {env['model']['architecture']} {params / 1e6:.1f}M parameters at {folder}", flush=True)
    dump(Path(args.work) / "env.json", env)


def run_rollout(args, s: dict) -> None:
    import torch
    from rollout import run_engine, run_limit

    from searchrl.assets import load_model
    from searchrl.data.catalog import load_dataset
    from searchrl.protocols.tagged import TagProtocol
    from searchrl.retrieval import open_retriever
    from searchrl.rollout.config import RolloutConfig
    from searchrl.rollout.hf_backend import HFBackend

    env = json.loads((Path(args.work) / "env.json").read_text())
    model, tok = load_model(env["model"]["folder"], device=s["device"], dtype=s["dtype"])
    questions = load_dataset("toyworld:test")[: s["questions"]]
    retriever = open_retriever("toyworld")
    protocol = TagProtocol.named("search-r1", env["template"])
    prompts = [protocol.prompt(q.question, tok) for q in questions]
    cfg = RolloutConfig(max_new_tokens=s["max_new_tokens"], max_searches=s["max_searches"], k=s["k"], temperature=1.0,
                        top_p=s["top_p"], seed=0, samples_per_question=s["samples"], batch_size=s["questions"] * s["samples"])
    queries = toyworld_queries()

    def engine_run(c):
        backend = SearchingBackend(HFBackend(model, tok), protocol.tags, queries, s["search_every"], s["max_searches"])
        r = run_engine(backend, retriever, protocol, questions, prompts, c)
        r["sampled"] = r["policy"] - backend.forced_tokens
        return r

    expanded = [p for p in prompts for _ in range(s["samples"])]
    print(f"  warm-up: {len(expanded)} sequences, {len(tok(prompts[0])['input_ids'])}-token prompts", flush=True)
    engine_run(cfg.model_copy(update={"max_new_tokens": min(8, s["max_new_tokens"]), "samples_per_question": 2}))
    run_limit(model, tok, expanded[:2], 4, cfg)
    if s["device"] == "cuda":
        torch.cuda.reset_peak_memory_stats()
    eng = engine_run(cfg)
    print(f"  engine: {eng['sampled']} sampled + {eng['policy'] - eng['sampled']} query + {eng['env']} document tokens, "
          f"{eng['searches']} searches, {eng['wall']:.2f}s", flush=True)
    new_tokens = max(1, math.ceil(eng["sampled"] / len(expanded)))
    lim = run_limit(model, tok, expanded, new_tokens, cfg)
    print(f"  generate: {len(expanded)}x{new_tokens} tokens, no search, {lim['wall']:.2f}s", flush=True)
    dump(Path(args.work) / "rollout.json", {
        "engine_tok_s": eng["sampled"] / eng["wall"], "generate_tok_s": lim["policy"] / lim["wall"],
        "engine_vs_generate": (eng["sampled"] / eng["wall"]) / (lim["policy"] / lim["wall"]),
        "engine_seconds": eng["wall"], "generate_seconds": lim["wall"], "sequences": len(expanded),
        "sampled_tokens": eng["sampled"], "query_tokens": eng["policy"] - eng["sampled"], "document_tokens": eng["env"],
        "searches": eng["searches"], "retrieval_seconds": eng["retrieval_s"], "generate_new_tokens": new_tokens,
        "prompt_tokens": len(tok(prompts[0])["input_ids"]), "peak_gb": peak_gb(s["device"]),
    })


def vary_rewards() -> None:
    """A random model's reward is flat, and flat groups skip their update: add a hash of the
    rollout's text (bench/trainer.py's `toy_reward`) to the stage reward, in this process."""
    from trainer import toy_reward

    from searchrl.rl import step

    real_reward = step.compute_reward

    def reward(traj, *a, **kw):
        r = real_reward(traj, *a, **kw)
        return dataclasses.replace(r, total=r.total + toy_reward("".join(x.text for x in traj.segments if x.source == "policy")))

    step.compute_reward = reward


def train_config(env: dict, s: dict, run_dir: Path, steps: int, *extra: str):
    """The demo recipe with this model and workload: `steps` Stage-1 steps, no Stage 2."""
    from searchrl.config import load_config
    from searchrl.rl.config import TrainConfig

    overrides = [
        f"model={env['model']['folder']}", f"device={s['device']}", f"dtype={s['dtype']}", f"out={run_dir}", "seed=0",
        f"rollout.max_new_tokens={s['max_new_tokens']}", f"rollout.k={s['k']}", f"rollout.max_searches={s['max_searches']}",
        f"rollout.top_p={s['top_p']}", f"rollout.batch_size={s['questions'] * s['samples']}",
        f"stage1.steps={steps}", f"stage1.prompts_per_step={s['questions']}", f"stage1.samples_per_prompt={s['samples']}",
        f"protocol.template={env['template']}", "stage2.steps=0", "algorithm.mini_batch_size=null", f"algorithm.micro_batch_size={s['micro_batch']}",
        f"algorithm.gradient_checkpointing={'false' if s['device'] == 'cpu' else 'true'}",
        "logging.progress=false", "logging.report_to=[]", "logging.sample_every=0", "logging.checkpoint_every=0",
        *extra,
    ]
    return load_config(TrainConfig, str(ROOT / "configs" / "demo-cpu.yaml"), overrides)


def run_train(args, s: dict) -> None:
    import torch

    from searchrl.rl import trainer
    from searchrl.rollout.worker import RolloutWorker
    from searchrl.runlog import read_metrics

    env = json.loads((Path(args.work) / "env.json").read_text())
    queries = toyworld_queries()
    real_create = RolloutWorker.create.__func__

    def create(cls, actor, retriever, protocol):
        worker = real_create(cls, actor, retriever, protocol)
        worker.engine.backend = SearchingBackend(worker.engine.backend, protocol.tags, queries, s["search_every"], s["max_searches"])
        return worker

    vary_rewards()
    RolloutWorker.create = classmethod(create)
    run_dir = Path(args.work) / "train-run"
    cfg = train_config(env, s, run_dir, s["steps"])
    if s["device"] == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    trainer.train(cfg)
    total = time.perf_counter() - t0
    if os.environ.get("RANK", "0") != "0":
        return
    rows = read_metrics(run_dir)
    keys = ("step_seconds", "rollout_seconds", "logprob_seconds", "update_seconds", "tokens_per_s", "response_tokens", "updates")
    steps = [{k: r.get(k) for k in keys} for r in rows]
    if not steps or any(r["updates"] < 1 for r in steps):
        raise SystemExit(f"the RL steps made no update (metrics: {steps}); the step time would leave the update out")
    for i, r in enumerate(steps, 1):
        print(f"  step {i}: {r['step_seconds']:.2f}s (rollout {r['rollout_seconds']:.2f}, log-probs {r['logprob_seconds']:.2f}, "
              f"update {r['update_seconds']:.2f}), {r['response_tokens']:.0f} tokens/rollout", flush=True)
    dump(Path(args.work) / "train.json", {
        "steps": steps, "step_seconds": steps[-1]["step_seconds"], "peak_gb": peak_gb(s["device"]),
        "processes": int(os.environ.get("WORLD_SIZE", "1")), "total_seconds": total,
        "rollouts_per_step": s["questions"] * s["samples"],
    })


def run_async(args, s: dict) -> None:
    import torch

    from searchrl import metric_names as mn
    from searchrl.rl import trainer
    from searchrl.rollout.weight_broadcast import group_backend

    env = json.loads((Path(args.work) / "env.json").read_text())
    vary_rewards()  # scoring stays in the trainer's process: this reaches it
    run_dir = Path(args.work) / "async-run"
    worker_device = "cuda:1" if s["device"] == "cuda" and torch.cuda.device_count() > 1 else None
    placed = [f"rollout.worker_devices=[{worker_device}]"] if worker_device else []
    cfg = train_config(env, s, run_dir, s["async_steps"], "rollout.mode=async", "rollout.max_staleness=1", *placed)
    if s["device"] == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    with publish_clock() as publishes:
        trainer.train(cfg)
    total = time.perf_counter() - t0
    steps = async_steps(run_dir, s["async_steps"], "async")
    later = steps[1:]  # the first step waits for its batch whatever the mode: nothing was generated ahead
    out = {
        "steps": steps, "step_seconds": sum(r[mn.STEP_SECONDS] for r in later) / len(later),
        "staleness_mean": sum(r[mn.STALENESS_MEAN] for r in steps) / len(steps),
        "staleness_max": max(r[mn.STALENESS_MAX] for r in steps),
        "trainer_idle_share": sum(r[mn.TRAINER_IDLE_SHARE] for r in later) / len(later),
        "trainer_peak_gb": peak_gb(s["device"]), "worker_device": worker_device or cfg.device, "total_seconds": total,
        "rollouts_per_step": s["questions"] * s["samples"], "publish_seconds": publishes,
    }
    # The same run with the weights broadcast (nccl on GPU: the worker needs a GPU of its own).
    if s["device"] == "cuda" and not worker_device:
        out["broadcast"] = {"skipped": f"NCCL needs a GPU per process; this machine has {torch.cuda.device_count()}"}
    else:
        cast_dir = Path(args.work) / "async-broadcast-run"
        cast_cfg = train_config(env, s, cast_dir, s["async_steps"], "rollout.mode=async", "rollout.max_staleness=1",
                                "rollout.weight_transport=broadcast", *placed)
        with publish_clock() as cast_publishes:
            trainer.train(cast_cfg)
        cast = async_steps(cast_dir, s["async_steps"], "async broadcast")
        out["broadcast"] = {"steps": cast, "backend": group_backend(cast_cfg.device), "publish_seconds": cast_publishes,
                            "step_seconds": sum(r[mn.STEP_SECONDS] for r in cast[1:]) / len(cast[1:])}
    dump(Path(args.work) / "async.json", out)


def async_steps(run_dir: Path, n: int, what: str) -> list[dict]:
    """An async run's step records (the figures the check keeps), printed; exits unless `n` steps each updated."""
    from searchrl import metric_names as mn
    from searchrl.runlog import read_metrics

    keys = (mn.STEP_SECONDS, mn.ROLLOUT_SECONDS, mn.UPDATE_SECONDS, mn.UPDATES, mn.STALENESS_MEAN, mn.STALENESS_MAX,
            mn.TRAINER_IDLE_SHARE, mn.BUFFER_DEPTH, mn.DROPPED_GROUPS)
    steps = [{k: r.get(k) for k in keys} for r in read_metrics(run_dir)]
    if len(steps) != n or any(r[mn.UPDATES] < 1 for r in steps) or [r[mn.STALENESS_MAX] for r in steps][:2] != [0, 1][:n]:
        raise SystemExit(f"the {what} run did not make {n} steps with an update each, one version stale from the second "
                         f"(metrics: {steps})")
    for i, r in enumerate(steps, 1):
        print(f"  {what} step {i}: {r[mn.STEP_SECONDS]:.2f}s (waited for its batch {r[mn.TRAINER_IDLE_SHARE]:.0%}, "
              f"update {r[mn.UPDATE_SECONDS]:.2f}), staleness {r[mn.STALENESS_MEAN]:g}", flush=True)
    return steps


@contextlib.contextmanager
def publish_clock():
    """The seconds of each publish after an update (`AsyncRollouts.sync_weights`: the file written, or
    the broadcast sent and received by every worker), in a list filled while the block runs."""
    from searchrl.rollout.async_worker import AsyncRollouts

    seconds, publish = [], AsyncRollouts.sync_weights

    def timed(self, model, version):
        t0 = time.perf_counter()
        publish(self, model, version)
        seconds.append(time.perf_counter() - t0)

    AsyncRollouts.sync_weights = timed
    try:
        yield seconds
    finally:
        AsyncRollouts.sync_weights = publish


def report(args, s: dict) -> None:
    work = Path(args.work)
    env, ro, tr, asy = (json.loads((work / f"{n}.json").read_text()) for n in ("env", "rollout", "train", "async"))
    times = json.loads(args.part_seconds) if args.part_seconds else {}
    out = {**env, "figures": {
        "engine_vs_generate": ro["engine_vs_generate"], "engine_tok_s": ro["engine_tok_s"], "generate_tok_s": ro["generate_tok_s"],
        "rl_step_seconds": tr["step_seconds"], "rl_peak_gb": tr["peak_gb"], "rollout_peak_gb": ro["peak_gb"],
        "async_step_seconds": asy["step_seconds"], "async_staleness_mean": asy["staleness_mean"],
        "async_trainer_idle_share": asy["trainer_idle_share"],
    }, "rollout": ro, "train": tr, "async": asy, "part_seconds": times}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    f = out["figures"]
    print(f"gpu={env['gpu']!r} torch={env['torch']} transformers={env['transformers']} model={env['model']['params'] / 1e6:.1f}M")
    print(" ".join(f"{k}={v:.3f}" for k, v in f.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("part", choices=["prepare", "rollout", "train", "async", "report"])
    ap.add_argument("--work", required=True, help="folder the parts share (model, part JSONs, the training run)")
    ap.add_argument("--dry", action="store_true", help="CPU, tiny-random, a handful of tokens (CI)")
    ap.add_argument("--tokenizer", default="tiny-random", help="tokenizer source (searchrl.assets name or folder); "
                    "tiny-random carries SmolLM2's")
    ap.add_argument("--out", help="report: the JSON to write")
    ap.add_argument("--part-seconds", help="report: JSON object of each part's wall seconds (from the shell script)")
    args = ap.parse_args()
    s = settings(args.dry)
    if args.part == "report":
        return report(args, s)  # no torch: seconds, not minutes
    import torch

    if s["device"] == "cuda" and not torch.cuda.is_available():
        raise SystemExit("CUDA is not available (torch.cuda.is_available() is False): run on a GPU machine, or use --dry")
    {"prepare": prepare, "rollout": run_rollout, "train": run_train, "async": run_async}[args.part](args, s)


if __name__ == "__main__":
    main()
