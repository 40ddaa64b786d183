"""The SFT baseline: the masked NLL by hand, gold paths and their token layout (identical to a
scripted engine rollout writing the same text), the actor's SFT update, and `searchrl train` with
an SFT config on tiny-random (2 steps, checkpoint, resume equals an uninterrupted run)."""

from __future__ import annotations

import json
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from searchrl.assets import load_tokenizer
from searchrl.cli import app
from searchrl.config import load_config
from searchrl.data.types import Passage, Question
from searchrl.errors import SearchRLError
from searchrl.protocols.config import ProtocolConfig
from searchrl.protocols.tagged import TagProtocol
from searchrl.protocols.template_selftest import sampled_ids
from searchrl.retrieval import RetrievalConfig, open_retriever
from searchrl.retrieval.index import build_index
from searchrl.rewards import RewardConfig, compute_reward
from searchrl.rl import step
from searchrl.rl.actor import Actor
from searchrl.rl.batch import make_batch
from searchrl.rl.checkpoint import latest_checkpoint
from searchrl.rl.config import TrainConfig
from searchrl.rl.losses import policy_loss, sft_loss
from searchrl.rl.preflight import preflight
from searchrl.rollout.agent import AgentConfig, build_protocol
from searchrl.rollout.config import RolloutConfig
from searchrl.rollout.engine import RolloutEngine
from searchrl.rollout.gold import evidence_sentence, gold_paths, gold_trajectories
from searchrl.rollout.run_search import RunSearch
from searchrl.rollout.scripted import ScriptedBackend
from searchrl.runlog import read_metrics
from searchrl.tools import ToolContext, build_tools
from searchrl.tools.passages import format_passages

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
TOWNS = ["Quellbridge", "Marrowind", "Velmar", "Harbel"]
RIVERS = ["Tessaly", "Orrin", "Dagny", "Brenna"]
HILLS = ["Eskar", "Ulmo", "Pirr", "Tavo"]


# --- the loss ----------------------------------------------------------------------------------


