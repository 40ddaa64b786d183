"""Answer metrics on hand-computed cases; each case pins one rule of the authors' normalisation."""

from __future__ import annotations

import doctest

import pytest

from searchrl import metrics
from searchrl.errors import SearchRLError
from searchrl.metrics import (
    ANSWER_METRICS,
    answer_scores,
    cover_em,
    cover_em_substring,
    exact_match,
    f1_score,
    normalize_answer,
)


def test_doctests_pass() -> None:
    result = doctest.testmod(metrics)
    assert result.attempted >= 10 and result.failed == 0


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("The Beatles", "beatles"),
        ("a tale of an apple", "tale of apple"),
        ("theatre anthem", "theatre anthem"),  # articles only as whole words
        ("U.S.A.", "u s"),  # punctuation becomes a space, then the lone "a" is an article
        ("Rock'n'Roll", "rock n roll"),
        ("O\u2019Neill", "o neill"),  # right curly quote
        ("\u2018quoted\u2019", "quoted"),
        ("caf\u00b4e `x`", "caf e x"),  # acute accent and backtick
        ("New_York_City", "new york city"),
        ("  many   spaces\n\ttabs ", "many spaces tabs"),
        ("True", "yes"),
        ("False", "no"),
        ("true", "true"),  # only the capitalised bare words map
        (
            " False ",
            "false",
        ),  # ...and only without surrounding spaces (parity with the released figures)
        ("", ""),
    ],
)
def test_normalize_answer(raw: str, normalized: str) -> None:
    assert normalize_answer(raw) == normalized


def test_exact_match_max_over_aliases() -> None:
    assert exact_match("J.R.R. Tolkien", ["Tolkien", "J. R. R. Tolkien"]) == 1.0
    assert exact_match("Tolkien", ["J. R. R. Tolkien"]) == 0.0
    assert exact_match("False", ["no"]) == 1.0
    assert exact_match("yes", ["True"]) == 1.0


def test_f1_counter_overlap() -> None:
    # pred tokens: new york new york (4); gold: new york (2); overlap counts min(2,1)+min(2,1) = 2.
    assert f1_score("New York, New York", ["New York"]) == pytest.approx(2 * 0.5 * 1.0 / 1.5)
    # pred "paris france" vs gold "paris": p=1/2, r=1 -> 2/3; best alias "paris france" -> 1.
    assert f1_score("Paris, France", ["Paris"]) == pytest.approx(2 / 3)
    assert f1_score("Paris, France", ["Paris", "Paris France"]) == 1.0
    assert f1_score("London", ["Paris"]) == 0.0


def test_f1_yes_no_rule() -> None:
    # Without the rule, "no" vs "no it is not" would earn p=1, r=1/4 -> 0.4.
    assert f1_score("no", ["no it is not"]) == 0.0
    assert f1_score("no it is not", ["no"]) == 0.0
    assert f1_score("noanswer", ["noanswer given"]) == 0.0
    assert f1_score("No.", ["no"]) == 1.0
    assert f1_score("True", ["yes"]) == 1.0
    # The rule applies per alias: the second alias still gives credit.
    assert f1_score("no way", ["no", "no way"]) == 1.0


def test_cover_variants_differ() -> None:
    # Token cover ignores order and gaps; substring does not.
    assert cover_em("York is in New England", ["New York"]) == 1.0
    assert cover_em_substring("York is in New England", ["New York"]) == 0.0
    # Substring matches inside words; token cover does not.
    assert cover_em("Yorkshire", ["York"]) == 0.0
    assert cover_em_substring("Yorkshire", ["York"]) == 1.0
    # Both agree on an ordinary covered answer, after normalisation.
    assert cover_em("He was born in the U.K.", ["UK", "u k"]) == 1.0
    assert cover_em_substring("He was born in the U.K.", ["u.k."]) == 1.0


@pytest.mark.parametrize("metric", [exact_match, f1_score, cover_em, cover_em_substring])
@pytest.mark.parametrize("prediction", [None, "", "   ", "the", "!!"])
def test_empty_prediction_scores_zero(metric, prediction) -> None:
    assert metric(prediction, ["the", "Paris"]) == 0.0


@pytest.mark.parametrize("metric", [cover_em, cover_em_substring])
def test_gold_that_normalises_to_nothing_covers_nothing(metric) -> None:
    assert metric("anything at all", ["The"]) == 0.0
    assert metric("anything at all", []) == 0.0


def test_registry_names_and_lookup() -> None:
    assert ANSWER_METRICS.names() == ["cem", "cem_substr", "em", "f1"]
    assert ANSWER_METRICS.get("f1") is f1_score
    assert ANSWER_METRICS.get("cem")("born in New York", ["new york"]) == 1.0
    with pytest.raises(SearchRLError, match="cem_substr"):
        ANSWER_METRICS.get("bleu")


def test_answer_scores_all_at_once() -> None:
    assert answer_scores("the Eiffel Tower in Paris", ["Eiffel Tower"]) == {
        "em": 0.0,
        "f1": pytest.approx(2 * (2 / 4) * 1.0 / 1.5),
        "cem": 1.0,
        "cem_substr": 1.0,
    }


@pytest.mark.parametrize(
    ("prediction", "gold"),
    [
        ("Zu\u0308rich", "Z\u00fcrich"),  # decomposed vs precomposed u-umlaut (NFC)
        ("\u201cHamlet\u201d", "Hamlet"),  # curly double quotes, as curly single ones already were
        ("\u201eHamlet\u201c", "Hamlet"),  # German low-high quotes
        ("\u00abHamlet\u00bb", "Hamlet"),  # guillemets
        ("\u22125 degrees", "-5 degrees"),  # minus sign vs hyphen-minus
        ("Jean\u2010Paul", "Jean-Paul"),  # Unicode hyphen vs hyphen-minus
        ("1939\u20141945", "1939\u20131945"),  # em dash vs en dash (kept in the word, as the authors do)
    ],
)
def test_unicode_forms_quotes_and_dashes_match_their_plain_spelling(prediction: str, gold: str) -> None:
    assert exact_match(prediction, [gold]) == 1.0
    assert exact_match(gold, [prediction]) == 1.0

