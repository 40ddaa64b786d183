"""The rollout engine with the real SmolLM2-135M-Instruct, a few-shot `search-r1` prompt and BM25
over the toy world: searches happen, and the environment tokens are exactly the inserted blocks."""

from __future__ import annotations

import pytest

from searchrl.assets import load_model
from searchrl.data.catalog import load_dataset
from searchrl.data.trajectory import STOP_REASONS
from searchrl.protocols.tagged import TagProtocol
from searchrl.retrieval import open_retriever
from searchrl.rollout.config import RolloutConfig
from searchrl.rollout.engine import RolloutEngine
from searchrl.rollout.hf_backend import HFBackend


def env_runs(traj) -> list[list[int]]:
    runs, prev = [], 1
    for t, m in zip(traj.token_ids, traj.loss_mask):
        if m == 0:
            if prev == 1:
                runs.append([])
            runs[-1].append(t)
        prev = m
    return runs


@pytest.mark.integration
def test_smollm2_searches_and_env_tokens_are_the_inserted_blocks():
    model, tok = load_model("smollm2-135m")
    questions = load_dataset("toyworld:test")[:8]
    retriever = open_retriever("toyworld")
    protocol = TagProtocol.named("search-r1", "fewshot")
    backend = HFBackend(model, tok)
    cfg = RolloutConfig(max_new_tokens=64, max_searches=2, k=2, temperature=1.0, top_p=0.95, seed=0,
                        samples_per_question=2)
    trajs = RolloutEngine(backend, retriever, protocol, cfg).run(questions)

    assert len(trajs) == 16
    searched = [t for t in trajs if t.n_searches > 0]
    print(f"{len(searched)} of {len(trajs)} rollouts searched; {backend.stats}")
    assert len(searched) >= 3, [t.response_text[:120] for t in trajs]
    for t in trajs:
        assert t.stop_reason in STOP_REASONS
        assert len(t.token_ids) == len(t.loss_mask) == len(t.logprobs)
        assert sum(t.loss_mask) <= 64
        assert all(lp <= 0 for lp in t.logprobs)
        expected = []
        for query, ids in zip(t.queries, t.retrieved_ids):
            passages = retriever.search([query], 2)[0]
            assert [p.id for p in passages] == ids
            expected.append(protocol.format_documents(passages))
        # Decoding the loss-mask-0 runs one by one gives exactly the inserted blocks, nothing else.
        assert [backend.decode(run) for run in env_runs(t)] == expected
        assert [s.text for s in t.segments if s.source == "env"] == expected
        # No BPE drift at the seams: the runs decoded apart equal the whole response decoded.
        whole = backend.decode(t.token_ids[:-1] if t.stop_reason == "eos" else t.token_ids)
        assert whole == t.response_text
        if t.stop_reason == "answer":
            assert t.answer is not None