def test_sft_loss_is_the_masked_nll_by_hand():
    logp = torch.tensor([[-1.0, -2.0, float("-inf")], [-0.5, -3.0, -4.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [0, 1, 0]])
    loss = sft_loss(logp, mask)  # token-mean: (1 + 2 + 3) / 3 policy tokens
    assert float(loss.detach()) == pytest.approx(2.0)
    loss.backward()
    # d loss / d logp = -1/3 at each policy token, exactly 0 elsewhere (also at the -inf padding)
    want = torch.tensor([[-1 / 3, -1 / 3, 0.0], [0.0, -1 / 3, 0.0]])
    torch.testing.assert_close(logp.grad, want)
    # rollouts count once: ((1 + 2) / 2 + 3 / 1) / 2 rollouts
    assert float(sft_loss(logp, mask, "seq-mean-token-mean").detach()) == pytest.approx(2.25)
    assert float(sft_loss(logp, mask, "token-mean", units=6).detach()) == pytest.approx(
        1.0
    )  # a mini-batch's 6 tokens


def test_sft_gradient_is_the_policy_gradient_with_advantage_one_on_policy():
    logp = torch.tensor([[-1.0, -2.0, -0.3]], requires_grad=True)
    mask = torch.tensor([[1, 0, 1]])
    (g_sft,) = torch.autograd.grad(sft_loss(logp, mask), logp)
    pg, _ = policy_loss(logp, logp.detach(), torch.ones(1, 3), mask)
    (g_pg,) = torch.autograd.grad(pg, logp)
    torch.testing.assert_close(g_sft, g_pg)


# --- gold paths --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gold_world(tmp_path_factory) -> Path:
    """Towns on rivers that rise in hills, a decoy that outranks the river Orrin on its bare name,
    and a question file: 2-hop bridges, comparisons, and questions with no gold path."""
    root = tmp_path_factory.mktemp("gold")
    passages = [
        Passage(
            f"town-{i}",
            t,
            f"{t} is a market town on the river {r}. It was founded in {1600 + 50 * i}.",
        )
        for i, (t, r) in enumerate(zip(TOWNS, RIVERS))
    ]
    passages += [
        Passage(f"river-{i}", r, f"The {r} rises in the {h} hills.")
        for i, (r, h) in enumerate(zip(RIVERS, HILLS))
    ]
    passages.append(
        Passage(
            "decoy",
            "Orrin ferry",
            "The Orrin ferry crosses the Orrin. Orrin boats, Orrin nets, Orrin fish.",
        )
    )
    build_index(passages, root / "index", "bm25", progress=False)
    rows = [
        {
            "id": f"b{i}",
            "question": f"In which hills does the river through {t} rise?",
            "answers": [HILLS[i]],
            "supporting_ids": [f"town-{i}", f"river-{i}"],
            "type": "bridge-2hop",
        }
        for i, t in enumerate(TOWNS)
    ]
    rows += [
        {
            "id": f"c{i}",
            "question": f"Which town was founded first, {TOWNS[i]} or {TOWNS[i + 1]}?",
            "answers": [TOWNS[i]],
            "supporting_ids": [f"town-{i}", f"town-{i + 1}"],
            "type": "comparison",
        }
        for i in range(3)
    ]
    rows += [
        {
            "id": "x-hops",
            "question": "Three hops?",
            "answers": ["a"],
            "supporting_ids": ["town-0", "river-0", "town-1"],
        },
        {
            "id": "x-missing",
            "question": "Not indexed?",
            "answers": ["a"],
            "supporting_ids": ["town-0", "nowhere"],
        },
        {"id": "x-none", "question": "No support?", "answers": ["a"]},
    ]
    (root / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "prompt.txt").write_text("Q: {question}\nA: {think_open}")
    return root


def _questions(world: Path) -> list[Question]:
    return [
        Question.from_dict(json.loads(line))
        for line in (world / "q.jsonl").read_text().splitlines()
    ]


def test_gold_paths_search_each_supporting_passage_in_hop_order(gold_world):
    questions = _questions(gold_world)
    paths = gold_paths(questions, open_retriever(str(gold_world / "index")), k=1, max_searches=2)
    queries = {q.id: [s[0] for s in p.searches] for q, p in zip(questions, paths) if p is not None}
    # The decoy outranks the river Orrin on its bare name: the question's "hills" brings the river up.
    assert queries == {
        "b0": ["Quellbridge", "Tessaly"],
        "b1": ["Marrowind", "Orrin hills"],
        "b2": ["Velmar", "Dagny"],
        "b3": ["Harbel", "Brenna"],
        "c0": ["Quellbridge", "Marrowind"],
        "c1": ["Marrowind", "Velmar"],
        "c2": ["Velmar", "Harbel"],
    }
    b1 = paths[1]
    assert [[p.id for p in docs] for _, docs in b1.searches] == [
        ["town-1"],
        ["river-1"],
    ]  # what k=1 returned
    assert paths[-3:] == [
        None,
        None,
        None,
    ]  # 3 hops > max_searches, a passage not indexed, no support
    three = gold_paths(
        questions[-3:-2], open_retriever(str(gold_world / "index")), k=1, max_searches=3
    )
    assert [s[0] for s in three[0].searches] == ["Quellbridge", "Tessaly", "Marrowind"]


def test_gold_paths_need_a_local_index_and_a_question_that_has_one(gold_world, tmp_path):
    class Remote:
        def search(self, queries, k):
            return [[] for _ in queries]

    with pytest.raises(SearchRLError, match="retrieval.index"):
        gold_paths(_questions(gold_world), Remote(), k=1, max_searches=2)
    hopeless = [q for q in _questions(gold_world) if q.id.startswith("x-")]
    with pytest.raises(SearchRLError, match="stage1.kind=sft: none of the 3 questions"):
        RunSearch.open(RetrievalConfig(index=str(gold_world / "index")), tmp_path).gold_examples(
            hopeless, RolloutConfig(k=1, max_searches=2), "stage1"
        )


def test_gold_path_with_evidence_quotes_the_sentence_that_names_the_next_step(gold_world):
    """With evidence, the text after each documents block starts with the sentence of those
    documents that names the next hop's title (or the answer) as a whole word; nothing when no
    sentence does (a comparison's second town is named by the question, not by the first passage)."""
    retriever = open_retriever(str(gold_world / "index"))
    b1, c0 = gold_paths(
        [q for q in _questions(gold_world) if q.id in ("b1", "c0")], retriever, 1, 2, evidence=True
    )
    protocol = TagProtocol.named("search-r1", "oneshot")
    assert protocol.script_texts(b1.script())[1:] == [
        "Marrowind is a market town on the river Orrin. Next I search for Orrin hills.\n\n<search>Orrin hills</search>",
        "The Orrin rises in the Ulmo hills. So the answer is Ulmo.</think>\n\n<answer>Ulmo</answer>",
    ]
    assert protocol.script_texts(c0.script())[1:] == [
        "Next I search for Marrowind.\n\n<search>Marrowind</search>",
        "So the answer is Quellbridge.</think>\n\n<answer>Quellbridge</answer>",
    ]
    plain = gold_paths([b1.question], retriever, 1, 2)[0]
    assert protocol.script_texts(plain.script())[1] == "Next I search for Orrin hills.\n\n<search>Orrin hills</search>"
    # Tool calls: the same sentence leads the assistant turn that makes the next call.
    calls = [m for m in _native_engine(load_tokenizer("tiny-random"), retriever).protocol.chat_messages(b1.question.question, b1.script())
             if m["role"] == "assistant" and m.get("tool_calls")]
    assert [m["content"] for m in calls[-2:]] == [  # after the prompt's worked example
        "First I search for Marrowind.",
        "Marrowind is a market town on the river Orrin. Next I search for Orrin hills.",
    ]
    # Whole words only: "no" is not named by "honour", a town's name not by a longer word.
    assert evidence_sentence([Passage("p", "P", "Named in his honour. It is no town.")], ["no"]) == "It is no town."
    assert evidence_sentence([Passage("p", "P", "Velmarsh is wet.")], ["Velmar"]) is None
    with pytest.raises(ValueError, match="stage2.evidence quotes sentences"):
        TrainConfig.model_validate({"stage2": {"evidence": True}})


def test_gold_path_states_the_questions_own_evidence_where_it_lists_one_a_hop(gold_world):
    """A question that lists an evidence sentence per hop (the toy world's) gets each stated after
    the documents of its hop: a comparison's founding years after both of its searches, where the
    name-matching fallback quotes nothing; a list of another length falls back."""
    retriever = open_retriever(str(gold_world / "index"))
    by_id = {q.id: q for q in _questions(gold_world)}
    c0 = replace(by_id["c0"], evidence=("The founding year of Quellbridge is 1600.", "The founding year of Marrowind is 1650."))
    b1 = replace(by_id["b1"], evidence=("The river of Marrowind is Orrin.",))  # one for two hops
    protocol = TagProtocol.named("search-r1", "oneshot")
    comparison, bridge = gold_paths([c0, b1], retriever, 1, 2, evidence=True)
    assert protocol.script_texts(comparison.script())[1:] == [
        "The founding year of Quellbridge is 1600. Next I search for Marrowind.\n\n<search>Marrowind</search>",
        "The founding year of Marrowind is 1650. So the answer is Quellbridge.</think>\n\n<answer>Quellbridge</answer>",
    ]
    assert protocol.script_texts(bridge.script())[1] == (
        "Marrowind is a market town on the river Orrin. Next I search for Orrin hills.\n\n<search>Orrin hills</search>"
    )
    # Without evidence: off whatever the question lists.
    plain = gold_paths([c0], retriever, 1, 2)[0]
    assert protocol.script_texts(plain.script())[2] == "So the answer is Quellbridge.</think>\n\n<answer>Quellbridge</answer>"


def test_drop_shortcuts_leaves_out_questions_whose_first_passage_names_the_answer(gold_world, tmp_path):
    """A question whose first supporting passage names its answer is left out of an RL stage with
    drop_shortcuts; a comparison (the question names both candidates), a bridge whose answer only
    the second passage names, and a question without supporting ids stay."""
    shortcut_q = {"id": "s0", "question": "On which river is the town Quellbridge?", "answers": ["Tessaly"],
                  "supporting_ids": ["town-0", "river-0"], "type": "bridge-2hop"}
    rows = [json.loads(line) for line in (gold_world / "q.jsonl").read_text().splitlines()]
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in [shortcut_q, *rows]))
    base = _overrides(gold_world, tmp_path / "run", f"stage2.dataset={data}")

    def kept(*extra: str) -> list[str]:
        cfg = load_config(TrainConfig, None, [*base, *extra])
        return [q.id for q in preflight(cfg, [2], "tiny-random").questions[2]]

    assert kept()[0] == "s0"
    # x-hops and x-missing answer "a", which their first passage ("... is a market town") names.
    assert kept("stage2.drop_shortcuts=true") == ["b0", "b1", "b2", "b3", "c0", "c1", "c2", "x-none"]
    with pytest.raises(SearchRLError, match="stage2.drop_shortcuts: one search answers every one of the 1 questions"):
        data.write_text(json.dumps(shortcut_q) + "\n")
        kept("stage2.drop_shortcuts=true")


