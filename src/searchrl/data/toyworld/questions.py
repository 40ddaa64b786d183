"""Multi-hop questions over the world, in the styles of HotpotQA and 2WikiMultihopQA.

A draft lists the facts it needs in hop order; the first fact belongs to the entity the
question names, and each later fact belongs to the entity the previous fact names (the
bridge). Supporting passages are looked up from those facts, so they are exactly the
passages a searcher has to find, in the order it has to find them.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from searchrl.data.toyworld.render import fact
from searchrl.data.toyworld.world import Country, Entity, Person, World

QUESTION_TYPES = ("bridge-2hop", "bridge-3hop", "comparison", "bridge-comparison", "inference")


@dataclass(frozen=True)
class Draft:
    type: str
    question: str
    answers: tuple[str, ...]
    facts: tuple[str, ...]  # hop order


def answers_for(e: Entity | str | int) -> tuple[str, ...]:
    if isinstance(e, Country):
        return (e.name, e.official)  # "Vraskia" and "Republic of Vraskia" both appear in its passage
    if isinstance(e, Entity):
        return (e.name,)
    return (str(e),)


def bridge_2hop(w: World, r: random.Random) -> Iterator[Draft]:
    def q(text: str, answer, *facts: str) -> Draft:
        return Draft("bridge-2hop", text, answers_for(answer), facts)

    for f in w.films:
        d = f.director
        yield q(r.choice([f"Where was the director of {f.name} born?",
                          f"In which city was the director of {f.name} born?"]),
                d.birthplace, fact(f, "director"), fact(d, "birthplace"))
        yield q(r.choice([f"In what year was the director of {f.name} born?",
                          f"When was the director of {f.name} born?"]),
                d.born, fact(f, "director"), fact(d, "born"))
        if f.based_on:
            yield q(f"Who wrote the novel that {f.name} is based on?", f.based_on.author,
                    fact(f, "based_on"), fact(f.based_on, "author"))
        if f.studio:
            yield q(f"Who founded the studio that produced {f.name}?", f.studio.founder,
                    fact(f, "studio"), fact(f.studio, "founder"))
        if f.star:
            yield q(f"Where was the lead actor of {f.name} born?", f.star.birthplace,
                    fact(f, "star"), fact(f.star, "birthplace"))
        if d.deathplace:
            yield q(f"Where did the director of {f.name} die?", d.deathplace,
                    fact(f, "director"), fact(d, "deathplace"))
        if d.spouse:
            yield q(f"Who is the spouse of the director of {f.name}?", d.spouse,
                    fact(f, "director"), fact(d, "spouse"))
    for b in w.books:
        a = b.author
        yield q(f"Which country is the author of {b.name} a citizen of?", a.citizenship,
                fact(b, "author"), fact(a, "citizenship"))
        yield q(f"In what year was the author of {b.name} born?", a.born, fact(b, "author"), fact(a, "born"))
        if b.publisher:
            yield q(f"In which city is the publisher of {b.name} headquartered?", b.publisher.hq,
                    fact(b, "publisher"), fact(b.publisher, "hq"))
    for al in w.albums:
        yield q(f"In which city was the band that recorded {al.name} formed?", al.band.city,
                fact(al, "band"), fact(al.band, "city"))
        yield q(f"Who is the lead vocalist of the band that released {al.name}?", al.band.members[0][0],
                fact(al, "band"), fact(al.band, "lead"))
        if al.label:
            yield q(f"Who founded the record label that released {al.name}?", al.label.founder,
                    fact(al, "label"), fact(al.label, "founder"))
    for c in w.companies:
        yield q(f"Where was the founder of {c.name} born?", c.founder.birthplace,
                fact(c, "founder"), fact(c.founder, "birthplace"))
        if c.founder.alma_mater:
            yield q(f"Which university did the founder of {c.name} attend?", c.founder.alma_mater,
                    fact(c, "founder"), fact(c.founder, "alma_mater"))
    for city in w.cities:
        if city.country.capital is not city:
            yield q(f"What is the capital of the country where {city.name} is located?", city.country.capital,
                    fact(city, "country"), fact(city.country, "capital"))
    for p in w.people:
        yield q(f"In which country was {p.name} born?", p.birthplace.country,
                fact(p, "birthplace"), fact(p.birthplace, "country"))
        if p.alma_mater:
            yield q(f"In which city is the university where {p.name} studied?", p.alma_mater.city,
                    fact(p, "alma_mater"), fact(p.alma_mater, "city"))
    for band in w.bands:
        singer = band.members[0][0]
        yield q(f"Where was the lead vocalist of {band.name} born?", singer.birthplace,
                fact(band, "lead"), fact(singer, "birthplace"))


def bridge_3hop(w: World, r: random.Random) -> Iterator[Draft]:
    def q(text: str, answer, *facts: str) -> Draft:
        return Draft("bridge-3hop", text, answers_for(answer), facts)

    for f in w.films:
        d = f.director
        yield q(r.choice([f"In which country was the director of {f.name} born?",
                          f"In which country is the city where the director of {f.name} was born?"]),
                d.birthplace.country, fact(f, "director"), fact(d, "birthplace"), fact(d.birthplace, "country"))
        if f.based_on:
            a = f.based_on.author
            yield q(f"Where was the author of the novel adapted into {f.name} born?", a.birthplace,
                    fact(f, "based_on"), fact(f.based_on, "author"), fact(a, "birthplace"))
        if f.studio:
            yield q(f"In which city was the founder of the studio that produced {f.name} born?",
                    f.studio.founder.birthplace, fact(f, "studio"), fact(f.studio, "founder"),
                    fact(f.studio.founder, "birthplace"))
        if d.spouse:
            yield q(f"Where was the spouse of the director of {f.name} born?", d.spouse.birthplace,
                    fact(f, "director"), fact(d, "spouse"), fact(d.spouse, "birthplace"))
    for c in w.companies:
        yield q(f"In which country is the city where the founder of {c.name} was born?",
                c.founder.birthplace.country, fact(c, "founder"), fact(c.founder, "birthplace"),
                fact(c.founder.birthplace, "country"))
    for al in w.albums:
        if al.label:
            yield q(f"When was the founder of the record label that released {al.name} born?",
                    al.label.founder.born,
                    fact(al, "label"), fact(al.label, "founder"), fact(al.label.founder, "born"))
        yield q(f"In which country was the band behind {al.name} formed?", al.band.city.country,
                fact(al, "band"), fact(al.band, "city"), fact(al.band.city, "country"))
    for b in w.books:
        a = b.author
        if a.alma_mater:
            yield q(f"In which city is the university attended by the author of {b.name}?", a.alma_mater.city,
                    fact(b, "author"), fact(a, "alma_mater"), fact(a.alma_mater, "city"))
        if b.publisher:
            yield q(f"In which country is the publisher of {b.name} headquartered?", b.publisher.hq.country,
                    fact(b, "publisher"), fact(b.publisher, "hq"), fact(b.publisher.hq, "country"))


def pairs(draw: Callable[[], list], n: int, ok: Callable[[Entity, Entity], bool]) -> list[tuple]:
    """Up to `n` distinct unordered pairs from `draw()` that satisfy `ok(a, b)`."""
    seen: set[tuple[str, str]] = set()
    out = []
    for _ in range(n * 20):
        if len(out) >= n:
            break
        a, b = draw()
        key = tuple(sorted((a.key, b.key)))
        if key not in seen and ok(a, b):
            seen.add(key)
            out.append((a, b))
    return out


def any_pairs(items: list, n: int, r: random.Random, ok: Callable[[Entity, Entity], bool]) -> list[tuple]:
    return pairs(lambda: r.sample(items, 2), n, ok) if len(items) >= 2 else []


def yes_no_pairs(items: list, n: int, r: random.Random, same: Callable[[Entity], str]) -> list[tuple]:
    """`n` pairs that share `same(x)` and `n` that don't, so yes and no are equally likely."""
    groups: dict[str, list] = {}
    for x in items:
        groups.setdefault(same(x), []).append(x)
    shared = [g for _, g in sorted(groups.items()) if len(g) >= 2]
    yes = pairs(lambda: r.sample(r.choice(shared), 2), n, lambda a, b: True) if shared else []
    return yes + any_pairs(items, len(yes), r, lambda a, b: same(a) != same(b))


