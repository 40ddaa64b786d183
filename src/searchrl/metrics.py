"""Answer metrics: normalisation, EM, F1 and the two cover-EM variants, max over gold aliases.

Normalisation follows the authors' evaluation code (SQuAD/HotpotQA lineage), so scores on
their released predictions reproduce the published figures exactly (tests/integration/test_parity.py).

Every metric takes `prediction: str | None, golds: Sequence[str]` and returns a float in [0, 1].
`ANSWER_METRICS` names them for configuration (the selectable `R_answer` of stage 2):
`em`, `f1`, `cem` (token cover, the authors' ACC_R) and `cem_substr` (FlashRAG's `acc`).
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence

from searchrl.registry import Registry

AnswerMetric = Callable[[str | None, Sequence[str]], float]
ANSWER_METRICS: Registry[AnswerMetric] = Registry("answer metric")

# Typographic quotes (single, double, low, angle), the acute accent and hyphen variants (hyphen,
# non-breaking hyphen, minus sign) are not in string.punctuation, but models and gold files use
# them where others write the ASCII form, so they are punctuation too.
_PUNCTUATION = frozenset(
    string.punctuation
    + "\u2018\u2019\u201a\u201b\u201c\u201d\u201e\u201f\u00ab\u00bb\u2039\u203a\u00b4\u2010\u2011\u2212"
)
# Dashes stay inside words as the authors' normalisation leaves them (parity: their F1 counts
# "1861\u20131865" against "1861\u201365" as no overlap); the figure dash, em dash and bar are
# written as the en dash so that the variants match each other.
_DASHES = str.maketrans(dict.fromkeys("\u2012\u2014\u2015", "\u2013"))
_ARTICLES = re.compile(r"\b(a|an|the)\b")
# F1 refuses partial credit between these: "no" must not half-match "no idea".
_SPECIAL = frozenset({"yes", "no", "noanswer"})
# Matched against the raw string, before any stripping. This is where parity pins it down: the
# released predictions carry spaces (" False ") and the authors' figures count those unmapped.
_BOOLEAN_WORDS = {"True": "yes", "False": "no"}


def normalize_answer(s: str) -> str:
    """Normalise an answer string the way the authors' evaluation does.

    >>> normalize_answer("The Eiffel_Tower!")
    'eiffel tower'
    >>> normalize_answer("Dr.\u2019s   `Best`  an apple")
    'dr s best apple'
    >>> normalize_answer("True"), normalize_answer("False")
    ('yes', 'no')
    >>> normalize_answer(" True ")  # only the bare word maps; the authors' code compares raw strings
    'true'
    >>> normalize_answer("\u201cZu\u0308rich\u201d \u2212 1990\u20141995") == normalize_answer('"Z\u00fcrich" - 1990\u20131995')
    True
    """
    s = _BOOLEAN_WORDS.get(s, s)
    s = unicodedata.normalize("NFC", s)  # "u" + combining diaeresis and a precomposed "ü" match
    s = s.translate(_DASHES).replace("_", " ").lower()
    s = "".join(" " if ch in _PUNCTUATION else ch for ch in s)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def contains(text: str, phrase: str) -> bool:
    """Whether normalised `phrase` stands in normalised `text` as whole words (False for an empty phrase).

    >>> contains("Kheno Muard was born in Gimnamburg.", "gimnamburg")
    True
    >>> contains("A Parisian painter.", "Paris")
    False
    """
    p = normalize_answer(phrase)
    return bool(p) and f" {p} " in f" {normalize_answer(text)} "


def _valid(prediction: str | None) -> bool:
    return prediction is not None and prediction.strip() != ""


def _em(pred: str, gold: str) -> float:
    return float(pred == gold)


def _f1(pred: str, gold: str) -> float:
    if (pred in _SPECIAL or gold in _SPECIAL) and pred != gold:
        return 0.0
    pred_tokens, gold_tokens = pred.split(), gold.split()
    overlap = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _cover_tokens(pred: str, gold: str) -> float:
    pred_tokens = set(pred.split())
    return float(all(tok in pred_tokens for tok in gold.split()))


def _cover_substring(pred: str, gold: str) -> float:
    return float(gold in pred)


def _best(
    pair_metric: Callable[[str, str], float], prediction: str | None, golds: Sequence[str]
) -> float:
    if not _valid(prediction):
        return 0.0
    pred = normalize_answer(prediction)  # type: ignore[arg-type]
    if not pred:
        return 0.0
    scores = [pair_metric(pred, g) for g in (normalize_answer(x) for x in golds) if g]
    # A gold that normalises to nothing ("the") would be covered by every prediction; it is skipped.
    return max(scores, default=0.0)


@ANSWER_METRICS.register("em")
def exact_match(prediction: str | None, golds: Sequence[str]) -> float:
    """1.0 when the normalised prediction equals some normalised gold alias.

    >>> exact_match("the  Beatles.", ["Beatles", "Fab Four"])
    1.0
    >>> exact_match("Beatles band", ["Beatles"])
    0.0
    >>> exact_match(None, ["Beatles"])
    0.0
    """
    return _best(_em, prediction, golds)


@ANSWER_METRICS.register("f1")
def f1_score(prediction: str | None, golds: Sequence[str]) -> float:
    """Token-level F1 (Counter overlap), best over gold aliases; 0 on a yes/no/noanswer mismatch.

    >>> f1_score("Barack Obama Sr", ["Barack Obama"])  # p=2/3, r=1
    0.8
    >>> f1_score("no", ["no way"])
    0.0
    >>> round(f1_score("new york city", ["York", "New York"]), 4)
    0.8
    """
    return _best(_f1, prediction, golds)


@ANSWER_METRICS.register("cem")
def cover_em(prediction: str | None, golds: Sequence[str]) -> float:
    """Cover-EM as in the authors' code: every normalised gold token occurs among the prediction's.

    Word order and extra words do not matter; partial words do.

    >>> cover_em("born in York, New England", ["New York"])
    1.0
    >>> cover_em("Yorkshire", ["York"])
    0.0
    """
    return _best(_cover_tokens, prediction, golds)


@ANSWER_METRICS.register("cem_substr")
def cover_em_substring(prediction: str | None, golds: Sequence[str]) -> float:
    """Cover-EM as FlashRAG's `acc`: the normalised gold is a substring of the normalised prediction.

    >>> cover_em_substring("born in York, New England", ["New York"])
    0.0
    >>> cover_em_substring("Yorkshire", ["York"])
    1.0
    """
    return _best(_cover_substring, prediction, golds)


def answer_scores(prediction: str | None, golds: Sequence[str]) -> dict[str, float]:
    """All four metrics at once, keyed as in `ANSWER_METRICS`.

    >>> answer_scores("Paris, France", ["Paris"])
    {'em': 0.0, 'f1': 0.6666666666666666, 'cem': 1.0, 'cem_substr': 1.0}
    """
    return {
        name: ANSWER_METRICS.get(name)(prediction, golds)
        for name in ("em", "f1", "cem", "cem_substr")
    }