@pytest.mark.parametrize(
    "tags,template,evidence", [("search-r1", "oneshot", False), ("r1searcher", "base", False), ("search-r1", "oneshot", True)]
)
def test_gold_trajectory_is_token_for_token_the_engine_rollout_of_the_same_text(
    gold_world, tags, template, evidence
):
    """A scripted policy that writes the gold text, run through the real engine and index, records
    exactly the gold trajectory; its loss mask is 0 exactly on the documents blocks."""
    tokenizer = load_tokenizer("tiny-random")
    protocol = TagProtocol.named(tags, template)
    retriever = open_retriever(str(gold_world / "index"))
    cfg = RolloutConfig(k=1, max_searches=2, max_new_tokens=200)
    questions = [q for q in _questions(gold_world) if q.id in ("b1", "c0")]
    paths = gold_paths(questions, retriever, cfg.k, cfg.max_searches, evidence)
    gold_engine = RolloutEngine(
        ScriptedBackend(tokenizer, lambda text: ""), retriever, protocol, cfg
    )
    gold = gold_trajectories(gold_engine, paths)

    for path, g in zip(paths, gold):
        texts = protocol.script_texts(path.script())
        prompt_text = tokenizer.decode(g.prompt_ids)

        def write(text: str, texts=texts, prompt_text=prompt_text) -> str:
            # the next gold piece, after as many documents blocks as the response holds
            return texts[text[len(prompt_text) :].count(protocol.tags.docs_open)]

        engine = RolloutEngine(ScriptedBackend(tokenizer, write), retriever, protocol, cfg)
        (rolled,) = engine.run([path.question], n=1)
        for field in (
            "prompt_ids",
            "token_ids",
            "loss_mask",
            "segments",
            "queries",
            "retrieved_ids",
            "n_searches",
            "answer",
            "stop_reason",
        ):
            assert getattr(g, field) == getattr(rolled, field), field
        assert (
            g.prompt_ids
            == tokenizer(protocol.prompt(path.question.question, tokenizer))["input_ids"]
        )

        # Runs of equal mask: policy pieces (1) alternate with documents blocks (0); the prompt is
        # outside the response and so outside the loss.
        runs: list[tuple[int, list[int]]] = []
        for t, m in zip(g.token_ids, g.loss_mask):
            if runs and runs[-1][0] == m:
                runs[-1][1].append(t)
            else:
                runs.append((m, [t]))
        assert [m for m, _ in runs] == [1, 0] * len(path.searches) + [1]
        assert [tokenizer.decode(ids) for m, ids in runs if m == 1] == texts
        assert [tokenizer.decode(ids) for m, ids in runs if m == 0] == [
            protocol.format_documents(docs) for _, docs in path.searches
        ]
        batch = make_batch([g], [0.0], [0], 0, "cpu")
        assert batch.mask[0].tolist() == g.loss_mask and batch.prompt_len == len(g.prompt_ids)
        # A correct trajectory under the RL reward: well-formed, searched, the gold answer.
        reward = compute_reward(
            g,
            path.question.answers,
            RewardConfig(stage="stage2"),
            protocol.tags,
            think_opened_in_prompt=protocol.think_opened_in_prompt,
        )
        assert reward.format_ok and reward.answer == 1.0 and g.answer == path.question.answers[0]

    with pytest.raises(SearchRLError, match=r"2 of 2 gold trajectories have more policy tokens than rollout.max_new_tokens=20 \(the longest, question '\w+', has \d+\); set rollout.max_new_tokens=\d+"):
        gold_trajectories(
            RolloutEngine(
                gold_engine.backend,
                retriever,
                protocol,
                cfg.model_copy(update={"max_new_tokens": 20}),
            ),
            paths,
        )


