"""Format check and stage rewards: hand cases per rule and magnitude, and property-based tests
over adversarial outputs (unclosed/nested tags, forged documents, garbage, many/huge searches)."""

from __future__ import annotations

import json
import math
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from searchrl.data.trajectory import Segment, Trajectory
from searchrl.errors import SearchRLError
from searchrl.protocols.format_rules import FORMAT_RULES, check_segments
from searchrl.protocols.tagged import TagProtocol
from searchrl.protocols.tags import R1SEARCHER_TAGS, SEARCH_R1_TAGS, TagSet
from searchrl.rewards import REWARD_STAGES, RewardConfig, compute_reward

T = R1SEARCHER_TAGS
QO, QC, DO, DC = T.query_open, T.query_close, T.docs_open, T.docs_close


def P(text: str) -> Segment:
    return Segment(text, "policy")


def E(
    body: str = "(1)Title: Quellbridge Text: A town on the Tessaly.", tags: TagSet = T
) -> Segment:
    return Segment(f"\n\n{tags.docs_open}\n{body}\n{tags.docs_close}\n\n", "env")


def traj(
    segments, question="Which river flows through Quellbridge?", n_searches=None, answer=None
) -> Trajectory:
    n = sum(s.source == "env" for s in segments) if n_searches is None else n_searches
    return Trajectory("q", question, [], [], [], [], list(segments), n_searches=n, answer=answer)


GOOD = [
    P(f" I need the river. {QO}Quellbridge river{QC}"),
    E(),
    P("It is the Tessaly.</think>\n\n <answer>Tessaly</answer>\n"),
]


def failed(segments, **kw) -> list[str]:
    kw.setdefault("question", "Which river flows through Quellbridge?")
    return check_segments(segments, kw.pop("tags", T), **kw).failed


# ---------------------------------------------------------------------------------------------
# Hand cases, one rule at a time


def test_well_formed_trajectories_pass():
    assert TagProtocol(T).check_format(traj(GOOD)).ok
    assert failed([P(" no search needed</think><answer>yes</answer>")]) == []
    assert failed([P("<think> a</think>\n<answer>b</answer>")], think_opened_in_prompt=False) == []
    sr = SEARCH_R1_TAGS
    good_sr = [
        P("<search>Quellbridge river</search>"),
        E(tags=sr),
        P("so</think><answer>Tessaly</answer>"),
    ]
    assert failed(good_sr, tags=sr) == []


@pytest.mark.parametrize(
    "segments, kwargs",
    [
        ([P("no close <answer>x</answer>")], {}),
        ([P("a</think> b</think><answer>x</answer>")], {}),
        ([P("<think>again</think><answer>x</answer>")], {}),  # the prompt opened it already
        ([P("a</think><answer>x</answer>")], {"think_opened_in_prompt": False}),
        ([P("preamble <think>a</think><answer>x</answer>")], {"think_opened_in_prompt": False}),
    ],
)
def test_rule_think(segments, kwargs):
    assert "think" in failed(segments, **kwargs)


def test_require_think_off_drops_only_the_think_rule():
    # What a 135M model writes: it searches, then answers without closing </think>.
    tiny = [P(f" look {QO}Quellbridge river{QC}"), E(), P("Tessaly\n<answer>Tessaly</answer>")]
    assert failed(tiny) == ["think"]
    assert failed(tiny, require_think=False) == []
    assert failed([P("a</think> more</think><answer>x</answer>")], require_think=False) == []
    # The answer rules still hold, and so does everything else.
    assert failed([P("no answer at all")], require_think=False) == ["answer"]
    assert failed([P("<answer>x</answer> and then more")], require_think=False) == ["answer"]
    assert failed([P(f"{DO}forged{DC}<answer>x</answer>")], require_think=False) == ["forged_documents"]
    cfg = RewardConfig(stage=1, require_think=False)
    assert compute_reward(traj(tiny), ["Tessaly"], cfg, T).total == 2.0
    assert compute_reward(traj(tiny), ["Tessaly"], RewardConfig(stage=1), T).total == 0.0


@pytest.mark.parametrize(
    "text",
    [
        "reasoning</think> and no answer",
        "a</think><answer>x</answer><answer>y</answer>",
        "a</think><answer>   </answer>",
        "a</think><answer>x</answer> and more words",
        "a</think> The answer is: <answer>x</answer>",
        "a</think><answer>x",
        "a<answer>early</answer></think>",
    ],
)
def test_rule_answer(text):
    assert "answer" in failed([P(text)])


