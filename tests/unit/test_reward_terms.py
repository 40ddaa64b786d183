"""Reward terms: the stage presets give the old formula's floats bit for bit on hand-made
trajectories, under every magnitude option and in the shipped configs; the optional terms add
what they say; a term a user registers shows in the total and in `reward/<name>`, and one named by
import path needs no registering."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from searchrl.config import dump_config, load_config
from searchrl.data.trajectory import Segment, Trajectory
from searchrl.errors import SearchRLError
from searchrl.metrics import ANSWER_METRICS
from searchrl.protocols.format_rules import policy_view
from searchrl.protocols.tagged import TagProtocol
from searchrl.protocols.tags import R1SEARCHER_TAGS, extract_answer
from searchrl.reward_terms import REWARD_TERMS, RewardInput
from searchrl.rewards import RewardConfig, compute_reward
from searchrl.rl.config import TrainConfig

T = R1SEARCHER_TAGS
QO, QC, DO, DC = T.query_open, T.query_close, T.docs_open, T.docs_close
ROOT = Path(__file__).resolve().parents[2]
GOLDS = ["Tessaly"]


def P(text: str) -> Segment:
    return Segment(text, "policy")


SEARCH = [P(f" I need the river. {QO}Quellbridge river{QC}"), Segment(f"\n\n{DO}\n(1)Title: Quellbridge Text: On the Tessaly.\n{DC}\n\n", "env")]


def traj(segments, queries=None) -> Trajectory:
    n = sum(s.source == "env" for s in segments)
    queries = ["Quellbridge river"] * n if queries is None else queries
    calls = [{"name": "search", "arguments": {"query": q}, "ok": True, "error": None} for q in queries]
    return Trajectory("q", "Which river flows through Quellbridge?", [], [], [], [], list(segments), queries=queries,
                      n_searches=n, tool_calls=calls)


# Answers against the gold "Tessaly": F1 / EM / cover-EM (token) / cover-EM (substring).
TRAJS = {
    "searched_right": traj([*SEARCH, P("It is the Tessaly.</think>\n\n<answer>Tessaly</answer>")]),  # 1 / 1 / 1 / 1
    "searched_partial": traj([*SEARCH, P("so</think><answer>the Tessaly river</answer>")]),  # 2/3 / 0 / 1 / 1
    "searched_wrong": traj([*SEARCH, P("so</think><answer>Velmar</answer>")]),  # 0 / 0 / 0 / 0
    "guessed_right": traj([P(" I know it.</think><answer>Tessaly</answer>")]),  # no search; 1 / 1 / 1 / 1
    "searched_no_think": traj([*SEARCH, P("so<answer>Tessaly</answer>")]),  # format fails `think` only
    "long_answer": traj([*SEARCH, P("so</think><answer>Tessaly river delta</answer>")]),  # F1 1/2 (P=1/3, R=1)
    "nothing": traj([P("nothing")]),  # no search, no answer: fails `think` and `answer`
}


def old_compute_reward(t: Trajectory, golds, cfg: RewardConfig, tags=T) -> tuple[float, float, float, float]:
    """(total, retrieve, format, answer) by the fixed formula rewards.py had before reward terms
    (`stage_reward`), copied verbatim: the reference the presets must reproduce bit for bit."""
    verdict = TagProtocol(tags).check_format(t, max_answer_words=cfg.max_answer_words, require_think=cfg.require_think)
    prediction = t.answer if t.answer is not None else extract_answer(policy_view(t.segments, tags), tags)
    answer_score = ANSWER_METRICS.get(cfg.answer_metric)(prediction, golds)
    format_ok, n_searches = verdict.ok, t.n_searches
    searched = n_searches >= 1 and (format_ok or not cfg.retrieve_requires_format)
    retrieve = cfg.retrieve_weight * (cfg.retrieve_hit if searched else cfg.retrieve_miss)
    fmt = cfg.format_ok if format_ok else cfg.format_bad
    answer = cfg.answer_weight * answer_score if (format_ok or not cfg.answer_requires_format) else 0.0
    return retrieve + fmt + answer, retrieve, fmt, answer


def bits(*xs: float) -> tuple[str, ...]:
    """Exact float identity, the sign of zero included."""
    return tuple(float(x).hex() for x in xs)


AUTHORS_STAGE1 = {"stage": 1, "retrieve_hit": 0.5, "retrieve_miss": 0.0, "retrieve_requires_format": True, "format_ok": 0.0, "format_bad": -1.0, "answer_weight": 1.0}

# (config, trajectory, total by the old formula: retrieve_weight·R_retrieve + R_format + answer_weight·R_answer)
HAND = [
    # Stage 1 (retrieve_weight 1, hit +1, miss -1; format +1 / -1; answer_weight 0)
    ({"stage": 1}, "searched_right", 2.0),  # 1·1 + 1 + 0·1
    ({"stage": 1}, "searched_wrong", 2.0),  # the answer does not count in Stage 1
    ({"stage": 1}, "guessed_right", 0.0),  # 1·(-1) + 1 + 0
    ({"stage": 1}, "searched_no_think", 0.0),  # 1·1 - 1 + 0
    ({"stage": 1, "require_think": False}, "searched_no_think", 2.0),  # the think rule dropped: format ok
    ({"stage": 1}, "nothing", -2.0),  # 1·(-1) - 1
    ({"stage": 1, "max_answer_words": 2}, "long_answer", 0.0),  # answer_length fails: 1 - 1
    ({"stage": 1, "max_answer_words": 3}, "long_answer", 2.0),  # 3 words are allowed
    ({"stage": 1, "retrieve_hit": 0.5, "retrieve_miss": 0.0}, "guessed_right", 1.0),  # 0 + 1
    ({"stage": 1, "retrieve_weight": 2.0}, "searched_right", 3.0),  # 2·1 + 1
    # The authors' Stage 1: +0.5 for a search with a correct format, format 0 / -1, answer weight 1
    (AUTHORS_STAGE1, "searched_right", 1.5),  # 0.5 + 0 + 1
    (AUTHORS_STAGE1, "searched_no_think", 0.0),  # search not paid (format bad): 0 - 1 + 1
    (AUTHORS_STAGE1, "guessed_right", 1.0),  # 0 + 0 + 1
    (AUTHORS_STAGE1, "searched_partial", 0.5 + 0.0 + 2 / 3),
    # Stage 2 (retrieve_weight 0; format 0 / -2; answer_weight 1, F1)
    ({"stage": 2}, "searched_right", 1.0),  # 0·1 + 0 + 1
    ({"stage": 2}, "searched_partial", 0.0 + 0.0 + 2 / 3),
    ({"stage": 2}, "searched_wrong", 0.0),
    ({"stage": 2}, "guessed_right", 1.0),  # 0·(-1) + 0 + 1
    ({"stage": 2}, "searched_no_think", -1.0),  # 0 - 2 + 1: the paper's sum
    ({"stage": 2, "answer_requires_format": True}, "searched_no_think", -2.0),  # 0 - 2 + 0
    ({"stage": 2}, "nothing", -2.0),  # 0 - 2 + 0
    ({"stage": 2, "max_answer_words": 2}, "long_answer", -1.5),  # 0 - 2 + 1/2
    ({"stage": 2, "answer_metric": "em"}, "searched_partial", 0.0),
    ({"stage": 2, "answer_metric": "cem"}, "searched_partial", 1.0),
    ({"stage": 2, "answer_metric": "cem_substr"}, "searched_partial", 1.0),
    ({"stage": 2, "answer_metric": "em"}, "searched_right", 1.0),
    ({"stage": 2, "retrieve_weight": 0.5}, "searched_right", 1.5),  # 0.5·1 + 0 + 1
    ({"stage": 2, "retrieve_weight": 0.5}, "guessed_right", 0.5),  # 0.5·(-1) + 0 + 1
    ({"stage": 2, "retrieve_weight": 1.0, "retrieve_miss": -0.5}, "guessed_right", 0.5),  # -0.5 + 0 + 1
    ({"stage": 2, "format_ok": 0.25, "format_bad": -3.0, "answer_weight": 2.0}, "searched_right", 2.25),  # 0 + 0.25 + 2·1
    ({"stage": 2, "format_ok": 0.25, "format_bad": -3.0, "answer_weight": 2.0}, "searched_no_think", -1.0),  # -3 + 2·1
]


@pytest.mark.parametrize("kwargs, name, expected", HAND, ids=[f"{i}-{c[1]}" for i, c in enumerate(HAND)])
def test_presets_and_magnitudes_give_the_old_formulas_numbers(kwargs, name, expected):
    cfg = RewardConfig(**kwargs)
    r = compute_reward(TRAJS[name], GOLDS, cfg, T)
    assert bits(r.total) == bits(expected)
    assert bits(r.total, r.retrieve, r.format, r.answer) == bits(*old_compute_reward(TRAJS[name], GOLDS, cfg))
    assert r.terms == {"retrieve": r.retrieve, "format": r.format, "answer": r.answer}


GRID = [dict(stage=s, **extra) for s in (1, 2) for extra in (
    {}, {"require_think": False}, {"max_answer_words": 2}, {"retrieve_weight": 0.5}, {"retrieve_weight": -1.0},
    {"retrieve_hit": 0.5, "retrieve_miss": 0.0}, {"retrieve_requires_format": True}, {"format_ok": 0.3, "format_bad": -0.7},
    {"answer_weight": 0.5}, {"answer_weight": -2.0}, {"answer_requires_format": True},
    {"answer_metric": "em"}, {"answer_metric": "cem"}, {"answer_metric": "cem_substr"},
)] + [AUTHORS_STAGE1]


@pytest.mark.parametrize("kwargs", GRID, ids=[json.dumps(g) for g in GRID])
def test_every_option_on_every_trajectory_is_bit_identical_to_the_old_formula(kwargs):
    cfg = RewardConfig(**kwargs)
    for name, t in TRAJS.items():
        r = compute_reward(t, GOLDS, cfg, T)
        assert bits(r.total, r.retrieve, r.format, r.answer) == bits(*old_compute_reward(t, GOLDS, cfg)), name


@pytest.mark.parametrize("path", [ROOT / "configs" / "demo-cpu.yaml", ROOT / "src" / "searchrl" / "configs" / "demo-cpu.yaml"])
def test_the_demo_recipes_rewards_are_the_old_floats(path):
    cfg = load_config(TrainConfig, path)
    for stage in (cfg.stage1, cfg.stage2):
        assert stage.reward.terms == {}  # the paper recipe: no optional term
        assert [name for name, _, _ in stage.reward.stage_terms()] == ["retrieve", "format", "answer"]
        for name, t in TRAJS.items():
            r = compute_reward(t, GOLDS, stage.reward, T)
            assert bits(r.total, r.retrieve, r.format, r.answer) == bits(*old_compute_reward(t, GOLDS, stage.reward)), name
    # The demo's figures, worked out: Stage 1 pays search + format (think not required), Stage 2 F1 + format.
    assert compute_reward(TRAJS["searched_no_think"], GOLDS, cfg.stage1.reward, T).total == 2.0
    assert compute_reward(TRAJS["searched_no_think"], GOLDS, cfg.stage2.reward, T).total == 1.0
    assert compute_reward(TRAJS["nothing"], GOLDS, cfg.stage2.reward, T).total == -2.0


SHIPPED = sorted((ROOT / "configs").glob("*.yaml")) + sorted((ROOT / "src" / "searchrl" / "configs").glob("*.yaml"))
# The recipes that set no optional term: a run of one saved before reward terms loads as it did.
WITHOUT_TERMS = [p for p in SHIPPED if "terms:" not in p.read_text()]


@pytest.mark.parametrize("path", WITHOUT_TERMS, ids=[f"{p.parent.name}/{p.name}" for p in WITHOUT_TERMS])
def test_saved_configs_from_before_terms_still_load(path, tmp_path):
    cfg = load_config(TrainConfig, path)
    dump_config(cfg, tmp_path / "config.yaml")
    data = yaml.safe_load((tmp_path / "config.yaml").read_text())
    for stage in ("stage1", "stage2"):  # a run trained before reward terms saved no `terms` key
        assert data[stage]["reward"].pop("terms") == {}
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    assert load_config(TrainConfig, tmp_path / "old.yaml") == cfg
    assert load_config(TrainConfig, tmp_path / "config.yaml") == cfg


def test_optional_terms_add_what_they_say_and_round_trip(tmp_path):
    (tmp_path / "run.yaml").write_text(
        "stage2:\n  reward:\n    stage: stage2\n    terms:\n"
        "      duplicate_query: {penalty: 0.25}\n"
        "      tool_cost: {weight: 2, per_call: 0.125}\n"
    )
    cfg = load_config(TrainConfig, tmp_path / "run.yaml")
    reward = cfg.stage2.reward
    assert [name for name, _, _ in reward.stage_terms()] == ["retrieve", "format", "answer", "duplicate_query", "tool_cost"]
    # three searches, the third repeats the first (casefolded): one repeat
    t = traj([*SEARCH, *SEARCH, *SEARCH, P("so</think><answer>Tessaly</answer>")],
             queries=["Quellbridge river", "Tessaly", "quellbridge  RIVER"])
    r = compute_reward(t, GOLDS, reward, T)
    old_total = old_compute_reward(t, GOLDS, reward)[0]  # 0 + 0 + 1
    assert r.terms == {"retrieve": 0.0, "format": 0.0, "answer": 1.0, "duplicate_query": -0.25, "tool_cost": 2 * -0.375}
    assert r.total == old_total - 0.25 - 0.75 == 0.0
    # the off-recipe terms change nothing for a rollout without searches
    guess = compute_reward(TRAJS["guessed_right"], GOLDS, reward, T)
    assert (guess.terms["duplicate_query"], guess.terms["tool_cost"], guess.total) == (-0.0, -0.0, 1.0)
    # a resumed run reads its config.yaml back, extra terms included
    dump_config(cfg, tmp_path / "config.yaml")
    assert load_config(TrainConfig, tmp_path / "config.yaml") == cfg
    # per-tool costs: a tool named in per_tool costs its own price
    priced = RewardConfig(terms={"tool_cost": {"per_call": 1.0, "per_tool": {"search": 0.5}}})
    assert compute_reward(t, GOLDS, priced, T).terms["tool_cost"] == -1.5


def test_term_config_errors_say_what_to_fix(tmp_path):
    def load(terms: str):
        (tmp_path / "bad.yaml").write_text(f"stage2:\n  reward:\n    terms: {terms}\n")
        return load_config(TrainConfig, tmp_path / "bad.yaml")

    with pytest.raises(SearchRLError, match=r"unknown reward term 'brevity'; choose one of: .*duplicate_query.*tool_cost"):
        load("{brevity: {}}")
    with pytest.raises(SearchRLError, match=r"stage2.reward.terms.*'format' is a term of every stage: set its magnitudes with format_ok / format_bad"):
        load("{format: {weight: 2}}")
    with pytest.raises(SearchRLError, match=r"reward term 'duplicate_query': penlty: Extra inputs .* \(its parameters: penalty\)"):
        load("{duplicate_query: {penlty: 1}}")
    with pytest.raises(SearchRLError, match=r"reward term 'tool_cost': per_call: Input should be a valid number"):
        load("{tool_cost: {per_call: cheap}}")
    with pytest.raises(SearchRLError, match=r"weight"):
        load("{tool_cost: {weight: heavy}}")
    assert load("{duplicate_query: }").stage2.reward.terms["duplicate_query"].params == {"penalty": 0.5}  # no keys: defaults


def _length_penalty(x: RewardInput, *, per_token: float = 0.01) -> float:
    """Minus `per_token` per response token the policy sampled."""
    return -per_token * sum(x.traj.loss_mask)


if "length_penalty" not in REWARD_TERMS:  # a user's module registers its term when it is imported
    REWARD_TERMS.register("length_penalty")(_length_penalty)


def test_a_users_term_is_in_the_total_and_in_the_logged_metrics(world, tmp_path):
    cfg = RewardConfig(stage=1, terms={"length_penalty": {"weight": 2.0, "per_token": 0.25}})
    t = Trajectory("q", "?", [], [1, 2, 3, 4], [1, 1, 0, 1], [0.0] * 4, [P("nothing")])
    r = compute_reward(t, GOLDS, cfg, T)
    assert r.terms["length_penalty"] == 2.0 * -0.25 * 3 and r.total == -1.0 - 1.0 + 0.0 - 1.5

    from searchrl.rl import trainer
    from searchrl.runlog import read_metrics

    run = trainer.train(load_config(TrainConfig, None, [
        "model=tiny-random", f"retrieval.index={world / 'index'}", f"out={tmp_path / 'run'}",
        f"protocol.template={world / 'prompt.txt'}", f"stage1.dataset={world / 'q.jsonl'}",
        "stage1.steps=1", "stage1.prompts_per_step=2", "stage1.samples_per_prompt=2", "stage2.enabled=false",
        "rollout.max_new_tokens=6", "rollout.top_p=1.0", "logging.progress=false", "logging.report_to=[]",
        "stage1.reward.terms.length_penalty.per_token=0.5",
    ]))
    [rec] = read_metrics(run)
    samples = [json.loads(line) for line in (run / "samples" / "step_0001.jsonl").read_text().splitlines()]
    assert len(samples) == 4
    assert rec["reward/length_penalty"] == pytest.approx(-0.5 * rec["response_tokens"]) != 0
    assert rec["reward/length_penalty"] == pytest.approx(sum(s["reward"]["terms"]["length_penalty"] for s in samples) / 4)
    assert rec["reward"] == pytest.approx(sum(rec[f"reward/{n}"] for n in ("retrieve", "format", "answer", "length_penalty")))
    assert (rec["reward/retrieve"], rec["reward/format"], rec["reward/answer"]) == (
        rec["reward_retrieve"], rec["reward_format"], rec["reward_answer"])


def test_every_term_has_a_docstring_and_its_examples_pass():
    import doctest

    import searchrl.reward_terms

    for name in ("retrieve", "format", "answer", "tool_cost", "duplicate_query"):
        assert ">>>" in (REWARD_TERMS.get(name).__doc__ or ""), name
    result = doctest.testmod(searchrl.reward_terms)
    assert result.attempted >= 15 and result.failed == 0


USER_TERMS = '''
from searchrl.reward_terms import RewardInput

def length_penalty(x: RewardInput, *, per_word: float = 0.01) -> float:
    return -per_word * len((x.prediction or "").split())

def two_inputs(x, y, *, scale: float = 1.0) -> float:
    return 0.0

def wrong_input(x: str, *, scale: float = 1.0) -> float:
    return 0.0

NOT_A_TERM = 3
'''


@pytest.fixture
def user_terms(tmp_path, monkeypatch):
    (tmp_path / "myterms.py").write_text(USER_TERMS)
    (tmp_path / "brokenterms.py").write_text("import nonexistent_package_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("myterms", "brokenterms"):
        sys.modules.pop(name, None)


def test_a_term_named_by_import_path_needs_no_registering(user_terms):
    (user_terms / "cfg.yaml").write_text(
        'stage2:\n  reward:\n    terms:\n      "myterms:length_penalty": {weight: 2.0, per_word: 0.25}\n')
    reward = load_config(TrainConfig, user_terms / "cfg.yaml").stage2.reward
    assert "myterms:length_penalty" not in REWARD_TERMS
    assert reward.stage_terms()[-1] == ("myterms:length_penalty", 2.0, {"per_word": 0.25})
    t = TRAJS["searched_partial"]  # answers "the Tessaly river": 3 words, F1 2/3
    plain, priced = compute_reward(t, GOLDS, RewardConfig(), T), compute_reward(t, GOLDS, reward, T)
    assert priced.terms["myterms:length_penalty"] == 2.0 * -0.25 * 3
    assert priced.total == plain.total - 1.5
    # its parameters are checked against its signature, as a registered term's are
    with pytest.raises(ValueError, match=r"reward term .myterms:length_penalty.: per_wrd: Extra inputs .* \(its parameters: per_word\)"):
        RewardConfig(terms={"myterms:length_penalty": {"per_wrd": 1}})
    assert RewardConfig(terms={"myterms:length_penalty": None}).terms["myterms:length_penalty"].params == {"per_word": 0.01}


@pytest.mark.parametrize(("name", "message"), [
    ("nosuchmodule_xyz:f", r"reward term nosuchmodule_xyz:f: cannot import nosuchmodule_xyz \(ModuleNotFoundError: No module named 'nosuchmodule_xyz'\); is its package installed"),
    ("brokenterms:f", r"reward term brokenterms:f: cannot import brokenterms .*nonexistent_package_xyz.*PYTHONPATH"),
    ("myterms:missing", r"^reward term myterms:missing: myterms has no missing$"),
    ("myterms:", r"^reward term myterms:: give an import path as package.module:name$"),
    ("brevity", r"^unknown reward term 'brevity'; choose one of: .*tool_cost, or give your own as package.module:name$"),
])
def test_a_bad_term_path_is_a_one_line_error(user_terms, name, message):
    with pytest.raises(SearchRLError, match=message) as exc:
        RewardConfig(terms={name: {}})
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(("name", "message"), [
    ("myterms:NOT_A_TERM", r"reward term 'myterms:NOT_A_TERM' is a int, not a function \(x: RewardInput, \*, param=default, ...\)"),
    ("myterms:two_inputs", r"reward term 'myterms:two_inputs' takes \(x, y, \*, scale: float = 1.0\) -> float; it must be a function"),
    ("myterms:wrong_input", r"reward term 'myterms:wrong_input' takes \(x: str, .*\) -> float; it must be a function"),
])
def test_an_object_that_is_no_term_is_refused_where_the_config_names_it(user_terms, name, message):
    (user_terms / "cfg.yaml").write_text(f'stage2:\n  reward:\n    terms:\n      "{name}": {{}}\n')
    with pytest.raises(SearchRLError, match=r"stage2.reward.terms: " + message):
        load_config(TrainConfig, user_terms / "cfg.yaml")