# --- gold paths as native tool calls -------------------------------------------------------------


def _native_engine(tokenizer, retriever, backend=None, template="tools-oneshot"):
    cfg = AgentConfig(
        model="tiny-random",
        protocol=ProtocolConfig(format="tool-calls", chat_template="hermes-fallback", template=template),
        tools=["search", "calculate"],
    )
    rollout = RolloutConfig(k=1, max_searches=2, max_new_tokens=200)
    tools = build_tools(cfg.tools, ToolContext.of(retriever, rollout.k, lambda ps: format_passages(ps, "title-lines")))
    backend = backend or ScriptedBackend(tokenizer, lambda text: "")
    return RolloutEngine(backend, retriever, build_protocol(cfg, tokenizer), rollout, tools)


def _whole_ids(chat, messages, n_prompt):
    """The conversation rendered whole, tokenized in pieces cut where each assistant turn starts
    (`selftest.transcript`'s rule), up to the end-of-turn token of the last turn."""
    whole = chat.render(messages, add_generation_prompt=False)
    starts = [
        len(chat.render(messages[:i], add_generation_prompt=True))
        for i in range(n_prompt, len(messages))
        if messages[i]["role"] == "assistant"
    ]
    end_text = chat.tokenizer.decode([chat.end_of_turn_id])
    cuts = [0, *starts, whole.rfind(end_text) + len(end_text)]
    return [i for a, b in pairwise(cuts) for i in chat.encode(whole[a:b])]