def test_rule_garbled_judges_policy_text_only():
    assert failed([P("caf\ufffd</think><answer>x</answer>")]) == ["garbled"]
    assert failed([P("bell\x07</think><answer>x</answer>")]) == ["garbled"]
    assert failed([P("\ue000 private</think><answer>x</answer>")]) == ["garbled"]
    assert failed([P("tabs\tand\r\nnewlines</think><answer>x</answer>")]) == []
    assert failed([GOOD[0], E("broken \ufffd bytes \x00 in a passage"), GOOD[2]]) == []


def test_rule_script_rejects_cjk_outside_documents_unless_the_question_has_it():
    cjk = [P("答案是</think><answer>x</answer>")]
    assert failed(cjk) == ["script"]
    assert failed(cjk, question="泰萨利河流经哪个城镇？") == []
    assert failed([P("안녕</think><answer>x</answer>")]) == ["script"]
    assert failed([GOOD[0], E("(1)Title: 鄂尔多斯 Text: 中科飞宇"), GOOD[2]]) == []


@pytest.mark.parametrize(
    "middle",
    [
        f"{QO}unclosed ",
        f"{QO}outer {QO}nested{QC}",
        f"stray {QC}",
        f"{QO}   {QC}",
        f"{QO}ask</think>{QC}",
    ],
)
def test_rule_query(middle):
    assert "query" in failed([P(f"a {middle} b</think><answer>x</answer>")])


def test_rule_forged_documents_is_decided_by_provenance():
    forged_text = (
        f"{QO}q{QC}\n\n{DO}\n(1)Title: Fake Text: made up\n{DC}\n\nso</think><answer>x</answer>"
    )
    assert failed([P(forged_text)]) == ["forged_documents"]
    assert failed([P(f"I will not write {DC} here</think><answer>x</answer>")]) == [
        "forged_documents"
    ]
    # a tag split over two policy segments is still the policy's
    assert "forged_documents" in failed(
        [P("a <|begin_of_"), P("documents|> b</think><answer>x</answer>")]
    )
    # the same block inserted by the environment is fine
    assert (
        failed(
            [
                P(f"{QO}q{QC}"),
                E("(1)Title: Real Text: retrieved"),
                P("so</think><answer>x</answer>"),
            ]
        )
        == []
    )


def test_rule_answer_tags():
    assert failed([P("a</think><answer>see <think> here</answer>")]) == ["think", "answer_tags"]
    assert set(failed([P(f"a</think><answer>x {DO}</answer>")])) == {
        "forged_documents",
        "answer_tags",
    }
    # documents inserted inside the answer region still put a documents tag in the answer
    assert "answer_tags" in failed([P(f"a</think><answer>x {QO}q{QC}"), E(), P("</answer>")])


def test_rule_answer_length_is_optional():
    eleven = [P("a</think><answer>" + " ".join(["w"] * 11) + "</answer>")]
    ten = [P("a</think><answer>" + " ".join(["w"] * 10) + "</answer>")]
    assert failed(eleven) == []
    assert failed(eleven, max_answer_words=10) == ["answer_length"]
    assert failed(ten, max_answer_words=10) == []


# ---------------------------------------------------------------------------------------------
# Stage rewards and magnitudes


def test_stage1_paper_magnitudes():
    cfg = RewardConfig(stage=1)
    assert cfg.stage == "stage1"
    assert compute_reward(traj(GOOD), ["Tessaly"], cfg, T).total == 2.0  # +1 searched, +1 format
    no_search = traj([P("a</think><answer>Tessaly</answer>")])
    assert compute_reward(no_search, ["Tessaly"], cfg, T).total == 0.0  # -1 + 1
    bad = traj([P(f"{QO}q{QC}"), E(), P("no answer")])
    r = compute_reward(bad, ["Tessaly"], cfg, T)
    assert (r.total, r.retrieve, r.format, r.answer, r.format_ok) == (0.0, 1.0, -1.0, 0.0, False)
    assert r.failed_rules == ["think", "answer"]
    assert compute_reward(traj([P("nothing")]), ["Tessaly"], cfg, T).total == -2.0


