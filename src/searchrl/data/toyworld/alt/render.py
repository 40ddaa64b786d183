"""The held-out world's passages: its own sentence shapes and verbs ("slid down the ways at",
"hailed from", "sailed on the purse of"), packed by the main world's `pack`.

Facts are recorded as in the main world (`"<entity key>:<relation>"`), so questions take their
supporting passages from where each fact landed.
"""

from __future__ import annotations

import random

from searchrl.data.toyworld.alt.prose import fillers
from searchrl.data.toyworld.alt.world import (
    Dominion,
    Expedition,
    House,
    Mariner,
    Port,
    Ship,
    Shipyard,
)
from searchrl.data.toyworld.render import Chunk, Sentence, article, fact, names, pack
from searchrl.data.toyworld.world import Entity

NOUNS = {Ship: "ship", Port: "port", Dominion: "dominion", Shipyard: "yard", House: "house",
         Expedition: "expedition"}

# A relation's name in a statement ("Jorel Star's captain is Wenric Auling.").
RELATION_NAMES = {
    "yard": "shipyard", "launched": "launch year", "tonnage": "burthen", "master": "captain",
    "owner": "owning house", "registry": "port of registry", "site": "harbour", "opened": "first year of work",
    "builder": "master builder", "seat": "seat", "established": "year of establishment", "head": "head",
    "vessel": "ship", "patron": "patron", "bound_for": "destination", "set_sail": "year of sailing",
    "dominion": "dominion", "chartered": "charter year", "berths": "number of berths",
    "chief_port": "chief port", "home_port": "home port", "mentor": "mentor", "first_voyage": "year of first voyage",
}


def statement(e: Entity, relation: str) -> str:
    """One fact of `e` as a plain sentence, in this world's possessive shape.

    >>> statement(Port("port-00001", "Ossund", berths=40), "berths")
    "Ossund's number of berths is 40."
    """
    value = getattr(e, relation)
    if relation == "sibling":
        return f"{e.name}'s {'brother' if value.gender == 'm' else 'sister'} is {value.name}."
    text = value.name if isinstance(value, Entity) else f"{value:,} tons" if relation == "tonnage" else str(value)
    return f"{e.name}'s {RELATION_NAMES[relation]} is {text}."


def subject_forms(e: Entity, full: bool, rng: random.Random) -> dict[str, str]:
    """The subject placeholders of `render.Sentence` for this world's kinds; ships are "she"."""
    if isinstance(e, Mariner):
        he, his, him = ("he", "his", "him") if e.gender == "m" else ("she", "her", "her")
    elif isinstance(e, Ship):
        he, his, him = "she", "her", "her"
    else:
        he, his, him = "it", "its", "it"
    if full:
        return {"S": e.name, "s": e.name, "P": f"{e.name}'s", "p": f"{e.name}'s", "o": e.name, "pp": his}
    if isinstance(e, Mariner):
        if rng.random() < 0.4:
            short = e.surname
            return {"S": short, "s": short, "P": f"{short}'s", "p": f"{short}'s", "o": short, "pp": his}
        return {"S": he.capitalize(), "s": he, "P": his.capitalize(), "p": his, "o": him, "pp": his}
    noun = f"the {NOUNS[type(e)]}"
    opener = he if rng.random() < 0.5 else noun
    return {"S": opener.capitalize(), "s": noun, "P": (opener + "'s" if opener == noun else his).capitalize(),
            "p": f"{noun}'s", "o": noun, "pp": his}