def test_gold_path_as_tool_calls_is_the_templates_rendering_turn_by_turn(gold_world):
    """The gold conversation in the HF tool-calling shape; its trajectory is the whole rendering's
    ids, mask 1 exactly on the assistant turns, and a scripted policy writing those turns through
    the real engine and search tool records the same trajectory; the reward calls it correct."""
    tokenizer = load_tokenizer("tiny-random")
    retriever = open_retriever(str(gold_world / "index"))
    engine = _native_engine(tokenizer, retriever)
    protocol, chat = engine.protocol, engine.protocol.chat
    questions = [q for q in _questions(gold_world) if q.id in ("b1", "c0")]
    paths = gold_paths(questions, retriever, 1, 2)
    gold = gold_trajectories(engine, paths)
    for path, g in zip(paths, gold):
        messages = protocol.chat_messages(path.question.question, path.script(lambda ps: format_passages(ps, "title-lines")))
        head = protocol.messages(path.question.question)
        (q1, d1), (q2, d2) = path.searches
        assert messages[: len(head)] == head and head[0]["role"] == "system" and len(head) > 2  # an example
        assert messages[len(head) :] == [
            {"role": "assistant", "content": f"First I search for {q1}.", "tool_calls": [
                {"type": "function", "function": {"name": "search", "arguments": {"query": q1}}}]},
            {"role": "tool", "name": "search", "content": format_passages(d1, "title-lines")},
            {"role": "assistant", "content": f"Next I search for {q2}.", "tool_calls": [
                {"type": "function", "function": {"name": "search", "arguments": {"query": q2}}}]},
            {"role": "tool", "name": "search", "content": format_passages(d2, "title-lines")},
            {"role": "assistant", "content": path.question.answers[0]},
        ]
        assert g.prompt_ids == protocol.prompt_ids(path.question.question)
        assert g.prompt_ids + g.token_ids == _whole_ids(chat, messages, len(head))
        # mask 1 on exactly what a policy samples for each assistant turn, closed by <|im_end|>
        turns = [
            sampled_ids(chat, messages[:i], m)
            for i, m in enumerate(messages)
            if i >= len(head) and m["role"] == "assistant"
        ]
        assert [t for t, m in zip(g.token_ids, g.loss_mask) if m] == [i for t in turns for i in t]
        assert sum(a != b for a, b in zip(g.loss_mask, g.loss_mask[1:])) == 4  # turn, results, turn, results, turn
        assert g.queries == [q1, q2] and g.retrieved_ids == [[p.id for p in d] for d in (d1, d2)]
        assert [(c["name"], c["arguments"], c["ok"]) for c in g.tool_calls] == [
            ("search", {"query": q}, True) for q in (q1, q2)]
        reward = compute_reward(g, path.question.answers, RewardConfig(stage="stage2"), protocol)
        assert reward.format_ok and reward.answer == 1.0 and g.answer == path.question.answers[0]

        texts = [tokenizer.decode(t) for t in turns]
        prompt = tokenizer.decode(g.prompt_ids)

        def write(text: str, texts=texts, prompt=prompt) -> str:  # the turn after as many as written
            return texts[text[len(prompt) :].count("<|im_start|>assistant")]

        scripted = ScriptedBackend(tokenizer, write)
        (rolled,) = _native_engine(tokenizer, retriever, scripted).run([path.question], n=1)
        for field in ("prompt_ids", "token_ids", "loss_mask", "segments", "queries", "retrieved_ids",
                      "n_searches", "answer", "stop_reason", "tool_calls"):
            assert getattr(g, field) == getattr(rolled, field), field