def test_stage2_paper_magnitudes_and_metric_choice():
    long_answer = traj([*GOOD[:2], P("so</think><answer>the Tessaly river</answer>")])
    by_metric = {
        m: compute_reward(long_answer, ["Tessaly"], RewardConfig(answer_metric=m), T).total
        for m in ("f1", "em", "cem", "cem_substr")
    }
    assert by_metric == {"f1": pytest.approx(2 / 3), "em": 0.0, "cem": 1.0, "cem_substr": 1.0}
    r = compute_reward(traj(GOOD), ["Tessaly"], RewardConfig(stage=2), T)
    assert (r.total, r.retrieve, r.format, r.answer, r.answer_score) == (1.0, 0.0, 0.0, 1.0, 1.0)
    forged = traj([P(f"{DO}fake{DC}</think><answer>Tessaly</answer>")])
    r = compute_reward(forged, ["Tessaly"], RewardConfig(), T)
    assert (r.total, r.format, r.answer) == (
        -1.0,
        -2.0,
        1.0,
    )  # the paper's sum: R_answer + R_format
    r = compute_reward(forged, ["Tessaly"], RewardConfig(answer_requires_format=True), T)
    assert (r.total, r.answer, r.answer_score) == (-2.0, 0.0, 1.0)


def test_every_magnitude_is_configuration():
    # The authors' code's Stage 1: answer reward plus 0.5 only when it searched with a correct format.
    authors = RewardConfig(
        stage="stage1",
        retrieve_hit=0.5,
        retrieve_miss=0.0,
        retrieve_requires_format=True,
        format_ok=0.0,
        format_bad=-1.0,
        answer_weight=1.0,
    )
    assert compute_reward(traj(GOOD), ["Tessaly"], authors, T).total == 1.5
    searched_bad = traj([P(f"{QO}q{QC}"), E(), P("so<answer>Tessaly</answer>")])  # no </think>
    r = compute_reward(searched_bad, ["Tessaly"], authors, T)
    assert (r.retrieve, r.format, r.answer, r.total) == (0.0, -1.0, 1.0, 0.0)
    scaled = RewardConfig(format_ok=0.25, format_bad=-3.0, answer_weight=2.0)
    assert compute_reward(traj(GOOD), ["Tessaly"], scaled, T).total == 2.25
    capped = RewardConfig(max_answer_words=1)
    long_answer = traj([*GOOD[:2], P("so</think><answer>the Tessaly river</answer>")])
    assert compute_reward(long_answer, ["Tessaly"], capped, T).failed_rules == ["answer_length"]


def test_engine_answer_wins_and_breakdown_serialises():
    t = traj(GOOD, answer="Velmar")
    r = compute_reward(t, ["Tessaly"], RewardConfig(), T)
    assert r.answer_score == 0.0
    assert set(r.to_dict()) == {
        "total",
        "retrieve",
        "format",
        "answer",
        "format_ok",
        "failed_rules",
        "answer_score",
        "terms",
    }
    assert r.to_dict()["terms"] == {"retrieve": 0.0, "format": 0.0, "answer": 0.0}


def test_reward_config_validation():
    assert REWARD_STAGES.names() == ["stage1", "stage2"]
    assert RewardConfig(stage="2").stage == "stage2"
    with pytest.raises(SearchRLError, match="stage3"):
        RewardConfig(stage=3)
    with pytest.raises(SearchRLError, match="bleu"):
        RewardConfig(answer_metric="bleu")
    with pytest.raises(ValidationError):
        RewardConfig(max_answer_words=0)
    with pytest.raises(ValidationError):
        RewardConfig(format_good=1.0)  # typo'd keys are errors


# ---------------------------------------------------------------------------------------------
# Property-based tests

PRESETS = st.sampled_from([R1SEARCHER_TAGS, SEARCH_R1_TAGS])
SAFE = st.text(alphabet=string.ascii_letters + string.digits + " \n\t.,;:!?'\"()-éüß—", max_size=60)
WORDS = st.text(alphabet=string.ascii_letters + string.digits + " -'", max_size=40).filter(
    str.strip
)
HUGE = st.integers(1000, 6000).map(lambda n: ("word " * n)[:n].strip() + "x")
ANYTHING = st.text(max_size=80)  # any unicode: CJK, U+FFFD, control characters, tags


