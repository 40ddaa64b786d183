"""The held-out world's questions: the main world's five types, asked in other words.

The type names are the main world's (`QUESTION_TYPES`), so per-type scores line up across the
two worlds; the facts and phrasings are this world's. Drafts list facts in hop order, as there.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from searchrl.data.toyworld.alt.world import AltWorld, Mariner
from searchrl.data.toyworld.questions import QUESTION_TYPES, Draft, any_pairs, pick, yes_no_pairs
from searchrl.data.toyworld.render import fact
from searchrl.data.toyworld.world import Entity


def answer(e: Entity | int) -> tuple[str, ...]:
    return (e.name,) if isinstance(e, Entity) else (str(e),)


def bridge_2hop(w: AltWorld, r: random.Random) -> Iterator[Draft]:
    def q(text: str, value, *facts: str) -> Draft:
        return Draft("bridge-2hop", text, answer(value), facts)

    for s in w.ships:
        yield q(r.choice([f"Which master builder runs the yard that built {s.name}?",
                          f"Whose slipways turned out {s.name}? Name their master builder."]),
                s.yard.builder, fact(s, "yard"), fact(s.yard, "builder"))
        yield q(r.choice([f"What port does the captain of {s.name} hail from?",
                          f"From which harbour did {s.name}'s commanding officer come?"]),
                s.master.home_port, fact(s, "master"), fact(s.master, "home_port"))
        yield q(f"At which harbour are the slipways that launched {s.name}?", s.yard.site,
                fact(s, "yard"), fact(s.yard, "site"))
        if s.master.mentor:
            yield q(f"Who taught seamanship to the one commanding {s.name}?", s.master.mentor,
                    fact(s, "master"), fact(s.master, "mentor"))
        if s.owner:
            yield q(f"Where is the merchant house that owns {s.name} seated?", s.owner.seat,
                    fact(s, "owner"), fact(s.owner, "seat"))
            yield q(f"Who heads the trading firm that {s.name} belongs to?", s.owner.head,
                    fact(s, "owner"), fact(s.owner, "head"))
    for e in w.expeditions:
        yield q(f"Which shipyard built the vessel that carried the {e.name}?", e.vessel.yard,
                fact(e, "vessel"), fact(e.vessel, "yard"))
        yield q(r.choice([f"Who was captain of the ship used by the {e.name}?",
                          f"Under whose command did the {e.name}'s ship sail?"]),
                e.vessel.master, fact(e, "vessel"), fact(e.vessel, "master"))
        yield q(f"In which year did the ship of the {e.name} first touch water?", e.vessel.launched,
                fact(e, "vessel"), fact(e.vessel, "launched"))
        yield q(f"Which dominion holds the harbour the {e.name} was heading to?", e.bound_for.dominion,
                fact(e, "bound_for"), fact(e.bound_for, "dominion"))
        yield q(f"Which port was home to the patron who funded the {e.name}?", e.patron.home_port,
                fact(e, "patron"), fact(e.patron, "home_port"))
    for p in w.ports:
        if p.dominion.chief_port is not p:
            yield q(f"Name the chief port of the dominion that {p.name} belongs to.", p.dominion.chief_port,
                    fact(p, "dominion"), fact(p.dominion, "chief_port"))
    for m in w.mariners:
        yield q(f"Under which dominion's flag lies {m.name}'s home port?", m.home_port.dominion,
                fact(m, "home_port"), fact(m.home_port, "dominion"))
        if m.mentor:
            yield q(f"When did the mentor of {m.name} first go to sea?", m.mentor.first_voyage,
                    fact(m, "mentor"), fact(m.mentor, "first_voyage"))
    for y in w.yards:
        yield q(f"To which dominion does the harbour of {y.name} belong?", y.site.dominion,
                fact(y, "site"), fact(y.site, "dominion"))


def bridge_3hop(w: AltWorld, r: random.Random) -> Iterator[Draft]:
    def q(text: str, value, *facts: str) -> Draft:
        return Draft("bridge-3hop", text, answer(value), facts)

    for s in w.ships:
        yield q(r.choice([f"Which dominion governs the harbour where {s.name} was built?",
                          f"In whose dominion do the slipways that launched {s.name} lie?"]),
                s.yard.site.dominion, fact(s, "yard"), fact(s.yard, "site"), fact(s.yard.site, "dominion"))
        yield q(f"From which port did the master builder of the yard behind {s.name} hail?",
                s.yard.builder.home_port, fact(s, "yard"), fact(s.yard, "builder"),
                fact(s.yard.builder, "home_port"))
        yield q(f"Which dominion is home to the captain of {s.name}?", s.master.home_port.dominion,
                fact(s, "master"), fact(s.master, "home_port"), fact(s.master.home_port, "dominion"))
        if s.owner:
            yield q(f"What dominion holds the seat of the trading firm owning {s.name}?", s.owner.seat.dominion,
                    fact(s, "owner"), fact(s.owner, "seat"), fact(s.owner.seat, "dominion"))
    for e in w.expeditions:
        v = e.vessel
        yield q(f"What port did the captain of the {e.name}'s ship call home?", v.master.home_port,
                fact(e, "vessel"), fact(v, "master"), fact(v.master, "home_port"))
        yield q(f"At which harbour stand the slipways that built the ship of the {e.name}?", v.yard.site,
                fact(e, "vessel"), fact(v, "yard"), fact(v.yard, "site"))
        yield q(f"Which dominion claims the home port of the patron behind the {e.name}?",
                e.patron.home_port.dominion, fact(e, "patron"), fact(e.patron, "home_port"),
                fact(e.patron.home_port, "dominion"))
    for m in w.mariners:
        if m.mentor:
            yield q(f"Which dominion does the home port of {m.name}'s mentor lie in?", m.mentor.home_port.dominion,
                    fact(m, "mentor"), fact(m.mentor, "home_port"), fact(m.mentor.home_port, "dominion"))


def comparison(w: AltWorld, r: random.Random, n: int) -> Iterator[Draft]:
    def choice(items, text: str, rel: str, value, low: str, high: str) -> Iterator[Draft]:
        for a, b in any_pairs(items, n, r, lambda a, b: value(a) != value(b)):
            first = r.random() < 0.5
            yield Draft("comparison", text.format(x=low if first else high, a=a.name, b=b.name),
                        (pick(a, b, value, first).name,), (fact(a, rel), fact(b, rel)))

    yield from choice(w.ships, "Of {a} and {b}, which left the slipway {x}?", "launched", lambda s: s.launched,
                      "first", "last")
    yield from choice(w.ships, "Of {a} and {b}, which ship is {x} by burthen?", "tonnage",
                      lambda s: s.tonnage, "lighter", "heavier")
    yield from choice(w.ports, "Which harbour has {x} berths: {a} or {b}?", "berths", lambda p: p.berths,
                      "fewer", "more")
    yield from choice(w.ports, "Of {a} and {b}, which port got its charter {x}?", "chartered", lambda p: p.chartered,
                      "first", "last")
    yield from choice(w.mariners, "Of {a} and {b}, who went to sea {x}?", "first_voyage",
                      lambda m: m.first_voyage, "first", "last")
    yield from choice(w.expeditions, "Did the {a} or the {b} weigh anchor {x}?", "set_sail", lambda e: e.set_sail,
                      "first", "last")
    yield from choice(w.yards, "Of {a} and {b}, which yard has been at work {x}?", "opened", lambda y: -y.opened,
                      "for less time", "for longer")

    def yes_no(items, template: str, rel: str, same) -> Iterator[Draft]:
        for a, b in yes_no_pairs(items, n // 2, r, same):
            yield Draft("comparison", template.format(a=a.name, b=b.name),
                        ("yes" if same(a) == same(b) else "no",), (fact(a, rel), fact(b, rel)))

    yield from yes_no(w.mariners, "Do {a} and {b} hail from one and the same port?", "home_port",
                      lambda m: m.home_port.key)
    yield from yes_no(w.ships, "Do {a} and {b} carry papers from one harbour?", "registry",
                      lambda s: s.registry.key)


def bridge_comparison(w: AltWorld, r: random.Random, n: int) -> Iterator[Draft]:
    def choice(items, text: str, rel, hop, rel2: str, value, low: str, high: str) -> Iterator[Draft]:
        def key(e):
            return value(hop(e))

        for a, b in any_pairs(items, n, r, lambda a, b: key(a) != key(b)):
            first = r.random() < 0.5
            yield Draft("bridge-comparison", text.format(x=low if first else high, a=a.name, b=b.name),
                        (pick(a, b, key, first).name,),
                        (fact(a, rel), fact(hop(a), rel2), fact(b, rel), fact(hop(b), rel2)))

    yield from choice(w.ships, "Of {a} and {b}, whose captain went to sea {x}?", "master", lambda s: s.master,
                      "first_voyage", lambda m: m.first_voyage, "first", "last")
    yield from choice(w.expeditions, "Which sailed in the {x} ship, the {a} or the {b}?", "vessel",
                      lambda e: e.vessel, "launched", lambda s: -s.launched, "newer", "older")
    yield from choice(w.ships, "Which came from the yard that has worked {x}, {a} or {b}?", "yard",
                      lambda s: s.yard, "opened", lambda y: -y.opened, "for less time", "for longer")
    yield from choice(w.expeditions, "Which voyage was bound for the harbour with {x} berths, the {a} or the {b}?",
                      "bound_for", lambda e: e.bound_for, "berths", lambda p: p.berths, "fewer", "more")
    for a, b in yes_no_pairs(w.ships, n // 2, r, lambda s: s.master.home_port.key):
        if a.master is b.master:
            continue
        same = a.master.home_port is b.master.home_port
        yield Draft("bridge-comparison", f"Do the captains of {a.name} and {b.name} share a home port?",
                    ("yes" if same else "no",), (fact(a, "master"), fact(a.master, "home_port"),
                                                 fact(b, "master"), fact(b.master, "home_port")))


def inference(w: AltWorld, r: random.Random) -> Iterator[Draft]:
    """Lineage composed from mentor and sibling links, as the main world composes kinship."""
    def kin(m: Mariner) -> str:
        return "brother" if m.gender == "m" else "sister"

    for m in w.mariners:
        t = m.mentor
        if t and t.mentor:
            yield Draft("inference", r.choice([f"Who trained the seafarer who trained {m.name}?",
                                               f"Name the mentor of {m.name}'s own mentor."]),
                        (t.mentor.name,), (fact(m, "mentor"), fact(t, "mentor")))
        if t and t.sibling:
            yield Draft("inference", f"Which {kin(t.sibling)} of {m.name}'s mentor also went to sea?",
                        (t.sibling.name,), (fact(m, "mentor"), fact(t, "sibling")))
        if m.sibling and m.sibling.mentor:
            yield Draft("inference", f"Who taught the sea to the {kin(m.sibling)} of {m.name}?",
                        (m.sibling.mentor.name,), (fact(m, "sibling"), fact(m.sibling, "mentor")))


def drafts(w: AltWorld, r: random.Random, per_pattern: int) -> dict[str, list[Draft]]:
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
