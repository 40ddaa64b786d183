"""Partial rollouts (`rollout.partial: continue`) on the tiny-random model: weights that change
between two rounds of live sequences (the hf backend prefills them again), the engine's
`between_rounds` hook recording each token's policy version, and the async worker's side of it
(the newest published version, read from its file), and a whole async run with `continue`.
`finish` (no hook) leaves everything as it was (tests/unit/test_async.py)."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from test_async import _run
from test_rollout import PASSAGES, QUESTIONS, WordRetriever, assert_matches_recompute, prompts_for

from searchrl import metric_names as mn
from searchrl.assets import load_model
from searchrl.protocols.tagged import TagProtocol
from searchrl.protocols.tags import SEARCH_R1_TAGS, format_documents
from searchrl.retrieval.querycache import CachedRetriever
from searchrl.rl.config import TrainConfig
from searchrl.rollout.agent import Agent
from searchrl.rollout.backend import SamplingParams
from searchrl.rollout.config import RolloutConfig
from searchrl.rollout.engine import RolloutEngine
from searchrl.rollout.hf_backend import HFBackend
from searchrl.rollout.weights import latest_published, named_weights, publish
from searchrl.rollout.worker import RolloutWorker
from searchrl.rollout.worker_process import PublishedFiles, load_version, newest_version
from searchrl.runlog import read_metrics


@pytest.fixture(scope="module")
def models():
    """tiny-random (version "old") and a visibly different copy of it ("new")."""
    old, tok = load_model("tiny-random")
    new = copy.deepcopy(old)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.5 * torch.randn_like(p))
    return old, new, tok


def test_hf_load_weights_between_rounds_prefills_live_sequences_with_the_new_weights(models):
    old, new, tok = models
    be = HFBackend(copy.deepcopy(old), tok)
    prompts = [be.encode("Tell me about rivers.", prompt=True)] * 2 + [be.encode("Hi", prompt=True)]
    handles = be.start(prompts, SamplingParams(greedy=True))
    first = be.generate(handles, [5, 5, 3])
    docs = be.encode(format_documents(PASSAGES[:1], SEARCH_R1_TAGS))
    be.append(handles[:1], [docs])  # one row has a documents block waiting, the others a sampled token
    be.load_weights(named_weights(new))
    second = be.generate(handles, 4)
    for i, h in enumerate(handles):
        inserted = docs if i == 0 else []
        response = first[i].token_ids + inserted + second[i].token_ids
        n1, n2 = len(first[i].token_ids), len(second[i].token_ids)
        mask1 = [1] * n1 + [0] * (len(response) - n1)
        mask2 = [0] * (len(response) - n2) + [1] * n2
        # the first round is the old policy's, the second the new one's given the WHOLE prefix
        assert_matches_recompute(old, prompts[i], response, mask1, first[i].logprobs + [0.0] * (len(response) - n1), greedy=True)
        assert_matches_recompute(new, prompts[i], response, mask2, [0.0] * (len(response) - n2) + second[i].logprobs, greedy=True)
    be.release(handles)


def _worker(model, tok, **cfg) -> RolloutWorker:
    retriever = CachedRetriever(WordRetriever())
    rollout = RolloutConfig(temperature=1.0, top_p=1.0, **cfg)
    engine = RolloutEngine(HFBackend(model, tok), retriever, TagProtocol.named("search-r1"), rollout)
    return RolloutWorker(Agent(engine.protocol, engine.backend, retriever, engine), contextlib.nullcontext, version=-1)


def test_continue_takes_the_version_published_between_rounds(models, tmp_path):
    old, new, tok = models
    publish(old, tmp_path, 3)
    worker = _worker(copy.deepcopy(old), tok, max_new_tokens=8, max_tokens_per_turn=4)
    load_version(worker, PublishedFiles(tmp_path), 3)
    rounds = []

    def between_rounds() -> int:
        rounds.append(worker.version)
        if len(rounds) == 2:  # the trainer publishes its next version while round 1 was generating
            publish(new, tmp_path, 4)
        return newest_version(worker, PublishedFiles(tmp_path))

    trajs = worker.collect(QUESTIONS[:2], 2, seed=5, between_rounds=between_rounds)
    assert latest_published(tmp_path) == 4 and worker.version == 4 and rounds[:2] == [3, 3]
    two_rounds = [t for t in trajs if len(t.token_ids) == 8]
    assert len(two_rounds) >= 3  # a random model rarely writes EOS in its first 4 tokens
    for t in trajs:
        assert t.policy_version == 3  # the oldest version among its tokens: staleness counts from it
        if t in two_rounds:
            assert t.token_versions == [3] * 4 + [4] * 4 and t.versions() == t.token_versions
            # the behaviour log-probs are those of the weights that sampled each part
            assert_matches_recompute(old, t.prompt_ids, t.token_ids, [1] * 4 + [0] * 4, t.logprobs, greedy=False)
            assert_matches_recompute(new, t.prompt_ids, t.token_ids, [0] * 4 + [1] * 4, t.logprobs, greedy=False)
        else:
            assert t.token_versions == []  # one version: recorded once, in policy_version


def test_finish_records_one_version_and_a_hook_that_swaps_nothing_changes_nothing(models):
    old, _, tok = models
    cfg = {"max_new_tokens": 8, "max_tokens_per_turn": 4}
    plain = _worker(old, tok, **cfg)
    plain.version = 7
    finish = plain.collect(QUESTIONS[:2], 2, seed=5)
    hooked = _worker(old, tok, **cfg).collect(QUESTIONS[:2], 2, seed=5, between_rounds=lambda: 7)
    for a, b in zip(finish, hooked, strict=True):
        assert (a.token_ids, a.logprobs, a.policy_version, a.token_versions) == (b.token_ids, b.logprobs, 7, [])
    # the engine alone stamps nothing: the worker does (finish), or the hook's versions do (continue)
    engine = plain.engine
    assert all(t.policy_version == 0 for t in engine.run(QUESTIONS[:1], prompts_for(QUESTIONS[:1]), n=1))


def test_continue_is_refused_with_a_round_quorum_below_1():
    with pytest.raises(ValueError, match="rollout.partial=continue .* set rollout.round_quorum=1"):
        TrainConfig(rollout={"mode": "async", "partial": "continue", "round_quorum": 0.5})
    TrainConfig(rollout={"mode": "async", "partial": "continue"})
    TrainConfig(rollout={"mode": "async", "partial": "finish", "round_quorum": 0.5})


def test_an_async_run_with_continue_trains_within_its_staleness(world, tmp_path, varied_rewards):
    run = _run(world, tmp_path / "continue", "rollout.mode=async", "rollout.max_staleness=1", "rollout.partial=continue")
    records = read_metrics(run)
    assert len(records) == 4 and any(r[mn.PG_LOSS] != 0 for r in records)
    # however the processes were timed, no rollout is older than max_staleness and none was dropped
    assert all(r[mn.STALENESS_MAX] <= 1 and r[mn.DROPPED_GROUPS] == 0 for r in records)
    assert records[0][mn.STALENESS_MAX] == 0  # the first batch: nothing newer than the start weights yet