@st.composite
def well_formed(draw, tags: TagSet, think_opened_in_prompt: bool = True):
    """A protocol-following response: think text and searches (with env documents holding
    anything at all), then `</think>` and one answer."""
    segs = [P("" if think_opened_in_prompt else tags.think_open)]
    for _ in range(draw(st.integers(0, 30))):
        query = draw(st.one_of(WORDS, HUGE))
        segs.append(P(draw(SAFE) + tags.query_open + query + tags.query_close))
        body = draw(st.one_of(ANYTHING, st.sampled_from(tags.all_tags())))
        segs.append(E(body, tags))
    segs.append(P(draw(SAFE) + tags.think_close + draw(st.sampled_from(["", "\n", "\n\n "]))))
    segs.append(
        P(tags.answer_open + draw(WORDS) + tags.answer_close + draw(st.sampled_from(["", "\n"])))
    )
    return segs


@settings(max_examples=80, deadline=None)
@given(
    PRESETS.flatmap(
        lambda t: st.tuples(st.just(t), st.booleans()).flatmap(
            lambda tb: st.tuples(st.just(tb[0]), st.just(tb[1]), well_formed(tb[0], tb[1]))
        )
    )
)
def test_well_formed_responses_pass_and_earn_full_stage1_reward(case):
    tags, opened, segments = case
    verdict = check_segments(
        segments, tags, question="an English question", think_opened_in_prompt=opened
    )
    assert verdict.ok, verdict.failed
    t = traj(segments)
    r = compute_reward(t, ["x"], RewardConfig(stage=1), tags, think_opened_in_prompt=opened)
    assert r.total == (2.0 if t.n_searches else 0.0)


@settings(max_examples=80, deadline=None)
@given(PRESETS.flatmap(lambda t: st.tuples(st.just(t), well_formed(t), st.data())))
def test_any_documents_tag_written_by_the_policy_fails(case):
    tags, segments, data = case
    policy = [i for i, s in enumerate(segments) if s.source == "policy"]
    i = data.draw(st.sampled_from(policy))
    text = segments[i].text
    at = data.draw(st.integers(0, len(text)))
    tag = data.draw(st.sampled_from([tags.docs_open, tags.docs_close]))
    segments[i] = P(text[:at] + tag + text[at:])
    verdict = check_segments(segments, tags)
    assert not verdict.ok and "forged_documents" in verdict.failed


@settings(max_examples=80, deadline=None)
@given(
    PRESETS.flatmap(
        lambda t: st.tuples(
            st.just(t),
            well_formed(t),
            st.sampled_from(
                [
                    "drop_think_close",
                    "second_answer",
                    "unclosed_query",
                    "garbage",
                    "cjk",
                    "nested_query",
                ]
            ),
        )
    )
)
def test_mutations_of_well_formed_responses_fail_the_right_rule(case):
    tags, segments, mutation = case
    last_think = max(i for i, s in enumerate(segments) if tags.think_close in s.text)
    text = segments[last_think].text
    expected = {
        "drop_think_close": ("think", text.replace(tags.think_close, " ")),
        "second_answer": (
            "answer",
            text.replace(
                tags.think_close, f"{tags.answer_open}a{tags.answer_close}{tags.think_close}"
            ),
        ),
        "unclosed_query": ("query", tags.query_open + "half a query " + text),
        "nested_query": (
            "query",
            f"{tags.query_open}a {tags.query_open}b{tags.query_close}" + text,
        ),
        "garbage": ("garbled", "\ufffd" + text),
        "cjk": ("script", "漢字" + text),
    }
    rule, new_text = expected[mutation]
    segments[last_think] = P(new_text)
    assert rule in check_segments(segments, tags, question="an English question").failed


FRAGMENTS = st.one_of(
    st.sampled_from(R1SEARCHER_TAGS.all_tags() + SEARCH_R1_TAGS.all_tags()),
    st.sampled_from(["<|begin_of", "documents|>", "</", "<answer", "|>", "\n\n", " "]),
    ANYTHING,
    st.binary(max_size=30).map(lambda b: b.decode("utf-8", errors="replace")),
)
SEGMENTS = st.lists(
    st.tuples(st.lists(FRAGMENTS, max_size=8).map("".join), st.sampled_from(["policy", "env"])),
    max_size=10,
).map(lambda xs: [Segment(t, s) for t, s in xs])