def mariner_sentences(m: Mariner, r: random.Random) -> list[Sentence]:
    y, home = m.first_voyage, m.home_port.name
    out = [Sentence(r.choice([f"{{S}}, {article(m.trade)} of the age of sail, first went to sea in {y}.",
                              f"{{S}} shipped out on a maiden voyage in {y} and afterwards served as {article(m.trade)}."]),
                    (fact(m, "first_voyage"),)),
           Sentence(r.choice([f"{{S}} hailed from {home}.", f"{{S}} grew up on the quays of {home}.",
                              f"{home} was home port to {{o}} all through {{pp}} working life."]),
                    (fact(m, "home_port"),))]
    if m.mentor:
        out.append(Sentence(r.choice([f"{{S}} learned seamanship under {m.mentor.name}.",
                                      f"As a youngster {{s}} apprenticed on deck to {m.mentor.name}.",
                                      f"{m.mentor.name} taught {{o}} to read wind and current."]),
                            (fact(m, "mentor"),)))
    if m.sibling:
        kin = "brother" if m.sibling.gender == "m" else "sister"
        out.append(Sentence(r.choice([f"{m.sibling.name}, {{p}} {kin}, likewise earned a living afloat.",
                                      f"{{S}} shared a childhood hammock with {{pp}} {kin}, {m.sibling.name}."]),
                            (fact(m, "sibling"),)))
    ships = [d for d in m.deeds if isinstance(d, Ship)]
    voyages = [d for d in m.deeds if isinstance(d, Expedition)]
    if ships:
        out.append(Sentence(f"{{S}} held command of {names(ships)}."))
    if voyages:
        out.append(Sentence(f"{{S}} put up the money for {names(voyages)}."))
    for d in m.deeds:
        if isinstance(d, Shipyard):
            out.append(Sentence(f"{{S}} ran the slipways of {d.name} as master builder."))
        elif isinstance(d, House):
            out.append(Sentence(f"{{S}} stood at the head of {d.name}."))
    if m.pupils:
        out.append(Sentence(f"Apprentices trained by {{o}} included {names(m.pupils, 2)}."))
    return out


def port_sentences(p: Port, r: random.Random, index: dict) -> list[Sentence]:
    dom = p.dominion.name
    chief = p.dominion.chief_port is p
    lead = (f"{{S}} is the chief port of {dom}." if chief else
            r.choice([f"{{S}} is a harbour town belonging to {dom}.", f"{{S}} sits on the shoreline of {dom}."]))
    out = [Sentence(lead, (fact(p, "dominion"),) + ((fact(p, "chief_of"),) if chief else ())),
           Sentence(r.choice([f"{{S}} received its royal charter in {p.chartered}.",
                              f"A charter granted in {p.chartered} made {{s}} a free harbour."]),
                    (fact(p, "chartered"),)),
           Sentence(r.choice([f"{{P}} quays offer {p.berths} berths.",
                              f"Up to {p.berths} vessels can moor at {{p}} berths at once."]),
                    (fact(p, "berths"),))]
    locals_, yards, houses = (index[k].get(p.key, []) for k in ("locals", "yards", "houses"))
    if yards:
        out.append(Sentence(f"Keels are laid on its waterfront at {names(yards, 2)}."))
    if houses:
        out.append(Sentence(f"Among the merchant houses seated here are {names(houses, 2)}."))
    if locals_:
        out.append(Sentence(f"Among the sailors raised on these docks are {names(locals_, 2)}."))
    return out


def dominion_sentences(d: Dominion, r: random.Random) -> list[Sentence]:
    others = [p for p in d.ports if p is not d.chief_port]
    out = [Sentence(r.choice([f"{{S}} is a seafaring dominion whose chief port is {d.chief_port.name}.",
                              f"{d.chief_port.name} serves as the chief port of {{o}}, a seafaring dominion."]),
                    (fact(d, "chief_port"),))]
    if others:
        out.append(Sentence(f"Lesser harbours under its flag are {names(others)}."))
    return out