# --- the update and the training run ------------------------------------------------------------


def _overrides(world: Path, out: Path, *extra: str) -> list[str]:
    return [
        "model=tiny-random",
        f"retrieval.index={world / 'index'}",
        f"out={out}",
        f"protocol.template={world / 'prompt.txt'}",
        f"stage1.dataset={world / 'q.jsonl'}",
        f"stage2.dataset={world / 'q.jsonl'}",
        "stage1.steps=2",
        "stage2.steps=1",
        "stage1.prompts_per_step=2",
        "stage2.prompts_per_step=2",
        "algorithm.lr=1e-3",
        "algorithm.micro_batch_size=1",
        "logging.checkpoint_every=1",
        "logging.progress=false",
        *extra,
    ]


def _nll(model, trajs) -> float:
    """Mean −log p over the policy tokens, one full forward per trajectory (no padding, no tricks)."""
    total, count = 0.0, 0
    with torch.no_grad():
        for t in trajs:
            ids = torch.tensor([t.prompt_ids + t.token_ids])
            logp = torch.log_softmax(
                model(input_ids=ids).logits[0, len(t.prompt_ids) - 1 : -1].float(), dim=-1
            )
            picked = logp.gather(1, torch.tensor(t.token_ids)[:, None])[:, 0]
            keep = torch.tensor(t.loss_mask, dtype=torch.bool)
            total, count = total - float(picked[keep].sum()), count + int(keep.sum())
    return total / count


def test_sft_update_minimises_the_nll_of_policy_tokens_across_micro_batches(gold_world):
    cfg = load_config(
        TrainConfig, CONFIGS / "sft-demo-cpu.yaml", _overrides(gold_world, gold_world / "unused")
    )
    retriever = open_retriever(str(gold_world / "index"))
    examples = RunSearch(retriever).gold_examples(_questions(gold_world), cfg.rollout, "stage1")
    results = {}
    for micro in (1, 2):  # one row per pass, or both prompts left-padded into one pass
        actor = Actor.load(
            cfg.model_copy(
                update={"algorithm": cfg.algorithm.model_copy(update={"micro_batch_size": micro})}
            )
        )
        actor.start_stage(None)
        engine = RolloutEngine(
            ScriptedBackend(actor.tokenizer, lambda text: ""),
            retriever,
            TagProtocol.from_config(cfg.protocol),
            cfg.rollout,
        )
        # A bridge and a comparison: prompts of different lengths.
        trajs = gold_trajectories(engine, [p for p in examples if p.question.id in ("b1", "c0")])
        assert len({len(t.prompt_ids) for t in trajs}) == 2
        before = _nll(actor.model, trajs)
        batch = make_batch(trajs, [0.0, 0.0], [0, 1], actor.pad_id, actor.device)
        stats = actor.update(batch, 0, 1, torch.Generator().manual_seed(0), objective="sft")
        # the micro-batches' losses over the mini-batch's policy tokens sum to the mean NLL
        assert stats.updates == 1 and stats.pg_loss == pytest.approx(before, rel=1e-5)
        assert stats.grad_norm > 0 and stats.ratio_mean == 1.0 and stats.clip_frac == 0.0
        assert _nll(actor.model, trajs) < before  # one step on the batch lowers its NLL
        # the update leaves its (clipped) gradient in .grad: Adam's first step is ~lr·sign(g), so
        # float-rounding differences in tiny gradients would show in the weights, not here
        results[micro] = (stats, {n: p.grad.clone() for n, p in actor.model.named_parameters()})
    (s1, g1), (s2, g2) = results[1], results[2]
    assert s2.pg_loss == pytest.approx(s1.pg_loss, rel=1e-5)
    assert all(torch.allclose(g1[n], g2[n], rtol=1e-4, atol=1e-7) for n in g1)


