"""Token exactness of native tool calls on the `hf` backend: what the backend conditions on is
exactly the ids the trajectory records, for our fixture chat templates (tests/unit/data/
chat_templates/) on the tiny-random model.

The canned conversation of `template_selftest.transcript` (prompt, two call turns with their tool-result
blocks, an answer) is driven through `HFBackend` the way the rollout engine drives it: `start`
the prompt, `generate` a policy turn, `append` the observation ids, `generate` again. A random
model would not write the canned turns, so the model gets a logit bias towards the transcript's
next token by position: greedy decoding then writes each canned turn itself, and its log-probs
stay those of the transformer over the context (the bias is moderate, the log-probs far from 0).
They must equal a teacher-forced forward pass over the recorded ids: a backend that conditioned on
other ids (a separator dropped, a block re-tokenized, a position shifted) fails.

One model serves the three templates: tiny-random with Llama 3's special tokens added to its
tokenizer and embeddings (the ChatML templates never use them), its attention sharpened so that
a change of context moves log-probs far past the tolerance (`exact_model`).
tests/integration/test_native_vllm.py runs the same checks on the `vllm` backend.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from itertools import groupby

import pytest
import torch
from test_native_calls import LLAMA31, LLAMA_SPECIALS, QWEN3, QWEN25, SCHEMAS
from test_rollout import WordRetriever

from searchrl.assets import load_model
from searchrl.data.types import Question
from searchrl.protocols.chat_template import NativeChat
from searchrl.protocols.config import ProtocolConfig
from searchrl.protocols.template_selftest import transcript
from searchrl.rollout.agent import AgentConfig, build_protocol
from searchrl.rollout.backend import SamplingParams
from searchrl.rollout.config import RolloutConfig
from searchrl.rollout.engine import RolloutEngine
from searchrl.rollout.hf_backend import HFBackend
from searchrl.rollout.scripted import ScriptedBackend
from searchrl.tools import ToolContext, build_tools

TEMPLATES = {"qwen25-style": QWEN25, "qwen3-style": QWEN3, "llama31-style": LLAMA31}
GREEDY = SamplingParams(greedy=True)
BIAS = 5.0  # random logits spread ~1: the target wins, its log-prob stays near -6, not 0


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-random")


@pytest.fixture(scope="module")
def exact(tiny):
    return exact_model(*tiny)


def exact_model(model, tok):
    """tiny-random with Llama 3's header and end-of-turn tokens in its tokenizer and embeddings,
    and queries/keys scaled by 10: a random model attends almost uniformly, so one token more or
    less in the context moves its log-probs by ~1e-3 only; peaked attention moves them by ~1e-2."""
    tok = copy.deepcopy(tok)
    tok.add_tokens(LLAMA_SPECIALS, special_tokens=True)
    model = copy.deepcopy(model)
    # The new rows are drawn: seeded, without touching the caller's RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model.resize_token_embeddings(len(tok))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(10)
            layer.self_attn.k_proj.weight.mul_(10)
    return model, tok


def turns_of(chat):
    """The canned transcript and its pieces: (transcript, prompt, turns, observations)."""
    t = transcript(chat)
    prompt, *rest = pieces(t)
    turns, observations = rest[0::2], rest[1::2]
    assert len(turns) == 3 and len(observations) == 2 and t.ids == t.whole
    return t, prompt, turns, observations


def pieces(t) -> list[list[int]]:
    """A transcript's ids cut where the loss mask changes: prompt, turn, observation, ..., turn."""
    runs, at = [], 0
    for _, group in groupby(t.loss_mask):
        n = len(list(group))
        runs.append(t.ids[at : at + n])
        at += n
    return runs


def teacher_forced(model, ids: list[int]) -> torch.Tensor:
    """log p(ids[i] | ids[:i]) for i >= 1, one forward pass over exactly `ids` ([len - 1])."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


@contextmanager
def biased_towards(model, target: list[int]):
    """Add BIAS to the logit of `target[p + 1]` at every position p (read from `position_ids`,
    which the hf backend passes for every real token): greedy decoding writes `target`."""
    table = torch.zeros(len(target), model.config.vocab_size)
    table[torch.arange(len(target) - 1), torch.tensor(target[1:])] = BIAS

    def hook(module, args, kwargs, out):
        c = out.logits.shape[1]  # the last positions' logits only (logits_to_keep=1)
        pos = kwargs.get("position_ids")
        if pos is None:
            pos = torch.arange(kwargs["input_ids"].shape[1])[None]
        out.logits = out.logits + table[pos[:, -c:].clamp(max=len(target) - 1)]
        return out

    handle = model.register_forward_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def drive(backend, chat, turns: list[list[int]], observations: list[list[int]], prompt: list[int]):
    """The engine's order on one sequence: start, generate a turn, append its observation, ...;
    returns the recorded ids and the generated tokens' (position, log-prob)."""
    stop = [chat.tokenizer.decode([i]) for i in chat.stop_ids]
    (h,) = backend.start([prompt], GREEDY)
    ids, logps = list(prompt), []
    for i, turn in enumerate(turns):
        out = backend.generate([h], len(turn) + 4, stop=stop)[0]
        # The canned turn, up to and including its end-of-turn id.
        assert out.token_ids == turn and out.finish_reason == "stop"
        logps += [(len(ids) + j, lp) for j, lp in enumerate(out.logprobs)]
        ids += out.token_ids
        if i < len(observations):
            backend.append([h], [observations[i]])
            ids += observations[i]
    backend.release([h])
    return ids, logps