def vessel_sentences(e: Entity, r: random.Random) -> list[Sentence]:
    """Ships, shipyards, merchant houses and expeditions."""
    if isinstance(e, Ship):
        out = [Sentence(r.choice([f"{{S}} is {article(e.rig)} that slid down the ways at {e.yard.name} in {e.launched}.",
                                  f"Launched by {e.yard.name} in {e.launched}, {{s}} is {article(e.rig)}."]),
                        (fact(e, "yard"), fact(e, "launched"))),
               Sentence(r.choice([f"{{S}} carries {e.tonnage:,} tons burthen.",
                                  f"{{P}} burthen comes to {e.tonnage:,} tons."]), (fact(e, "tonnage"),)),
               Sentence(r.choice([f"{e.master.name} commands {{o}}.", f"{{S}} sails under Captain {e.master.name}."]),
                        (fact(e, "master"),)),
               Sentence(r.choice([f"{{S}} is registered at {e.registry.name}.",
                                  f"{{P}} papers give {e.registry.name} as {{pp}} home harbour."]),
                        (fact(e, "registry"),))]
        if e.owner:
            out.append(Sentence(r.choice([f"{e.owner.name} owns {{o}}.",
                                          f"{{S}} belongs to the fleet of {e.owner.name}."]), (fact(e, "owner"),)))
    elif isinstance(e, Shipyard):
        out = [Sentence(r.choice([f"{{S}} laid its first keel at {e.site.name} in {e.opened}.",
                                  f"Working since {e.opened}, {{s}} occupies the waterfront of {e.site.name}."]),
                        (fact(e, "site"), fact(e, "opened"))),
               Sentence(r.choice([f"{e.builder.name} runs {{o}} as master builder.",
                                  f"The slipways answer to master builder {e.builder.name}."]), (fact(e, "builder"),))]
        if e.hulls:
            out.append(Sentence(f"Hulls from its slipways number among them {names(e.hulls)}."))
    elif isinstance(e, House):
        out = [Sentence(r.choice([f"{{S}} is a merchant house seated at {e.seat.name}.",
                                  f"Seated at {e.seat.name}, {{s}} deals in timber, salt and spices."]),
                        (fact(e, "seat"),)),
               Sentence(r.choice([f"{{S}} opened its counting-house doors in {e.established}.",
                                  f"Its charter of trade dates from {e.established}."]), (fact(e, "established"),)),
               Sentence(r.choice([f"{e.head.name} heads {{o}}.", f"At the head of {{o}} stands {e.head.name}."]),
                        (fact(e, "head"),))]
        if e.fleet:
            out.append(Sentence(f"Its fleet counts {names(e.fleet)}."))
    elif isinstance(e, Expedition):
        out = [Sentence(r.choice([f"{{S}} left harbour in {e.set_sail} aboard {e.vessel.name}.",
                                  f"Aboard {e.vessel.name}, {{s}} put to sea in {e.set_sail}."]),
                        (fact(e, "vessel"), fact(e, "set_sail"))),
               Sentence(r.choice([f"{{S}} set course for {e.bound_for.name}.",
                                  f"{{P}} goal was the harbour of {e.bound_for.name}."]), (fact(e, "bound_for"),)),
               Sentence(r.choice([f"{e.patron.name} paid for {{o}}.", f"{{S}} sailed on the purse of {e.patron.name}."]),
                        (fact(e, "patron"),))]
    else:
        raise TypeError(f"no sentences for {type(e).__name__}")
    return out


def render(entities: list[Entity], ports: list[Port], rng: random.Random,
           words: int) -> list[tuple[Entity, Chunk]]:
    """All chunks of all entities, in entity order."""
    index: dict[str, dict[str, list[Entity]]] = {"locals": {}, "yards": {}, "houses": {}}
    for e in entities:
        if isinstance(e, Mariner):
            index["locals"].setdefault(e.home_port.key, []).append(e)
        elif isinstance(e, Shipyard):
            index["yards"].setdefault(e.site.key, []).append(e)
        elif isinstance(e, House):
            index["houses"].setdefault(e.seat.key, []).append(e)
    out = []
    for e in entities:
        if isinstance(e, Mariner):
            sentences = mariner_sentences(e, rng)
        elif isinstance(e, Port):
            sentences = port_sentences(e, rng, index)
        elif isinstance(e, Dominion):
            sentences = dominion_sentences(e, rng)
        else:
            sentences = vessel_sentences(e, rng)
        chunks = pack(e, sentences, fillers(e, rng, ports), rng, words, subject_forms)
        out.extend((e, chunk) for chunk in chunks)
    return out
