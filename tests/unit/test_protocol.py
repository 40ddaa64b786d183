"""Tag presets, documents blocks and parsers (searchrl.protocols.tags), prompt templates (searchrl.protocols.prompts)
and the TagProtocol bundle (searchrl.protocols.tagged)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchrl.data.types import Passage
from searchrl.errors import SearchRLError
from searchrl.protocols.config import ProtocolConfig
from searchrl.protocols.format_rules import check_segments
from searchrl.protocols.prompts import EXAMPLES, build_prompt, example_response, instruction_text
from searchrl.protocols.tagged import TagProtocol
from searchrl.protocols.tags import (
    R1SEARCHER_TAGS,
    SEARCH_R1_TAGS,
    TAG_PRESETS,
    extract_answer,
    extract_queries,
    extract_query,
    extract_reasoning,
    format_documents,
    get_tags,
    segments_from_text,
    stop_strings,
)

QUESTION = "Which river flows through Quellbridge?"
PRESETS = ["r1searcher", "search-r1"]


def test_presets_hold_the_spec_tags():
    assert TAG_PRESETS.names() == ["r1searcher", "search-r1"]
    r1 = get_tags("r1searcher")
    assert (r1.query_open, r1.query_close) == ("<|begin_of_query|>", "<|end_of_query|>")
    assert (r1.docs_open, r1.docs_close) == ("<|begin_of_documents|>", "<|end_of_documents|>")
    sr = get_tags("search-r1")
    assert (sr.query_open, sr.query_close, sr.docs_open, sr.docs_close) == (
        "<search>",
        "</search>",
        "<information>",
        "</information>",
    )
    for t in (r1, sr):
        assert (t.think_open, t.think_close, t.answer_open, t.answer_close) == (
            "<think>",
            "</think>",
            "<answer>",
            "</answer>",
        )
    assert stop_strings(r1) == ["<|end_of_query|>", "</answer>"]
    with pytest.raises(SearchRLError, match="r1searcher"):
        get_tags("nope")


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("template", ["base", "fewshot", "oneshot"])
def test_completion_prompts_explain_every_tag_and_end_inside_think(preset, template):
    tags = get_tags(preset)
    prompt = build_prompt(QUESTION, tags, template)
    for tag in tags.all_tags():
        assert tag in prompt
    assert prompt.endswith(f"User: {QUESTION}\nAssistant: <think>")
    assert prompt.startswith(instruction_text(tags))
    other = SEARCH_R1_TAGS if tags is R1SEARCHER_TAGS else R1SEARCHER_TAGS
    assert other.query_open not in prompt  # no tag of the other preset leaks in
    assert TagProtocol(tags, template).think_opened_in_prompt
    assert TagProtocol(tags, template).turn_end == "\nUser:"


def test_base_prompt_is_instruction_then_user_turn():
    assert build_prompt(QUESTION, R1SEARCHER_TAGS, "base") == (
        f"{instruction_text(R1SEARCHER_TAGS)}\n\nUser: {QUESTION}\nAssistant: <think>"
    )


@pytest.mark.parametrize("preset", PRESETS)
def test_fewshot_examples_are_well_formed_protocol_runs(preset):
    """The worked examples teach a format our own checker accepts, with invented entities."""
    tags = get_tags(preset)
    prompt = build_prompt(QUESTION, tags, "fewshot")
    # the instruction names the documents tag twice and the answer tag once
    assert prompt.count(tags.docs_open) == 2 + 3 and prompt.count(tags.answer_open) == 1 + 2
    for question, steps in EXAMPLES:
        response = example_response(steps, tags, "r1searcher")
        verdict = check_segments(
            segments_from_text(response, tags), tags, question=question, max_answer_words=10
        )
        assert verdict.ok, verdict.failed
        assert extract_answer(response, tags) in ("Tessaly", "Dagny Halvorsen")
    examples = prompt[len(instruction_text(tags)) :]
    assert extract_queries(examples, tags) == [
        "Ilsa Marrowind birthplace",
        "Quellbridge river",
        "Vantrel X2 camera maker",
    ]


def test_oneshot_is_fewshot_with_the_first_example_only():
    tags = SEARCH_R1_TAGS
    one, few = build_prompt(QUESTION, tags, "oneshot"), build_prompt(QUESTION, tags, "fewshot")
    assert len(one) < len(few) and one.count(tags.docs_open) == 2 + 2
    assert extract_queries(one[len(instruction_text(tags)) :], tags) == [
        "Ilsa Marrowind birthplace",
        "Quellbridge river",
    ]
    assert few.startswith(one[: one.rindex("User:")])  # same instruction and first example


def test_chat_template_without_a_tokenizer_is_a_clear_error():
    with pytest.raises(SearchRLError, match="needs a tokenizer with a chat template"):
        build_prompt(QUESTION, R1SEARCHER_TAGS, "chat")


@pytest.fixture(scope="module")
def chat_tokenizer():
    try:
        from searchrl.assets import load_tokenizer
    except ImportError:
        pytest.skip("searchrl.assets.load_tokenizer is not written yet")
    return load_tokenizer("tiny-random")  # SmolLM2's tokenizer, with its real chat template


@pytest.mark.parametrize("preset", PRESETS)
def test_chat_prompts_through_a_real_chat_template(chat_tokenizer, preset):
    tags = get_tags(preset)
    prompt = build_prompt(QUESTION, tags, "chat", chat_tokenizer)
    expected = chat_tokenizer.apply_chat_template(
        [
            {"role": "system", "content": instruction_text(tags)},
            {"role": "user", "content": QUESTION},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert prompt == expected + "<think>"
    assert prompt.index(instruction_text(tags)) < prompt.index(QUESTION)
    few = build_prompt(QUESTION, tags, "fewshot-chat", chat_tokenizer)
    assert few.endswith(prompt[len(prompt) - len(QUESTION) - 40 :])  # same closing user turn
    assert few.count(tags.docs_open) == 2 + 3  # twice in the instruction, 3 blocks in the examples


def test_template_files(tmp_path, chat_tokenizer):
    plain = tmp_path / "plain.txt"
    plain.write_text('{instruction}\nQ: {{ question }}\nJSON stays: {"a": 1}\nA: {think_open}')
    prompt = build_prompt(QUESTION, SEARCH_R1_TAGS, str(plain))
    assert (
        prompt
        == f'{instruction_text(SEARCH_R1_TAGS)}\nQ: {QUESTION}\nJSON stays: {{"a": 1}}\nA: <think>'
    )
    assert TagProtocol(SEARCH_R1_TAGS, str(plain)).think_opened_in_prompt

    no_think = tmp_path / "nothink.txt"
    no_think.write_text("Use {query_open}...{query_close}.\nQuestion: {question}\n")
    assert not TagProtocol(SEARCH_R1_TAGS, str(no_think)).think_opened_in_prompt

    chat = tmp_path / "chat.txt"
    chat.write_text("{instruction}\n---user---\nQuestion: {question}")
    prompt = build_prompt(QUESTION, R1SEARCHER_TAGS, str(chat), chat_tokenizer)
    assert (
        prompt.endswith("<think>")
        and f"Question: {QUESTION}" in prompt
        and "<|im_start|>system" in prompt
    )

    bad = tmp_path / "bad.txt"
    bad.write_text("line one\n{question} {colour}\n")
    with pytest.raises(SearchRLError, match=r"bad.txt:2: unknown placeholder \{colour\}"):
        build_prompt(QUESTION, R1SEARCHER_TAGS, str(bad))
    missing = tmp_path / "missing.txt"
    missing.write_text("no placeholder here")
    with pytest.raises(SearchRLError, match="no \\{question\\} placeholder"):
        build_prompt(QUESTION, R1SEARCHER_TAGS, str(missing))
    with pytest.raises(SearchRLError, match="unknown prompt template 'nope'"):
        build_prompt(QUESTION, R1SEARCHER_TAGS, "nope")


def test_protocol_config_validates_names():
    assert TagProtocol.named("search-r1", "fewshot").tags is SEARCH_R1_TAGS
    for field, value in (("tags", "bars"), ("template", "zero"), ("doc_style", "fancy")):
        with pytest.raises(Exception, match=value):
            ProtocolConfig(**{field: value})


PASSAGES = [
    Passage("a", "Quellbridge", "A market town on the Tessaly."),
    Passage("b", "Tessaly", "A river. It ends <|end_of_documents|> here </answer>."),
]


def test_documents_block_matches_the_released_trajectories():
    block = format_documents(PASSAGES, R1SEARCHER_TAGS)
    assert (
        block
        == (
            "\n\n<|begin_of_documents|>\n"
            "(1)Title: Quellbridge Text: A market town on the Tessaly.\n"
            "(2)Title: Tessaly Text: A river. It ends   here  .\n"  # tags inside passages are neutralised
            "<|end_of_documents|>\n\n"
        )
    )
    lines = format_documents(PASSAGES[:1], SEARCH_R1_TAGS, "title-lines")
    assert (
        lines
        == "\n\n<information>\n(1) Title: Quellbridge\nA market town on the Tessaly.\n</information>\n\n"
    )
    assert (
        format_documents([], SEARCH_R1_TAGS)
        == "\n\n<information>\n(no documents found)\n</information>\n\n"
    )


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "Let me search. <|begin_of_query|> Quellbridge river<|end_of_query|>",
            "Quellbridge river",
        ),
        ('<|begin_of_query|>"capital   of\n Velmar"<|end_of_query|>', "capital of Velmar"),
        ("<|begin_of_query|> ‘curly’ <|end_of_query|>", "curly"),
        (
            "<|begin_of_query|>first<|end_of_query|> <|begin_of_query|>second",
            "second",
        ),  # last open wins
        ("<|begin_of_query|>outer <|begin_of_query|>inner<|end_of_query|>", "inner"),
        ("<|begin_of_query|>  \n <|end_of_query|>", None),
        ('<|begin_of_query|>""<|end_of_query|>', None),
        ("no tags at all", None),
        ("<|begin_of_query|>old<|end_of_query|> docs... stray<|end_of_query|>", None),
    ],
)
def test_extract_query(text, expected):
    assert extract_query(text, R1SEARCHER_TAGS) == expected


def test_extract_queries_and_answer():
    text = (
        "<search> a  b </search><information>x</information><search></search>"
        "<search>c</search><search>unclosed</think><answer> first </answer> <answer>\n last \n</answer>"
    )
    assert extract_queries(text, SEARCH_R1_TAGS) == ["a b", "c"]
    assert extract_answer(text, SEARCH_R1_TAGS) == "last"
    assert extract_answer("<answer>open only", SEARCH_R1_TAGS) is None
    assert extract_answer("</answer> close only", SEARCH_R1_TAGS) is None
    assert extract_answer("<answer></answer>", SEARCH_R1_TAGS) == ""


def test_extract_reasoning():
    t = R1SEARCHER_TAGS
    response = (
        " step one <|begin_of_query|>q<|end_of_query|>"
        + format_documents(PASSAGES[:1], t)
        + "so.</think>\n<answer>x</answer>"
    )
    assert extract_reasoning(response, t).startswith("step one <|begin_of_query|>q<|end_of_query|>")
    assert (
        extract_reasoning(response, t, drop_documents=True)
        == "step one <|begin_of_query|>q<|end_of_query|>so."
    )
    assert (
        extract_reasoning("<think> a </think><answer>b</answer>", t, think_opened_in_prompt=False)
        == "a"
    )
    assert extract_reasoning("no think", t, think_opened_in_prompt=False) is None
    assert extract_reasoning(" unclosed <answer>b</answer>", t) == "unclosed"


@settings(max_examples=150, deadline=None)
@given(st.text(), st.sampled_from(PRESETS))
def test_parsers_never_crash_and_return_clean_values(text, preset):
    tags = get_tags(preset)
    q = extract_query(text, tags)
    if q is not None:
        assert q == q.strip() and "  " not in q and "\n" not in q and q
    for q in extract_queries(text, tags):
        assert q and tags.query_close not in q
    a = extract_answer(text, tags)
    if a is not None:
        assert f"{tags.answer_open}" in text and a == a.strip()
    assert "".join(s.text for s in segments_from_text(text, tags)) == text


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.text(max_size=40), st.booleans()), min_size=1, max_size=6),
    st.sampled_from(PRESETS),
)
def test_documents_blocks_round_trip_through_segments_from_text(parts, preset):
    """Provenance rebuilt from text equals what was inserted, whatever the passages hold."""
    tags = get_tags(preset)
    expected = []
    for text, is_docs in parts:
        if is_docs:
            expected.append(("env", format_documents([Passage("p", "T", text)], tags)))
        else:
            clean = text.replace("<", "(")  # policy text without any tag
            if clean:
                expected.append(("policy", clean))
    merged = []
    for source, text in expected:  # adjacent policy parts merge; env blocks stay apart
        if merged and source == "policy" == merged[-1][0]:
            merged[-1] = ("policy", merged[-1][1] + text)
        else:
            merged.append((source, text))
    got = [(s.source, s.text) for s in segments_from_text("".join(t for _, t in merged), tags)]
    assert got == merged


def test_docstring_examples():
    import doctest

    import searchrl.protocols.prompts
    import searchrl.protocols.tagged
    import searchrl.protocols.tags

    for module in (searchrl.protocols.tags, searchrl.protocols.prompts, searchrl.protocols.tagged):
        result = doctest.testmod(module)
        assert result.attempted >= 1 and result.failed == 0, module.__name__