@settings(max_examples=300, deadline=None)
@given(SEGMENTS, PRESETS, st.booleans(), st.sampled_from([None, 1, 10]), st.sampled_from([1, 2]))
def test_adversarial_outputs_never_crash_and_verdicts_are_consistent(
    segments, tags, opened, cap, stage
):
    verdict = check_segments(
        segments, tags, question="q", think_opened_in_prompt=opened, max_answer_words=cap
    )
    assert verdict.ok == (not verdict.failed)
    assert set(verdict.failed) <= set(FORMAT_RULES) and len(set(verdict.failed)) == len(
        verdict.failed
    )
    if any(
        s.source == "policy" and (tags.docs_open in s.text or tags.docs_close in s.text)
        for s in segments
    ):
        assert "forged_documents" in verdict.failed
    r = compute_reward(
        traj(segments),
        ["gold"],
        RewardConfig(stage=stage, max_answer_words=cap),
        tags,
        think_opened_in_prompt=opened,
    )
    assert math.isfinite(r.total) and r.total == r.retrieve + r.format + r.answer
    assert r.format_ok == verdict.ok
    assert (-2.0 <= r.total <= 2.0) if stage == 1 else (-2.0 <= r.total <= 1.0)


def test_docstring_examples():
    import doctest

    import searchrl.protocols.format_rules
    import searchrl.rewards

    for module, least in ((searchrl.rewards, 4), (searchrl.protocols.format_rules, 3)):
        result = doctest.testmod(module)
        assert result.attempted >= least and result.failed == 0, module.__name__


def test_format_check_command_reads_all_three_record_shapes(tmp_path, capsys):
    from searchrl.errors import DataError
    from searchrl.eval.format_check import format_check_command

    good_text = "".join(s.text for s in GOOD)
    lines = [
        traj(GOOD).to_dict(tokens=False),  # ours: provenance recorded
        {"question": "q", "segments": [{"text": f"{DO}x{DC}</think><answer>a</answer>", "source": "policy"}]},
        {"question": "q", "gen_text_store": good_text},  # provenance rebuilt from the tags
        {"question": "q", "response": "no format at all"},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    result = format_check_command(path, "r1searcher", None, True, as_json=False)
    assert (result["n"], result["ok"]) == (4, 2)
    assert result["failures"]["forged_documents"] == 1 and result["failures"]["answer"] == 1
    assert "2/4 pass the format check (50.0%)" in capsys.readouterr().out
    path.write_text('{"response": "x"}\n{not json\n')
    with pytest.raises(DataError, match=r"t.jsonl:2: invalid JSON"):
        format_check_command(path, "r1searcher", None, True, as_json=True)
    path.write_text('{"question": "q"}\n')
    with pytest.raises(DataError, match="record 1: no `segments`"):
        format_check_command(path, "r1searcher", None, True, as_json=True)


def test_retrieve_weight_in_stage2_keeps_search_worth_its_cost():
    searched, guessed = traj(GOOD), traj([P(" I know it.</think><answer>Tessaly</answer>")])
    paper = RewardConfig(stage=2)
    assert compute_reward(searched, ["Tessaly"], paper, T).total == compute_reward(guessed, ["Tessaly"], paper, T).total == 1.0
    kept = RewardConfig(stage=2, retrieve_weight=0.5)
    a, b = compute_reward(searched, ["Tessaly"], kept, T), compute_reward(guessed, ["Tessaly"], kept, T)
    assert (a.retrieve, a.total, b.retrieve, b.total) == (0.5, 1.5, -0.5, 0.5)


def test_a_stage_is_a_preset_of_the_same_fields():
    one, two = RewardConfig(stage=1), RewardConfig(stage="stage2")
    assert (one.retrieve_weight, one.format_ok, one.format_bad, one.answer_weight) == (1.0, 1.0, -1.0, 0.0)
    assert (two.retrieve_weight, two.format_ok, two.format_bad, two.answer_weight) == (0.0, 0.0, -2.0, 1.0)
    mixed = RewardConfig(stage=1, answer_weight=1.0)  # set fields win over the preset
    assert (mixed.retrieve_weight, mixed.answer_weight) == (1.0, 1.0)
    # A resumed run reads its config.yaml back: the dumped fields reproduce the config exactly.
    assert RewardConfig.model_validate(mixed.model_dump()) == mixed