def test_sft_micro_batches_take_rows_by_length(gold_world, monkeypatch):
    """Rows of an SFT mini-batch share micro-batches shortest first, so a short trajectory is not
    padded to a long one's length; the shuffled order would mix them."""
    cfg = load_config(TrainConfig, CONFIGS / "sft-demo-cpu.yaml", _overrides(gold_world, gold_world / "unused"))
    cfg = cfg.model_copy(update={"algorithm": cfg.algorithm.model_copy(update={"micro_batch_size": 2})})
    retriever = open_retriever(str(gold_world / "index"))
    examples = RunSearch(retriever).gold_examples(_questions(gold_world), cfg.rollout, "stage1")
    actor = Actor.load(cfg)
    actor.start_stage(None)
    engine = RolloutEngine(ScriptedBackend(actor.tokenizer, lambda text: ""), retriever, TagProtocol.from_config(cfg.protocol), cfg.rollout)
    trajs = gold_trajectories(engine, examples)
    batch = make_batch(trajs, [0.0] * len(trajs), list(range(len(trajs))), actor.pad_id, actor.device)
    passes: list[list[int]] = []
    monkeypatch.setattr(Actor, "_sft_backward", lambda self, batch, idx, units, acc: passes.append(idx.tolist()))
    actor.update(batch, 0, 1, torch.Generator().manual_seed(0), objective="sft")
    lengths = batch.response_lengths().tolist()
    assert sorted(i for p in passes for i in p) == list(range(len(trajs)))
    assert [lengths[i] for p in passes for i in p] == sorted(lengths)
    assert len(set(lengths)) > 2  # lengths that a shuffled order could mix


def test_sft_demo_config_has_the_rl_demo_budget_and_one_sample_per_question():
    with pytest.raises(SearchRLError, match="stage2.samples_per_prompt=1"):
        load_config(TrainConfig, CONFIGS / "sft-demo-cpu.yaml", ["stage2.samples_per_prompt=8"])
    cfg = load_config(TrainConfig, CONFIGS / "sft-demo-cpu.yaml")
    demo = load_config(TrainConfig, CONFIGS / "demo-cpu.yaml")
    # the demo's budget: same steps and sequences a step, same schedule
    for n in (1, 2):
        s, d = cfg.stage(n), demo.stage(n)
        assert (s.kind, s.steps, s.prompts_per_step * s.samples_per_prompt) == (
            "sft",
            d.steps,
            d.prompts_per_step * d.samples_per_prompt,
        )
    # the same pools: Stage 1 all of toyworld:train; Stage 2 the comparisons RL's selection came from
    assert (cfg.stage1.dataset, cfg.stage1.question_types) == (demo.stage1.dataset, demo.stage1.question_types)
    assert demo.stage2.dataset == "toyworld:selected" and cfg.stage2.dataset == "toyworld:train"
    assert cfg.stage2.question_types == ["comparison", "bridge-comparison"]
    # micro-batches trade memory for speed and never change the result
    assert cfg.algorithm.model_copy(update={"micro_batch_size": 8}) == demo.algorithm
    assert cfg.rollout == demo.rollout and cfg.protocol == demo.protocol


