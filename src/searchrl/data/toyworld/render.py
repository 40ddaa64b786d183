"""Encyclopedia passages: each entity's facts as varied sentences, packed into ~100-word chunks.

Every sentence records the facts it states (`"<entity key>:<relation>"`), and packing records
which passage each fact landed in. Questions take their supporting passages from that map,
so a question can only rely on a fact that some passage states word for word.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from searchrl.data.toyworld.prose import fillers
from searchrl.data.toyworld.world import (
    Album,
    Band,
    Book,
    City,
    Company,
    Country,
    Entity,
    Film,
    Person,
    University,
)

COMPANY_KINDS = {
    "record label": "record label", "publishing house": "publishing house", "film studio": "film studio",
    "shipping": "shipping company", "brewing": "brewing company", "software": "software company",
    "automotive": "automobile manufacturer", "pharmaceutical": "pharmaceutical company",
    "aviation": "aircraft manufacturer", "textile": "textile manufacturer",
}
NOUNS = {Film: "film", Book: "novel", Album: "album", Band: "band", Company: "company",
         University: "university", City: "city", Country: "country"}


def fact(entity: Entity, relation: str) -> str:
    return f"{entity.key}:{relation}"


# A relation's name in a statement; (kind, relation) first where kinds differ.
RELATION_NAMES = {
    "director": "director", "star": "lead actor", "studio": "studio", "based_on": "source novel",
    "author": "author", "publisher": "publisher", "band": "band", "label": "record label",
    "lead": "lead vocalist", "founder": "founder", "hq": "headquarters", "born": "birth year",
    "birthplace": "birthplace", "deathplace": "place of death", "citizenship": "citizenship",
    "spouse": "spouse", "father": "father", "mother": "mother", "alma_mater": "university",
    "country": "country", "capital": "capital", "population": "population", "founded": "founding year",
    "formed": "formation year", "year": "year",
    ("film", "year"): "release year", ("album", "year"): "release year", ("book", "year"): "publication year",
    ("band", "city"): "home city", ("university", "city"): "city",
}


def statement(e: Entity, relation: str) -> str:
    """One fact of `e` as a plain sentence, the form gold search trajectories state each hop in
    (2WikiMultihopQA's evidence triples, in words).

    >>> statement(City("city-00001", "Harbel", population=90500), "population")
    'The population of Harbel is 90,500.'
    """
    value = e.members[0][0] if relation == "lead" else getattr(e, relation)
    text = value.name if isinstance(value, Entity) else f"{value:,}" if relation == "population" else str(value)
    name = RELATION_NAMES.get((e.kind, relation)) or RELATION_NAMES[relation]
    return f"The {name} of {e.name} is {text}."


@dataclass(frozen=True)
class Sentence:
    template: str  # may use {S} {s} (subject), {P} {p} (possessive), {o} (object), {pp} (his/her/its)
    facts: tuple[str, ...] = ()


@dataclass
class Chunk:
    sentences: list[str] = field(default_factory=list)
    facts: set[str] = field(default_factory=set)
    words: int = 0

    def add(self, text: str, at: int | None = None) -> None:
        self.sentences.insert(len(self.sentences) if at is None else at, text)
        self.words += len(text.split())


def names(items: list[Entity], limit: int = 3) -> str:
    """'A', 'A and B', 'A, B and C' (first `limit` items)."""
    parts = [e.name for e in items[:limit]]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def subject_forms(e: Entity, full: bool, rng: random.Random) -> dict[str, str]:
    if isinstance(e, Person):
        he, his, him = ("he", "his", "him") if e.gender == "m" else ("she", "her", "her")
    else:
        he, his, him = "it", "its", "it"
    if full:
        return {"S": e.name, "s": e.name, "P": f"{e.name}'s", "p": f"{e.name}'s", "o": e.name, "pp": his}
    if isinstance(e, Person):
        short = e.surname if rng.random() < 0.4 else he
    else:
        short = f"the {NOUNS[type(e)]}" if rng.random() < 0.5 else he
    if isinstance(e, Person):
        if short == he:
            return {"S": he.capitalize(), "s": he, "P": his.capitalize(), "p": his, "o": him, "pp": his}
        return {"S": short, "s": short, "P": f"{short}'s", "p": f"{short}'s", "o": short, "pp": his}
    # "it" only opens a sentence; mid-sentence ("people born in ...") it needs the noun.
    noun = f"the {NOUNS[type(e)]}"
    opener = "it" if short == he else noun
    return {"S": opener.capitalize(), "s": noun, "P": (opener + "'s" if opener == noun else "its").capitalize(),
            "p": f"{noun}'s", "o": noun, "pp": his}


def article(word: str) -> str:
    """'a' or 'an' before `word` (vowel letter test; our words never start with a silent h)."""
    return f"an {word}" if word[0].lower() in "aeio" or word.startswith(("8", "18", "11")) else f"a {word}"


def person_sentences(p: Person, r: random.Random) -> list[Sentence]:
    be, holds = ("is", "holds") if p.died is None else ("was", "held")
    he = "he" if p.gender == "m" else "she"
    adj = p.citizenship.adjective
    lead = (r.choice([f"{{S}} (born {p.born}) is {article(adj)} {p.job}.",
                      f"{{S}} is {article(adj)} {p.job}, born in {p.born}."]) if p.died is None else
            r.choice([f"{{S}} ({p.born} – {p.died}) was {article(adj)} {p.job}.",
                      f"{{S}} was {article(adj)} {p.job} who lived from {p.born} to {p.died}."]))
    out = [Sentence(lead, (fact(p, "born"), fact(p, "died")))]
    out.append(Sentence(r.choice([f"{{S}} was born in {p.birthplace.name}.",
                                  f"{{P}} birthplace is {p.birthplace.name}.",
                                  f"{{S}} was born and raised in {p.birthplace.name}."]),
                        (fact(p, "birthplace"),)))
    out.append(Sentence(r.choice([f"{{S}} {be} a citizen of {p.citizenship.name}.",
                                  f"{{S}} {holds} citizenship of {p.citizenship.name}."]),
                        (fact(p, "citizenship"),)))
    if p.father:
        child = "son" if p.gender == "m" else "daughter"
        out.append(Sentence(r.choice([f"{{S}} {be} the {child} of {p.father.name} and {p.mother.name}.",
                                      f"{{P}} parents were {p.father.name} and {p.mother.name}."]),
                            (fact(p, "father"), fact(p, "mother"))))
    if p.deathplace:
        out.append(Sentence(r.choice([f"{{S}} died in {p.deathplace.name}.",
                                      f"{{S}} spent {{pp}} last years in {p.deathplace.name}, where {he} died."]),
                            (fact(p, "deathplace"),)))
    if p.spouse:
        out.append(Sentence(r.choice([f"{{S}} married {p.spouse.name} in {p.married}.",
                                      f"In {p.married}, {{s}} married {p.spouse.name}."]),
                            (fact(p, "spouse"),)))
    if p.alma_mater:
        out.append(Sentence(r.choice([f"{{S}} studied at {p.alma_mater.name}.",
                                      f"{{S}} graduated from {p.alma_mater.name}.",
                                      f"{{S}} was educated at {p.alma_mater.name}."]),
                            (fact(p, "alma_mater"),)))
    films = [w for w in p.works if isinstance(w, Film) and w.director is p]
    roles = [w for w in p.works if isinstance(w, Film) and w.star is p]
    books = [w for w in p.works if isinstance(w, Book)]
    if films:
        out.append(Sentence(f"{{P}} films as director include {names(films)}."))
    if roles:
        out.append(Sentence(f"{{S}} played leading roles in {names(roles)}."))
    if books:
        out.append(Sentence(f"{{S}} wrote the {'novel' if len(books) == 1 else 'novels'} {names(books)}."))
    for w in p.works:
        if isinstance(w, Company):
            out.append(Sentence(f"{{S}} founded {w.name} in {w.founded}."))
        elif isinstance(w, Band):
            role = next(role for m, role in w.members if m is p)
            out.append(Sentence(f"{{S}} {be} the {role} of {w.name}."))
    if p.children:
        out.append(Sentence(f"{{P}} children include {names(p.children, 2)}."))
    return out


def city_sentences(c: City, r: random.Random, world_index: dict) -> list[Sentence]:
    cap = c.country.capital is c
    lead = (f"{{S}} is the capital of {c.country.name}." if cap else
            r.choice([f"{{S}} is a city in {c.country.name}.",
                      f"{{S}} is a city in {c.country.name}, on the banks of the {c.river} River."]))
    out = [Sentence(lead, (fact(c, "country"),) + ((fact(c, "capital_of"),) if cap else ()))]
    out.append(Sentence(r.choice([f"{{S}} has a population of {c.population:,}.",
                                  f"At the last census {{s}} had {c.population:,} inhabitants."]),
                        (fact(c, "population"),)))
    out.append(Sentence(r.choice([f"{{S}} was founded in {c.founded}.",
                                  f"{{S}} traces its founding to {c.founded}."]),
                        (fact(c, "founded"),)))
    natives, schools, firms = (world_index[k].get(c.key, []) for k in ("natives", "schools", "firms"))
    if natives:
        out.append(Sentence(f"People born in {{s}} include {names(natives, 2)}."))
    if schools:
        out.append(Sentence(f"{names(schools, 2)} {'is' if len(schools) == 1 else 'are'} located in the city."))
    if firms:
        out.append(Sentence(f"Companies based in {{s}} include {names(firms, 2)}."))
    return out


def country_sentences(c: Country, r: random.Random) -> list[Sentence]:
    out = [Sentence(f"{{S}}, officially the {c.official}, is a country in {c.region}.", (fact(c, "official"),)),
           Sentence(r.choice([f"{{P}} capital and largest city is {c.capital.name}.",
                              f"The capital of {{s}} is {c.capital.name}, also its largest city."]),
                    (fact(c, "capital"),)),
           Sentence(r.choice([f"{{S}} became independent in {c.independence}.",
                              f"{{S}} gained independence in {c.independence}."]), (fact(c, "independence"),)),
           Sentence(f"{{P}} population is about {c.population_m} million.", (fact(c, "population"),)),
           Sentence(f"The official language is {c.language} and the currency is the {c.currency}.")]
    others = [x for x in c.cities if x is not c.capital]
    if others:
        out.append(Sentence(f"Other major cities include {names(others)}."))
    return out


def work_sentences(e: Entity, r: random.Random) -> list[Sentence]:
    """Films, novels, albums, bands, companies and universities."""
    if isinstance(e, Film):
        by, genre = e.director.name, article(e.genre)
        out = [Sentence(r.choice([f"{{S}} is {article(str(e.year))} {e.genre} film directed by {by}.",
                                  f"{{S}} is {genre} film from {e.year}, directed by {by}.",
                                  f"Directed by {by}, {{s}} is {genre} film released in {e.year}."]),
                        (fact(e, "year"), fact(e, "director")))]
        if e.studio:
            out.append(Sentence(r.choice([f"{{S}} was produced by {e.studio.name}.",
                                          f"{e.studio.name} produced the film."]), (fact(e, "studio"),)))
        if e.based_on:
            out.append(Sentence(r.choice([f"{{S}} is based on the novel {e.based_on.name}.",
                                          f"The screenplay adapts the novel {e.based_on.name}."]),
                                (fact(e, "based_on"),)))
        if e.star:
            out.append(Sentence(r.choice([f"{e.star.name} plays the lead role.", f"{{S}} stars {e.star.name}."]),
                                (fact(e, "star"),)))
    elif isinstance(e, Book):
        by, genre = e.author.name, article(e.genre)
        out = [Sentence(r.choice([f"{{S}} is {genre} novel by {by}, first published in {e.year}.",
                                  f"{{S}} is {article(str(e.year))} {e.genre} novel written by {by}.",
                                  f"Written by {by}, {{s}} is {genre} novel that appeared in {e.year}."]),
                        (fact(e, "author"), fact(e, "year")))]
        if e.publisher:
            out.append(Sentence(r.choice([f"{{S}} was published by {e.publisher.name}.",
                                          f"{e.publisher.name} published the first edition."]),
                                (fact(e, "publisher"),)))
    elif isinstance(e, Album):
        out = [Sentence(r.choice([f"{{S}} is a studio album by {e.band.name}, released in {e.year}.",
                                  f"{{S}} is the {e.year} album by {e.band.name}.",
                                  f"Released in {e.year}, {{s}} is a studio album by {e.band.name}."]),
                        (fact(e, "band"), fact(e, "year")))]
        if e.label:
            out.append(Sentence(r.choice([f"{{S}} was released on the {e.label.name} label.",
                                          f"{e.label.name} issued the record."]), (fact(e, "label"),)))
    elif isinstance(e, Band):
        members = [f"{role} {m.name}" for m, role in e.members]
        lineup = ", ".join(members[:-1]) + " and " + members[-1]
        out = [Sentence(r.choice([f"{{S}} is {article(e.genre)} band formed in {e.city.name} in {e.formed}.",
                                  f"Formed in {e.city.name} in {e.formed}, {{s}} is {article(e.genre)} band."]),
                        (fact(e, "city"), fact(e, "formed"))),
               Sentence(f"The line-up consisted of {lineup}.", (fact(e, "lead"),))]
        if e.label:
            out.append(Sentence(f"{{S}} signed with {e.label.name}.", (fact(e, "label"),)))
        if e.albums:
            out.append(Sentence(f"{{P}} albums include {names(e.albums)}."))
    elif isinstance(e, Company):
        kind = COMPANY_KINDS[e.industry]
        out = [Sentence(r.choice([f"{{S}} is {article(kind)} founded in {e.founded} by {e.founder.name}.",
                                  f"Founded by {e.founder.name} in {e.founded}, {{s}} is {article(kind)}."]),
                        (fact(e, "founded"), fact(e, "founder"))),
               Sentence(r.choice([f"{{S}} is headquartered in {e.hq.name}.",
                                  f"{{P}} headquarters are in {e.hq.name}."]), (fact(e, "hq"),))]
        if e.output:
            out.append(Sentence(f"Its catalogue includes {names(e.output)}."))
    elif isinstance(e, University):
        out = [Sentence(f"{{S}} is {article(e.style)} in {e.city.name}.", (fact(e, "city"),)),
               Sentence(r.choice([f"{{S}} was founded in {e.founded}.", f"{{S}} was established in {e.founded}."]),
                        (fact(e, "founded"),))]
    else:
        raise TypeError(f"no sentences for {type(e).__name__}")
    return out


def pack(e: Entity, sentences: list[Sentence], background: list[str], r: random.Random,
         words: int, forms: Callable[[Entity, bool, random.Random], dict[str, str]] | None = None) -> list[Chunk]:
    """Greedy packing into chunks of at most 1.3 x `words`; the last chunk is topped up with
    background sentences to about `words`. The subject is named in full at each chunk start.
    `forms` fills the subject placeholders (`subject_forms` by default; another world's kinds
    bring their own)."""
    forms = forms or subject_forms
    hi = int(words * 1.3)
    chunks = [Chunk()]
    for sent in sentences:
        text = sent.template.format(**forms(e, not chunks[-1].sentences, r))
        if chunks[-1].sentences and chunks[-1].words + len(text.split()) > hi:
            chunks.append(Chunk())
            text = sent.template.format(**forms(e, True, r))
        chunks[-1].add(text)
        chunks[-1].facts.update(sent.facts)
    last = chunks[-1]
    for template in background:
        if last.words >= words:
            break
        text = template.format(**forms(e, False, r))
        if last.words + len(text.split()) <= hi:
            # Anywhere after the opening sentence, so passages don't end in boilerplate.
            last.add(text, at=r.randint(1, len(last.sentences)))
    return chunks


def render(entities: list[Entity], cities: list[City], rng: random.Random,
           words: int) -> list[tuple[Entity, Chunk]]:
    """All chunks of all entities, in entity order."""
    index: dict[str, dict[str, list[Entity]]] = {"natives": {}, "schools": {}, "firms": {}}
    for e in entities:
        if isinstance(e, Person):
            index["natives"].setdefault(e.birthplace.key, []).append(e)
        elif isinstance(e, University):
            index["schools"].setdefault(e.city.key, []).append(e)
        elif isinstance(e, Company):
            index["firms"].setdefault(e.hq.key, []).append(e)
    out = []
    for e in entities:
        if isinstance(e, Person):
            sentences = person_sentences(e, rng)
        elif isinstance(e, City):
            sentences = city_sentences(e, rng, index)
        elif isinstance(e, Country):
            sentences = country_sentences(e, rng)
        else:
            sentences = work_sentences(e, rng)
        out.extend((e, chunk) for chunk in pack(e, sentences, fillers(e, rng, cities), rng, words))
    return out