def pick(a: Entity, b: Entity, value: Callable[[Entity], int], first: bool) -> Entity:
    return min((a, b), key=value) if first else max((a, b), key=value)


def comparison(w: World, r: random.Random, n: int) -> Iterator[Draft]:
    def choice(items, label: str, rel: str, value, early: str, late: str) -> Iterator[Draft]:
        for a, b in any_pairs(items, n, r, lambda a, b: value(a) != value(b)):
            first = r.random() < 0.5
            yield Draft("comparison", f"{label.format(early if first else late)}, {a.name} or {b.name}?",
                        (pick(a, b, value, first).name,), (fact(a, rel), fact(b, rel)))

    yield from choice(w.films, "Which film {}", "year", lambda x: x.year,
                      "came out first", "was released more recently")
    yield from choice(w.books, "Which novel was published {}", "year", lambda x: x.year, "first", "more recently")
    yield from choice(w.albums, "Which album was released {}", "year", lambda x: x.year, "earlier", "later")
    yield from choice(w.people, "Who was born {}", "born", lambda x: x.born, "first", "later")
    yield from choice(w.companies, "Which company was founded {}", "founded", lambda x: x.founded,
                      "earlier", "later")
    yield from choice(w.universities, "Which university is {}", "founded", lambda x: x.founded, "older", "younger")
    yield from choice(w.cities, "Which city has the {} population", "population", lambda x: -x.population,
                      "larger", "smaller")

    def yes_no(items, template: str, rel: str, same) -> Iterator[Draft]:
        for a, b in yes_no_pairs(items, n // 2, r, same):
            yield Draft("comparison", template.format(a=a.name, b=b.name),
                        ("yes" if same(a) == same(b) else "no",), (fact(a, rel), fact(b, rel)))

    yield from yes_no(w.people, "Are {a} and {b} citizens of the same country?", "citizenship",
                      lambda p: p.citizenship.key)
    yield from yes_no(w.people, "Were {a} and {b} born in the same city?", "birthplace",
                      lambda p: p.birthplace.key)
    yield from yes_no(w.cities, "Are {a} and {b} located in the same country?", "country", lambda c: c.country.key)
    yield from yes_no(w.films, "Were {a} and {b} directed by the same person?", "director",
                      lambda f: f.director.key)


def bridge_comparison(w: World, r: random.Random, n: int) -> Iterator[Draft]:
    """Two bridges then a comparison: four supporting passages (2WikiMultihopQA style)."""
    def choice(items, label: str, rel: str, bridge, rel2: str, value, early: str, late: str) -> Iterator[Draft]:
        ok = lambda a, b: bridge(a) is not bridge(b) and value(bridge(a)) != value(bridge(b))
        for a, b in any_pairs(items, n, r, ok):
            first = r.random() < 0.5
            answer = pick(a, b, lambda x: value(bridge(x)), first)
            yield Draft("bridge-comparison", f"{label.format(early if first else late)}, {a.name} or {b.name}?",
                        (answer.name,), (fact(a, rel), fact(bridge(a), rel2), fact(b, rel), fact(bridge(b), rel2)))

    yield from choice(w.films, "Which film has the director who was born {}", "director", lambda f: f.director,
                      "born", lambda p: p.born, "earlier", "later")
    yield from choice(w.books, "Which novel's author was born {}", "author", lambda b: b.author,
                      "born", lambda p: p.born, "first", "later")
    yield from choice(w.albums, "Which album is by the band that was formed {}", "band", lambda a: a.band,
                      "formed", lambda b: b.formed, "earlier", "later")
    for a, b in yes_no_pairs(w.films, n // 2, r, lambda f: f.director.citizenship.key):
        if a.director is b.director:
            continue
        same = a.director.citizenship is b.director.citizenship
        text = f"Are the directors of {a.name} and {b.name} citizens of the same country?"
        yield Draft("bridge-comparison", text,
                    ("yes" if same else "no",), (fact(a, "director"), fact(a.director, "citizenship"),
                                                 fact(b, "director"), fact(b.director, "citizenship")))


def inference(w: World, r: random.Random) -> Iterator[Draft]:
    """Kinship composed from parent and spouse links, as in 2WikiMultihopQA's inference type."""
    def q(relation: str, p: Person, answer: Person, *facts: str) -> Draft:
        return Draft("inference", f"Who is the {relation} of {p.name}?", (answer.name,), facts)

    for p in w.people:
        if p.father and p.father.father:
            yield q("paternal grandfather", p, p.father.father, fact(p, "father"), fact(p.father, "father"))
            yield q("paternal grandmother", p, p.father.mother, fact(p, "father"), fact(p.father, "mother"))
        if p.mother and p.mother.father:
            yield q("maternal grandfather", p, p.mother.father, fact(p, "mother"), fact(p.mother, "father"))
            yield q("maternal grandmother", p, p.mother.mother, fact(p, "mother"), fact(p.mother, "mother"))
        if p.spouse and p.spouse.father:
            yield q("father-in-law", p, p.spouse.father, fact(p, "spouse"), fact(p.spouse, "father"))
            yield q("mother-in-law", p, p.spouse.mother, fact(p, "spouse"), fact(p.spouse, "mother"))


def drafts(w: World, r: random.Random, per_pattern: int) -> dict[str, list[Draft]]:
    """Every candidate question by type, each question text once."""
    out: dict[str, list[Draft]] = {t: [] for t in QUESTION_TYPES}
    seen: set[str] = set()
    streams = [bridge_2hop(w, r), bridge_3hop(w, r), comparison(w, r, per_pattern),
               bridge_comparison(w, r, per_pattern), inference(w, r)]
    for stream in streams:
        for d in stream:
            if d.question not in seen:
                seen.add(d.question)
                out[d.type].append(d)
    return out


def quotas(total: int, mix: dict[str, float]) -> dict[str, int]:
    """Split `total` by `mix` shares with largest remainders, so the parts sum to `total`."""
    weight = sum(mix.values())
    exact = {t: total * mix.get(t, 0.0) / weight for t in QUESTION_TYPES}
    out = {t: int(v) for t, v in exact.items()}
    for t in sorted(QUESTION_TYPES, key=lambda t: out[t] - exact[t])[: total - sum(out.values())]:
        out[t] += 1
    return out
