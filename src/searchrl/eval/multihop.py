"""Multi-hop behaviour per question type, under the stable names training (`metrics.jsonl`) and
evaluation (`metrics.json`, `eval compare`) both report (docs/guides/evaluation.md#multi-hop-behaviour):

- `multihop/<type>/rollouts`: rollouts of the type (evaluation: one per question);
- `multihop/<type>/searches`: served searches per rollout;
- `multihop/<type>/bridge_rate`: share of rollouts that took a *bridge step* (`bridge_step`);
- `multihop/<type>/support_hop1`, `support_hop2`, `support_hop3`: supporting passages first
  retrieved by the first, the second, and the third or a later search, per rollout
  (`support_by_search`); None when no question of the type names its supporting passages;
- `multihop/<type>/em`, `multihop/<type>/f1`: answer EM and token F1.

`<type>` is the question's `type` (the toy world's bridge-2hop, bridge-3hop, comparison,
bridge-comparison, inference; HotpotQA's bridge, comparison; ...) and `all` for every rollout,
typed or not: a type a dataset lacks has no keys.

An *entity* here is a name token (`name_tokens`): a word written with a capital letter, not at the
start of a sentence or next to another capitalised word, that the same text never writes in lower
case and that is no common word. The toy world's names are invented capitalised words, and
HotpotQA's bridge entities are proper names, so the rule finds them without a tagger.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from searchrl import metric_names as mn
from searchrl.metrics import exact_match, f1_score

if TYPE_CHECKING:
    from searchrl.data.trajectory import Trajectory
    from searchrl.data.types import Question

ALL = "all"  # the slot value of the metrics over every rollout
STATS = (mn.MULTIHOP_ROLLOUTS, mn.MULTIHOP_SEARCHES, mn.MULTIHOP_BRIDGE_RATE, mn.MULTIHOP_SUPPORT_HOP1,
         mn.MULTIHOP_SUPPORT_HOP2, mn.MULTIHOP_SUPPORT_HOP3, mn.MULTIHOP_EM, mn.MULTIHOP_F1)

_WORD = re.compile(r"[^\W_]+")  # letters and digits: "Muard's" -> Muard, s; "Jean-Luc" -> Jean, Luc
# What lies between a sentence and the next ("Text: " opens a passage's first sentence too).
_BREAK = re.compile(r"[.!?:][\"'\u201d\u2019)\]]*\s*$|\n")
# Words that name nothing on their own when capitalised: sentence openers, the scaffolding of
# documents blocks ("(1)Title: X Text: ..."), and the designators of names ("Thymren River",
# "Gaebekal College"), which a query may well say without having read the name.
_COMMON_WORDS = """
a an the this that these those it its he she his her him they them their we our you your i
in on at of by for from to with into onto over under after before during since until about as
and or but nor so yet if when while where who whom whose which what why how there here then
is was are were be been being has have had do does did not no yes also
title text doc document documents passage passages content source
river lake sea bay island mount mountain city town county state province republic kingdom union empire
university college academy school institute museum library hospital church cathedral
press books records music pictures studios studio films film company group band collective orchestra
club team party prize award awards
"""
COMMON = frozenset(_COMMON_WORDS.split())


def words(text: str) -> list[str]:
    """The words of `text`, lower-cased: letter and digit runs.

    >>> words("Muard's film, Jean-Luc!")
    ['muard', 's', 'film', 'jean', 'luc']
    """
    return [w.lower() for w in _WORD.findall(text)]


def name_tokens(text: str) -> set[str]:
    """The entity tokens of `text`, lower-cased: words of two or more characters written with a
    capital letter that follow a lower-case word or a capitalised one inside the sentence, or that
    precede another capitalised word (a name opening a sentence), less common words and less any
    word `text` also writes in lower case (a capitalised sentence opener).

    >>> sorted(name_tokens("Directed by Kheno Muard, Falnyk is a drama. Muard was born in Gimnamburg."))
    ['falnyk', 'gimnamburg', 'kheno', 'muard']
    >>> sorted(name_tokens("Critics praised it. The River flows; the river is long."))
    []
    """
    found = [(m.group(), m.start(), m.end()) for m in _WORD.finditer(text)]
    lower = {w.lower() for w, _, _ in found if w[0].islower()}
    out = set()
    for i, (word, start, end) in enumerate(found):
        key = word.lower()
        if len(word) < 2 or not word[0].isupper() or key in COMMON or key in lower:
            continue
        opens = i == 0 or _BREAK.search(text[found[i - 1][2] : start]) is not None
        nxt = found[i + 1] if i + 1 < len(found) else None
        joined = nxt is not None and nxt[0][0].isupper() and text[end : nxt[1]].strip(" \t") == "" and end < nxt[1]
        if not opens or joined:
            out.add(key)
    return out


def bridge_step(question: str, queries: Sequence[str], seen: Sequence[str]) -> bool:
    """Whether a later query names an entity that only an earlier search's passages gave: some
    query j >= 2 holds a word that is a name token of `seen[j]` (the text of the search results
    read before query j was written) and is in neither the question nor queries 1..j-1.

    >>> docs = "(1)Title: Falnyk Text: Directed by Kheno Muard, Falnyk is a drama film."
    >>> bridge_step("Where was the director of Falnyk born?", ["director of Falnyk", "Kheno Muard birthplace"], ["", docs])
    True
    >>> bridge_step("Where was the director of Falnyk born?", ["director of Falnyk", "Falnyk director born"], ["", docs])
    False
    """
    said = set(words(question))
    for j, query in enumerate(queries):
        new = set(words(query)) - said
        if j and seen[j] and new & name_tokens(seen[j]):
            return True
        said |= new
    return False


def seen_by_query(env_texts: Sequence[str], search_blocks: Sequence[int], n_queries: int) -> list[str]:
    """For each of `n_queries` searches, the text of the earlier searches' results the policy had
    read when it wrote it: env block `search_blocks[i]` shows search i's results (several searches
    of one turn share a block, read only after that turn). Without `search_blocks` (records of
    older runs) search i's results are block i, as under the tag protocols.

    >>> seen_by_query(["A", "B"], [0, 1, 1], 3)
    ['', 'A', 'A']
    >>> seen_by_query(["A", "B"], [], 2)
    ['', 'A']
    """
    blocks = list(search_blocks) if len(search_blocks) == n_queries else list(range(n_queries))
    out = []
    for j in range(n_queries):
        earlier = sorted({blocks[i] for i in range(j) if blocks[i] < blocks[j] and blocks[i] < len(env_texts)})
        out.append("\n".join(env_texts[b] for b in earlier))
    return out


def support_by_search(supporting_ids: Sequence[str], retrieved_ids: Sequence[Sequence[str]]) -> list[int]:
    """Per search in order, how many of the supporting passages it retrieved that no earlier
    search had.

    >>> support_by_search(["p1", "p2"], [["p1", "x"], ["p1", "y"], ["p2"]])
    [1, 0, 1]
    """
    gold, found, out = set(supporting_ids), set(), []
    for ids in retrieved_ids:
        new = (gold & set(ids)) - found
        found |= new
        out.append(len(new))
    return out


@dataclass(frozen=True)
class HopRow:
    """What one rollout did, as the multi-hop metrics read it."""

    type: str
    searches: int
    bridge: bool
    support: tuple[int, ...] | None  # per search, supporting passages it found first; None: the question names none
    em: float
    f1: float


def hop_row(qtype: str, question: str, queries: Sequence[str], seen: Sequence[str], supporting_ids: Sequence[str],
            retrieved_ids: Sequence[Sequence[str]], prediction: str | None, golds: Sequence[str]) -> HopRow:
    return HopRow(
        type=qtype,
        searches=len(queries),
        bridge=bridge_step(question, queries, seen),
        support=tuple(support_by_search(supporting_ids, retrieved_ids)) if supporting_ids else None,
        em=exact_match(prediction, golds),
        f1=f1_score(prediction, golds),
    )


def row_of_trajectory(traj: Trajectory, q: Question) -> HopRow:
    """A training rollout `traj` of question `q`."""
    env = [s.text for s in traj.segments if s.source == "env"]
    seen = seen_by_query(env, traj.search_blocks, len(traj.queries))
    return hop_row(q.type, q.question, traj.queries, seen, q.supporting_ids, traj.retrieved_ids, traj.answer, q.answers)


def row_of_record(rec: Mapping) -> HopRow:
    """A predictions.jsonl record of `searchrl eval run` (records of older runs have no `type`
    nor `search_blocks`)."""
    env = [s["text"] for s in rec["segments"] if s["source"] == "env"]
    seen = seen_by_query(env, rec.get("search_blocks", []), len(rec["queries"]))
    return hop_row(rec.get("type") or "", rec["question"], rec["queries"], seen, rec["supporting_ids"], rec["retrieved_ids"],
                   rec["prediction"], rec["answers"])


def slot(qtype: str) -> str:
    """A question type as a metric slot: whitespace and slashes become `_`.

    >>> slot("bridge comparison/2")
    'bridge_comparison_2'
    """
    return re.sub(r"[\s/]+", "_", qtype.strip())


def multihop_metrics(rows: Sequence[HopRow]) -> dict[str, float | int | None]:
    """The `multihop/<type>/...` metrics of `rows`: `all` first, then each type in sorted order
    (rows without a type count in `all` only)."""
    groups: dict[str, list[HopRow]] = {ALL: list(rows)}
    for r in sorted((r for r in rows if slot(r.type)), key=lambda r: slot(r.type)):
        groups.setdefault(slot(r.type), []).append(r)
    out: dict[str, float | int | None] = {}
    for name, group in groups.items():
        out.update(_stats(name, group))
    return out


def _stats(name: str, rows: list[HopRow]) -> dict[str, float | int | None]:
    n = len(rows)
    mean = (lambda xs: sum(xs) / n) if n else (lambda xs: None)
    supported = [r.support for r in rows if r.support is not None]

    def hop(first: int, last: int | None) -> float | None:
        return sum(sum(s[first:last]) for s in supported) / len(supported) if supported else None

    values = (n, mean([r.searches for r in rows]), mean([float(r.bridge) for r in rows]), hop(0, 1), hop(1, 2),
              hop(2, None), mean([r.em for r in rows]), mean([r.f1 for r in rows]))
    return {family.key(name): value for family, value in zip(STATS, values)}


# ----------------------------------------------------------------------------------------------
# The per-type table

# (metric family, column header, kind): kind "pct" = fraction shown in %, "count", else digits.
_COLUMNS = ((mn.MULTIHOP_ROLLOUTS, "n", "count"), (mn.MULTIHOP_EM, "EM %", "pct"), (mn.MULTIHOP_F1, "F1 %", "pct"),
            (mn.MULTIHOP_SEARCHES, "searches", 2), (mn.MULTIHOP_BRIDGE_RATE, "bridge %", "pct"),
            (mn.MULTIHOP_SUPPORT_HOP1, "supp. hop 1", 2), (mn.MULTIHOP_SUPPORT_HOP2, "hop 2", 2),
            (mn.MULTIHOP_SUPPORT_HOP3, "hop 3+", 2))
HEADER = ("type", *(label for _, label, _ in _COLUMNS))


def types_of(metrics: Mapping[str, object]) -> list[str]:
    """The slot values of `multihop/<type>/...` keys in `metrics`, in their order there."""
    return list(dict.fromkeys(k.split("/")[1] for k in metrics if mn.MULTIHOP_ROLLOUTS.matches(k)))


def type_rows(metrics: Mapping[str, object]) -> list[list[str]]:
    """One row of `HEADER` per type in `metrics` (a metrics.json), `all` first."""
    return [[name] + [_cell(metrics.get(f.key(name)), kind) for f, _, kind in _COLUMNS] for name in types_of(metrics)]


def _cell(value, kind) -> str:
    if value is None:
        return "n/a"
    if kind == "count":
        return str(value)
    if kind == "pct":
        return f"{100 * value:.1f}"
    return f"{value:.{kind}f}"


def right_aligned(header: Iterable[str]) -> list[bool]:
    """Numbers right-aligned: every column but the names."""
    return [h not in ("run", "type") for h in header]