def test_train_sft_config_writes_checkpoints_and_resumes_like_an_uninterrupted_run(
    gold_world, tmp_path
):
    config = str(CONFIGS / "sft-demo-cpu.yaml")
    full = tmp_path / "full"
    result = CliRunner().invoke(app, ["train", "--config", config, *_overrides(gold_world, full)])
    assert result.exit_code == 0, result.output
    records = read_metrics(full)
    assert [(r["stage"], r["step"]) for r in records] == [(1, 1), (1, 2), (2, 3)]
    assert all(
        r["updates"] == 1 and r["rollouts"] == 2 and r["sft_loss"] > 0 and r["grad_norm"] > 0
        for r in records
    )
    assert latest_checkpoint(full).name == "step_0003" and (full / "config.yaml").is_file()
    assert (full / "checkpoints" / "step_0003" / "model.safetensors").is_file()
    samples = [
        json.loads(line) for line in (full / "samples" / "step_0003.jsonl").read_text().splitlines()
    ]
    assert {s["id"][0] for s in samples} == {"c"}  # Stage 2 keeps the demo's comparison questions
    assert all(s["prediction"] == s["answers"][0] and s["n_searches"] == 2 for s in samples)
    # Every example is checked against the policy-token budget before the first step.
    short = tmp_path / "short"
    result = CliRunner().invoke(
        app, ["train", "--config", config, *_overrides(gold_world, short), "rollout.max_new_tokens=20"]
    )
    assert "gold trajectories have more policy tokens" in str(result.exception), result.output
    assert not read_metrics(short)

    crashed = tmp_path / "crashed"
    result = CliRunner().invoke(
        app,
        ["train", "--config", config, *_overrides(gold_world, crashed), "debug_crash_after_step=2"],
    )
    assert (
        isinstance(result.exception, RuntimeError)
        and latest_checkpoint(crashed).name == "step_0001"
    )
    result = CliRunner().invoke(
        app, ["train", "--resume", str(crashed), "debug_crash_after_step=null"]
    )
    assert result.exit_code == 0, result.output
    resumed = read_metrics(crashed)
    assert len(resumed) == len(records)
    for a, b in zip(records, resumed):
        for key, value in a.items():
            if step.is_timing(key) or key.endswith("_seconds"):
                continue
            assert b[key] == (
                None if value is None else pytest.approx(value, abs=1e-6, rel=1e-6)
            ), (a["step"], key)
    from safetensors.torch import load_file

    wa = load_file(full / "checkpoints" / "step_0003" / "model.safetensors")
    wb = load_file(crashed / "checkpoints" / "step_0003" / "model.safetensors")
    assert all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)


def test_train_sft_with_tool_calls_trains_and_writes_its_examples_as_chat_messages(gold_world, tmp_path):
    run = tmp_path / "tools"
    native = ["protocol.format=tool-calls", "protocol.template=tools", "protocol.chat_template=hermes-fallback",
              "stage1.steps=1", "rollout.max_new_tokens=200"]
    result = CliRunner().invoke(
        app, ["train", "--config", str(CONFIGS / "sft-demo-cpu.yaml"), *_overrides(gold_world, run, *native)]
    )
    assert result.exit_code == 0, result.output
    records = read_metrics(run)
    assert [(r["stage"], r["step"]) for r in records] == [(1, 1), (2, 2)]
    assert all(r["updates"] == 1 and r["sft_loss"] > 0 and r["grad_norm"] > 0 and r["searches"] == 2 for r in records)
    lines = [json.loads(line) for line in (run / "sft_messages.jsonl").read_text().splitlines()]
    # every question with a gold path, once (stage 2's comparisons are stage 1's too): b0-b3, c0-c2
    assert sorted(r["id"] for r in lines) == ["b0", "b1", "b2", "b3", "c0", "c1", "c2"]
    b1 = next(r for r in lines if r["id"] == "b1")["messages"]
    assert [m["role"] for m in b1] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert b1[2]["tool_calls"] == [{"type": "function", "function": {"name": "search", "arguments": {"query": "Marrowind"}}}]
    assert b1[3] == {"role": "tool", "name": "search", "content": "(1)Title: Marrowind Text: Marrowind is a market town "
                     "on the river Orrin. It was founded in 1650."}
    assert b1[-1] == {"role": "assistant", "content": "Ulmo"}
    samples = [json.loads(line) for line in (run / "samples" / "step_0002.jsonl").read_text().splitlines()]
    assert all(s["prediction"] == s["answers"][0] and len(s["tool_calls"]) == 2 for s in samples)
    # the tag protocol has no chat messages: no file
    tags = tmp_path / "tags"
    result = CliRunner().invoke(
        app, ["train", "--config", str(CONFIGS / "sft-demo-cpu.yaml"), *_overrides(gold_world, tags, "stage1.steps=1")]
    )
    assert result.exit_code == 0, result.output
    assert not (tags / "sft_messages.jsonl").exists()


def test_gold_doctests():
    import doctest

    from searchrl.rollout import gold

    assert doctest.testmod(gold).failed == 0
