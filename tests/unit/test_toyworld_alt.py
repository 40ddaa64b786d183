"""The held-out world (toyworld-alt): its promises, and that it shares with the main world no
relation, no template wording and no name, so it checks generalisation and not memory."""

from __future__ import annotations

import itertools
import random
import re
from collections import Counter

import pytest

from searchrl.data import catalog
from searchrl.data.toyworld import QUESTION_TYPES, ToyWorld, ToyWorldConfig, generate
from searchrl.data.toyworld import world as main_world
from searchrl.data.toyworld.alt import AltWorldConfig
from searchrl.data.toyworld.alt import generate as generate_alt
from searchrl.data.toyworld.alt import write as write_alt
from searchrl.data.toyworld.alt.render import RELATION_NAMES as ALT_RELATION_NAMES
from searchrl.data.toyworld.alt.render import render as render_alt
from searchrl.data.toyworld.alt.world import AltBuilder
from searchrl.data.toyworld.questions import quotas
from searchrl.data.toyworld.render import RELATION_NAMES as MAIN_RELATION_NAMES
from searchrl.data.toyworld.render import render as render_main
from searchrl.errors import DataError
from searchrl.eval.retrieval import recall_at_k
from searchrl.retrieval import catalog as index_catalog
from searchrl.retrieval import open_retriever

HOPS = {"bridge-2hop": 2, "bridge-3hop": 3, "comparison": 2, "bridge-comparison": 4, "inference": 2}


def norm(text: str) -> str:
    return " " + " ".join(re.sub(r"[^0-9a-z]+", " ", text.lower()).split()) + " "


def contains(text: str, phrase: str) -> bool:
    return norm(phrase) in norm(text)


@pytest.fixture(scope="module")
def alt() -> ToyWorld:
    return generate_alt()


@pytest.fixture(scope="module")
def main() -> ToyWorld:
    return generate(ToyWorldConfig(seed=3, passages=600, train=300, test=100))


def test_default_world_has_every_type_and_keeps_every_promise(alt: ToyWorld) -> None:
    by_id = {p.id: p for p in alt.passages}
    assert 1100 <= len(by_id) == len(alt.passages) <= 1300 and not alt.train
    assert all(re.fullmatch(r"twa-\d{6}", pid) for pid in by_id)
    counts = Counter(q.type for q in alt.test)
    assert counts == quotas(250, AltWorldConfig().mix) and min(counts.values()) >= 20, counts
    assert len({q.id for q in alt.test}) == len({norm(q.question) for q in alt.test}) == 250
    for q in alt.test:
        assert q.source == "toyworld-alt" and q.type in QUESTION_TYPES and q.answers, q
        support = [by_id[pid] for pid in q.supporting_ids]  # KeyError = a missing passage
        assert len(support) == HOPS[q.type], q
        firsts = {"comparison": [0, 1], "bridge-comparison": [0, 2]}.get(q.type, [0])
        for i in firsts:
            assert contains(q.question, support[i].title), (q, support[i].title)
        chains = {"comparison": [], "bridge-comparison": [[0, 1], [2, 3]]}.get(q.type, [list(range(len(support)))])
        for chain in chains:  # each later hop's entity is named in the passage before it
            for a, b in itertools.pairwise(chain):
                assert contains(support[a].text, support[b].title), (q, support[a].title, support[b].title)
        # One evidence sentence a hop, in this world's shape ("S's R is O."), stated by that passage.
        assert len(q.evidence) == len(support), q
        for sentence, passage in zip(q.evidence, support):
            m = re.fullmatch(r"(.+)'s ([a-z ]+) is (.+)\.", sentence)
            assert m and m[1] == passage.title and contains(passage.text, m[3]), (q, sentence)
        if q.answers[0] in ("yes", "no"):
            continue
        # The answer is stated word for word in a supporting passage (the last hop's, for bridges).
        assert any(contains(p.text, ans) for p in support for ans in q.answers), q
        if q.type in ("comparison", "bridge-comparison"):
            assert q.answers[0] in {support[i].title for i in firsts}, q
        else:
            assert not any(contains(q.question, ans) for ans in q.answers), q
            assert contains(support[-1].text, q.answers[0]) and contains(q.evidence[-1], q.answers[0]), q


def test_yes_and_no_are_both_asked(alt: ToyWorld) -> None:
    answers = Counter(q.answers[0] for q in alt.test if q.answers[0] in ("yes", "no"))
    assert answers["yes"] >= 5 and answers["no"] >= 5, answers


