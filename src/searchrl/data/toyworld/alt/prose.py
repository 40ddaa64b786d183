"""Background sentences for the held-out world: length and distractors, never an asked-about fact.

Some name other ports ("wintered at ...", "a sister town of ..."), the same trap as the main
world's fillers, in this world's own words.
"""

from __future__ import annotations

import random

from searchrl.data.toyworld.alt.world import (
    LAST_YEAR,
    Dominion,
    Expedition,
    House,
    Mariner,
    Port,
    Ship,
    Shipyard,
)
from searchrl.data.toyworld.world import Entity

WEATHERS = ("gales", "fog banks", "squalls", "calms", "ice floes", "heavy swells")
CARGOES = ("salt cod", "tar", "hemp", "pepper", "indigo", "whale oil", "copper ingots", "raisins")
HABITS = ("whittling", "mending nets", "reading star charts", "keeping caged finches", "playing the fiddle",
          "carving scrimshaw")
MANNERS = ("gruff", "soft-spoken", "superstitious", "cheerful", "careful", "hot-tempered", "devout")
COUNTS = ("two", "three", "four", "five", "six", "seven", "eight", "nine")

MARINER = (
    "Shipmates remembered {o} as {manner} but fair.",
    "Ashore, {s} passed long evenings {habit}.",
    "{S} survived a shipwreck off {port} and swam to shore.",
    "Once, {s} rode out {weather} for {count} days without sleep.",
    "{S} kept a logbook in a cramped hand, now kept by a maritime museum.",
    "{S} never learned to swim, like many sailors of that era.",
    "In old age {s} retired to a cottage overlooking {port2}.",
    "Tavern songs about {o} are still sung along the docks.",
    "{S} lost two fingers to a parted hawser.",
    "{S} carried {cargo} on early coastal runs.",
)
PORT = (
    "Fishing smacks crowd the inner basin each {season}.",
    "A stone lighthouse guards the harbour mouth.",
    "Warehouses along the wharf smell of {cargo} and {cargo2}.",
    "{S} counts {port} as a sister town.",
    "Packet boats run weekly from here to {port2}.",
    "Harbour dues were abolished in {later}.",
    "Its tide gauge is among the oldest still working.",
    "Dredgers deepened the channel in {later2}.",
)
DOMINION = (
    "Its flag shows a white anchor on a blue field.",
    "Most of its people live within sight of salt water.",
    "Its fleets once fought pirates along the outer banks.",
    "Winter {weather} close many of its harbours for weeks.",
    "Its council meets each {season} aboard an old hulk moored at {port}.",
    "Pilotage laws there go back to {later}.",
)
SHIP = (
    "{S} rounded the southern cape {count} times.",
    "Heavy {weather} once cost {o} a topmast.",
    "{S} wintered at {port} after a hard passage.",
    "Her figurehead is a carved heron.",
    "{S} ran {cargo} and {cargo2} between distant harbours.",
    "A refit in {later} gave {o} copper sheathing.",
    "Sailors thought {o} a lucky vessel.",
    "{S} could log eleven knots before a fair breeze.",
)
YARD = (
    "Its sheds smell of pitch and fresh oak shavings.",
    "Apprentice carpenters learn their trade on its smaller hulls.",
    "A fire gutted its rope walk in {later}.",
    "Timber for its keels is floated down from forests near {port}.",
    "Its dry dock was dug by hand over {count} years.",
    "Launch days there draw crowds from {port2}.",
)
HOUSE = (
    "Its ledgers record dealings in {cargo} and {cargo2}.",
    "Agents of the house keep offices in {port} and {port2}.",
    "Rivals accused it of smuggling more than once.",
    "It insured cargoes long before any bank did so.",
    "Its warehouses burned in {later} and were rebuilt in brick.",
    "A portrait gallery of its partners hangs above the trading floor.",
)
EXPEDITION = (
    "Its crew numbered some {crew} souls.",
    "The voyage met {weather} soon after leaving port.",
    "{S} charted {count} unknown inlets along the way.",
    "A journal kept on board was printed in {later}.",
    "The ship called at {port} for fresh water on the outward leg.",
    "Scurvy struck the crew during the long crossing.",
    "Several sailors deserted at {port2}.",
)
POOLS = {Mariner: MARINER, Port: PORT, Dominion: DOMINION, Ship: SHIP, Shipyard: YARD, House: HOUSE,
         Expedition: EXPEDITION}
SUBJECT = {k: "{" + k + "}" for k in ("S", "s", "P", "p", "o", "pp")}


def anchor_year(e: Entity) -> int:
    for attr in ("launched", "opened", "established", "set_sail", "chartered", "first_voyage"):
        if getattr(e, attr, 0):
            return getattr(e, attr)
    return 1750


def fillers(e: Entity, r: random.Random, ports: list[Port], n: int = 8) -> list[str]:
    """`n` background sentences for `e`, slots filled, subject placeholders kept."""
    later = min(LAST_YEAR, anchor_year(e) + r.randint(3, 40))
    others = [p.name for p in r.sample(ports, 3) if p is not e]
    slots = {
        "manner": r.choice(MANNERS), "habit": r.choice(HABITS), "weather": r.choice(WEATHERS),
        "cargo": (c := r.sample(CARGOES, 2))[0], "cargo2": c[1], "count": r.choice(COUNTS),
        "season": r.choice(("spring", "summer", "autumn", "winter")), "port": others[0], "port2": others[1],
        "later": later, "later2": min(LAST_YEAR, later + r.randint(1, 15)), "crew": r.randint(3, 30) * 10,
    }
    pool = POOLS[type(e)]
    return [t.format(**slots, **SUBJECT) for t in r.sample(pool, min(n, len(pool)))]