def dropped_separator_gap(model, ids, at, positions) -> float:
    """Most the log-probs of the tokens at `positions` (> at) move when ids[at] is dropped."""
    later = [p for p in positions if p > at]
    dropped = teacher_forced(model, ids[:at] + ids[at + 1 :])[[p - 2 for p in later]]
    return float((teacher_forced(model, ids)[[p - 1 for p in later]] - dropped).abs().max())


@pytest.mark.parametrize("name", TEMPLATES)
def test_hf_backend_conditions_on_exactly_the_transcripts_ids(exact, name):
    model, tok = exact
    chat = NativeChat(tok, SCHEMAS, template=TEMPLATES[name])
    t, prompt, turns, observations = turns_of(chat)
    with biased_towards(model, t.whole):
        ids, logps = drive(HFBackend(model, tok), chat, turns, observations, prompt)
        forced = teacher_forced(model, ids)
    assert ids == t.whole  # (a) the trajectory is the whole rendering's ids
    got = torch.tensor([lp for _, lp in logps])
    want = forced[[p - 1 for p, _ in logps]]
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()  # (b)
    assert got.max() < -1  # the bias did not swamp the model: the context still counts
    # The check has teeth: without the first observation's first id, the later turns score differently.
    assert (
        dropped_separator_gap(model, ids, len(prompt) + len(turns[0]), [p for p, _ in logps]) > 1e-2
    )


# -- the engine ---------------------------------------------------------------------------
def native_engine(backend, tok, **rollout):
    cfg = AgentConfig(
        protocol=ProtocolConfig(format="tool-calls", chat_template="hermes-fallback"),
        tools=["search"],
    )
    retriever = WordRetriever()
    tools = build_tools(cfg.tools, ToolContext.of(retriever, 1))
    rollout_cfg = RolloutConfig(**{"k": 1, "max_new_tokens": 48, **rollout})
    return RolloutEngine(backend, retriever, build_protocol(cfg, tok), rollout_cfg, tools)


def assert_teacher_forced(model, traj):
    forced = teacher_forced(model, traj.prompt_ids + traj.token_ids)[len(traj.prompt_ids) - 1 :]
    mask = torch.tensor(traj.loss_mask, dtype=torch.bool)
    assert mask.any()
    got = torch.tensor(traj.logprobs)[mask]
    assert torch.allclose(got, forced[mask], atol=1e-4), (got - forced[mask]).abs().max()


def test_engine_log_probs_are_the_teacher_forced_ones_whatever_the_model_writes(tiny):
    model, tok = tiny
    engine = native_engine(HFBackend(model, tok), tok, seed=3, samples_per_question=4)
    trajs = engine.run(
        [Question("q1", "Which river flows through Quellbridge?", ("Tessaly",))], n=4
    )
    assert len(trajs) == 4
    for traj in trajs:
        assert_teacher_forced(model, traj)


def test_engine_tool_rounds_on_hf_are_the_scripted_ids_and_teacher_forced(tiny):
    """A scripted policy searches once and answers; the hf backend, biased towards that
    trajectory, writes it itself: the same ids, the tool-result block included, and its
    log-probs over them teacher-forced."""
    model, tok = tiny
    script = [
        '<tool_call>\n{"name": "search", "arguments": {"query": "Quellbridge river"}}\n</tool_call><|im_end|>',
        "Tessaly<|im_end|>",
    ]
    scripted = ScriptedBackend(tok, lambda text: script[text.count("<|im_start|>assistant") - 1])
    question = [Question("q1", "Which river flows through Quellbridge?", ("Tessaly",))]
    (want,) = native_engine(scripted, tok, greedy=True).run(question, n=1)
    assert (
        want.n_searches == 1 and want.answer == "Tessaly" and 0 in want.loss_mask
    )  # a result block
    whole = want.prompt_ids + want.token_ids
    with biased_towards(model, whole):
        (got,) = native_engine(HFBackend(model, tok), tok, greedy=True).run(question, n=1)
        assert got.prompt_ids + got.token_ids == whole and got.loss_mask == want.loss_mask
        assert_teacher_forced(model, got)