def test_generation_is_deterministic_and_seeded(tmp_path) -> None:
    small = AltWorldConfig(seed=5, passages=300, test=60)
    for name, cfg in (("a", small), ("b", small), ("c", small.model_copy(update={"seed": 6}))):
        write_alt(generate_alt(cfg), tmp_path / name)
    for f in ("corpus.jsonl", "test.jsonl", "meta.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    assert (tmp_path / "a" / "corpus.jsonl").read_bytes() != (tmp_path / "c" / "corpus.jsonl").read_bytes()
    assert '"source": "toyworld-alt"' in (tmp_path / "a" / "meta.json").read_text()


def test_too_small_a_world_says_so() -> None:
    with pytest.raises(DataError, match="toyworld-alt: .* raise passages"):
        generate_alt(AltWorldConfig(passages=100, test=3000))


def relations(chunks) -> set[str]:
    return {f.split(":")[1] for _, chunk in chunks for f in chunk.facts}


def test_no_relation_in_common_with_the_main_world() -> None:
    mw = main_world.Builder(random.Random("rel-main"), 400).build()
    aw = AltBuilder(random.Random("rel-alt"), 400).build()
    main_rel = relations(render_main(mw.entities(), mw.cities, random.Random(1), 100))
    alt_rel = relations(render_alt(aw.entities(), aw.ports, random.Random(1), 100))
    assert len(main_rel) >= 20 and len(alt_rel) >= 20
    assert not main_rel & alt_rel
    assert not {k for k in MAIN_RELATION_NAMES if isinstance(k, str)} & set(ALT_RELATION_NAMES)
    assert not {type(e).kind for e in mw.entities()} & {type(e).kind for e in aw.entities()}


# Function words, wh-words, auxiliaries and prepositions: a trigram of these (and masked names
# and numbers) is English, not a template.
FUNCTION = frozenset(["a", "an", "the", "of", "in", "on", "at", "to", "by", "for", "from", "with", "into", "onto", "under", "over", "after", "before", "behind", "between", "among", "through", "during", "about", "and", "or", "but", "as", "is", "was", "are", "were", "be", "been", "has", "had", "have", "do", "does", "did", "can", "will", "would", "its", "it", "his", "her", "he", "she", "him", "their", "they", "them", "this", "that", "these", "those", "which", "who", "whom", "whose", "what", "where", "when", "how", "there", "here", "than", "then", "not", "no", "one", "all", "any", "each", "some", "more", "most"])


def trigrams(texts) -> Counter:
    """Word trigrams with names (capitalised words) and numbers masked, function-word-only ones dropped."""
    out: Counter = Counter()
    for text in texts:
        for sentence in re.split(r"(?<=[.?!])\s+", text):
            words = ["<num>" if w[0].isdigit() else "<name>" if w[0].isupper() and w.lower() not in FUNCTION
                     else w.lower() for w in re.findall(r"[A-Za-z][A-Za-z'-]*|\d[\d,]*", sentence)]
            out.update(g for g in zip(words, words[1:], words[2:])
                       if any(w not in FUNCTION and not w.startswith("<") for w in g))
    return out


def test_no_template_wording_in_common_with_the_main_world(alt: ToyWorld, main: ToyWorld) -> None:
    def shared(a: ToyWorld, b: ToyWorld) -> dict[str, set]:
        parts = {"passages": lambda w: [p.text for p in w.passages],
                 "questions": lambda w: [q.question for q in w.train + w.test],
                 "evidence": lambda w: [e for q in w.train + w.test for e in q.evidence]}
        return {k: set(trigrams(f(a))) & set(trigrams(f(b))) for k, f in parts.items()}

    assert shared(alt, main) == {"passages": set(), "questions": set(), "evidence": set()}
    # The check has teeth: another seed of the main world shares hundreds of its trigrams.
    other = generate(ToyWorldConfig(seed=4, passages=300, train=100, test=20))
    teeth = shared(main, other)
    assert len(teeth["passages"]) > 300 and len(teeth["questions"]) > 30 and len(teeth["evidence"]) > 10
    assert ("was", "born", "in") in teeth["passages"]
    assert not any(re.fullmatch(r"The [a-z ]+ of .+ is .+\.", e) for q in alt.test for e in q.evidence)


def test_no_name_in_common_with_the_main_world(alt: ToyWorld) -> None:
    alt_names = [e.name for e in AltBuilder(random.Random("toyworld-alt:0:world"), 1200).build().entities()]
    assert len(alt_names) > 1100 and len({n.lower() for n in alt_names}) == len(alt_names)
    assert {p.title for p in alt.passages} <= set(alt_names)
    main_words: set[str] = set()
    for seed in (0, 1):
        mw = main_world.Builder(random.Random(f"toyworld:{seed}:world"), 3000).build()
        assert not {n.lower() for n in alt_names} & {e.name.lower() for e in mw.entities()}
        main_words |= {w.lower() for e in mw.entities() for w in e.name.split()}
    # Stronger, by construction: no invented word of one world is a word of the other's names.
    invented = {w.lower() for n in alt_names for w in n.split() if w[0] in "CJQWAEIOU"}
    assert len(invented) > 1000 and not invented & main_words


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SEARCHRL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_catalog_builds_the_held_out_test_set_and_its_index(home, tmp_path) -> None:
    info = {i.name: i for i in catalog.list_datasets()}
    assert info["toyworld-alt:test"].count == 250 and not (home / "datasets").exists()  # counted, not built
    assert not any(name.startswith("toyworld-alt:") and name != "toyworld-alt:test" for name in info)  # no train
    questions = catalog.load_dataset("toyworld-alt:test")
    assert len(questions) == 250 and {q.type for q in questions} == set(QUESTION_TYPES)
    write_alt(generate_alt(), tmp_path / "direct")  # the cache holds exactly what the generator writes
    (built,) = (home / "datasets").glob("toyworld-alt-*")
    for f in ("corpus.jsonl", "test.jsonl"):
        assert (built / f).read_bytes() == (tmp_path / "direct" / f).read_bytes(), f
    retriever = open_retriever("toyworld-alt")
    try:
        out = recall_at_k(questions[:40], retriever, k=5, progress=False)
    finally:
        retriever.close()
    # Invented names are rare words, so BM25 finds a first hop of nearly every question; a broken
    # id mapping gives 0 (measured: recall 0.72, any 0.97 on all 250).
    assert out["any_found"] >= 0.8 and 0.5 <= out["recall"] <= 1
    assert ("toyworld-alt", "BM25 over the held-out toy world corpus", True) in index_catalog.list_indexes()
    (index_dir,) = (home / "indexes").glob("toyworld-*")  # the main world's index was never built
    assert index_dir.name.startswith("toyworld-alt-") and index_catalog.named_index_dir("toyworld-alt") == index_dir

