"""The held-out world: a seafaring age of dominions, ports, shipyards, merchant houses, ships,
expeditions and the mariners who sail them.

No kind and no relation is the main world's, so a model trained there meets other facts to read
(a ship's yard, an expedition's patron, a mariner's mentor) in other words. Years are drawn
consistent, as in the main world: a yard opens before it launches a ship, a ship is launched
before an expedition sails in it, a mentor went to sea before the pupil.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import ClassVar

from searchrl.data.toyworld.alt.names import AltForge
from searchrl.data.toyworld.world import Entity

LAST_YEAR = 1890  # an age of sail: every date falls before it

SHIP_NAMES = ("{} Star", "Wind of {}", "{}", "{} Venture", "Lady {}", "{} Spray", "Pride of {}", "{} Gull")
YARD_NAMES = ("{} Yard", "{} Dockworks", "{} Slipways")
HOUSE_NAMES = ("House {}", "{} Trading Company", "{} Mercantile")
EXPEDITION_NAMES = ("{} Expedition", "{} Survey", "{} Passage Voyage")
RIGS = ("brig", "schooner", "barque", "frigate", "sloop", "clipper", "galleon", "ketch")
TRADES = ("navigator", "cartographer", "quartermaster", "harbour pilot", "boatswain", "purser")


@dataclass(eq=False)
class Dominion(Entity):
    kind: ClassVar[str] = "dominion"
    chief_port: Port | None = None
    ports: list[Port] = field(default_factory=list)


@dataclass(eq=False)
class Port(Entity):
    kind: ClassVar[str] = "port"
    dominion: Dominion | None = None
    chartered: int = 0
    berths: int = 0


@dataclass(eq=False)
class Mariner(Entity):
    kind: ClassVar[str] = "mariner"
    gender: str = "m"
    trade: str = ""
    home_port: Port | None = None
    first_voyage: int = 0
    mentor: Mariner | None = None
    sibling: Mariner | None = None
    pupils: list[Mariner] = field(default_factory=list)
    deeds: list[Entity] = field(default_factory=list)  # ships commanded, yards run, houses headed, voyages paid for

    @property
    def surname(self) -> str:
        return self.name.split()[-1]


@dataclass(eq=False)
class Shipyard(Entity):
    kind: ClassVar[str] = "shipyard"
    site: Port | None = None
    opened: int = 0
    builder: Mariner | None = None
    hulls: list[Ship] = field(default_factory=list)


@dataclass(eq=False)
class House(Entity):
    kind: ClassVar[str] = "house"
    seat: Port | None = None
    established: int = 0
    head: Mariner | None = None
    fleet: list[Ship] = field(default_factory=list)


@dataclass(eq=False)
class Ship(Entity):
    kind: ClassVar[str] = "ship"
    rig: str = ""
    yard: Shipyard | None = None
    launched: int = 0
    tonnage: int = 0
    master: Mariner | None = None
    owner: House | None = None
    registry: Port | None = None


@dataclass(eq=False)
class Expedition(Entity):
    kind: ClassVar[str] = "expedition"
    vessel: Ship | None = None
    patron: Mariner | None = None
    bound_for: Port | None = None
    set_sail: int = 0


@dataclass
class AltWorld:
    dominions: list[Dominion] = field(default_factory=list)
    ports: list[Port] = field(default_factory=list)
    mariners: list[Mariner] = field(default_factory=list)
    yards: list[Shipyard] = field(default_factory=list)
    houses: list[House] = field(default_factory=list)
    ships: list[Ship] = field(default_factory=list)
    expeditions: list[Expedition] = field(default_factory=list)

    def entities(self) -> list[Entity]:
        return [*self.dominions, *self.ports, *self.mariners, *self.yards, *self.houses, *self.ships,
                *self.expeditions]


# Share of entities per kind; about one passage each, as in the main world.
SHARES = {"dominion": 0.008, "port": 0.06, "mariner": 0.42, "shipyard": 0.035, "house": 0.035,
          "ship": 0.26, "expedition": 0.18}


def entity_counts(passages: int) -> dict[str, int]:
    counts = {kind: max(2, round(share * passages)) for kind, share in SHARES.items()}
    counts["dominion"] = max(3, counts["dominion"])
    counts["port"] = max(3 * counts["dominion"], counts["port"])
    return counts


class AltBuilder:
    """Draws one held-out world; every random choice goes through `self.rng` in a fixed order."""

    def __init__(self, rng: random.Random, passages: int) -> None:
        self.rng = rng
        self.names = AltForge(rng)
        self.n = entity_counts(passages)
        self.w = AltWorld()
        self.taken: set[str] = set()
        self.given = {g: [self.names.given(g) for _ in range(50 + self.n["mariner"] // 8)] for g in "mf"}

    def key(self, kind: str, i: int) -> str:
        return f"{kind}-{i:05d}"

    def build(self) -> AltWorld:
        self.places()
        self.mariners()
        self.yards_and_houses()
        self.ships()
        self.expeditions()
        return self.w

    def places(self) -> None:
        r, w = self.rng, self.w
        for i in range(self.n["dominion"]):
            w.dominions.append(Dominion(self.key("dominion", i), self.names.dominion()))
        for i in range(self.n["port"]):
            # Three ports a dominion first, so each has a chief port and others to compare.
            dom = w.dominions[i % len(w.dominions)] if i < 3 * len(w.dominions) else r.choice(w.dominions)
            port = Port(self.key("port", i), self.names.port(), dominion=dom, chartered=r.randint(1320, 1760),
                        berths=r.randint(4, 90))
            dom.ports.append(port)
            w.ports.append(port)
        for dom in w.dominions:
            dom.chief_port = max(dom.ports, key=lambda p: (p.berths, -p.chartered))

    def new_mariner(self, gender: str, first_voyage: int, surname: str | None = None) -> Mariner:
        r = self.rng
        surname = surname or self.names.family()
        while True:
            name = f"{r.choice(self.given[gender])} {surname}"
            if name not in self.taken:
                break
        self.taken.add(name)
        m = Mariner(self.key("mariner", len(self.w.mariners)), name, gender=gender,
                    home_port=r.choice(self.w.ports), first_voyage=first_voyage)
        self.w.mariners.append(m)
        return m

    def mariners(self) -> None:
        """Sibling pairs and single mariners; then mentors, each from an earlier generation at sea."""
        r, w = self.rng, self.w
        while len(w.mariners) < self.n["mariner"]:
            a = self.new_mariner(r.choice("mf"), r.randint(1700, 1870))
            if r.random() < 0.35 and len(w.mariners) < self.n["mariner"]:
                b = self.new_mariner(r.choice("mf"), min(1875, a.first_voyage + r.randint(-8, 8)), a.surname)
                a.sibling, b.sibling = b, a
                if r.random() < 0.6:
                    b.home_port = a.home_port
        by_year = sorted(w.mariners, key=lambda m: (m.first_voyage, m.key))
        for m in by_year:
            elders = [x for x in by_year if x.first_voyage <= m.first_voyage - 12 and x is not m.sibling]
            if elders and r.random() < 0.75:
                # Recent elders mostly, so lineages run three deep and more.
                m.mentor = r.choice(elders[-60:])
                m.mentor.pupils.append(m)

    def hire(self, trade: str, n: int, latest: int) -> list[Mariner]:
        """Up to `n` mariners without a trade who went to sea by `latest`, given `trade`."""
        pool = [m for m in self.rng.sample(self.w.mariners, len(self.w.mariners))
                if not m.trade and m.first_voyage <= latest][:n]
        for m in pool:
            m.trade = trade
        return pool

    def yards_and_houses(self) -> None:
        r, w = self.rng, self.w
        for i, builder in enumerate(self.hire("shipwright", self.n["shipyard"], 1840)):
            yard = Shipyard(self.key("shipyard", i), r.choice(YARD_NAMES).format(self.names.word()),
                            site=builder.home_port if r.random() < 0.5 else r.choice(w.ports),
                            opened=builder.first_voyage + r.randint(8, 30), builder=builder)
            builder.deeds.append(yard)
            w.yards.append(yard)
        for i, head in enumerate(self.hire("merchant", self.n["house"], 1850)):
            house = House(self.key("house", i), r.choice(HOUSE_NAMES).format(self.names.word()),
                          seat=r.choice(w.ports), established=head.first_voyage + r.randint(5, 25), head=head)
            head.deeds.append(house)
            w.houses.append(house)

    def ships(self) -> None:
        r, w = self.rng, self.w
        captains = self.hire("captain", max(2, self.n["ship"] * 10 // 16), 1870)
        for i in range(self.n["ship"]):
            yard = w.yards[i % len(w.yards)] if i < len(w.yards) else r.choice(w.yards)
            launched = min(LAST_YEAR - 5, yard.opened + r.randint(1, 40))
            owners = [h for h in w.houses if h.established <= launched]
            masters = [c for c in captains if c.first_voyage + 6 <= launched] or captains
            ship = Ship(self.key("ship", i), r.choice(SHIP_NAMES).format(self.names.word()), rig=r.choice(RIGS),
                        yard=yard, launched=launched, tonnage=r.randint(12, 240) * 10, master=r.choice(masters),
                        owner=r.choice(owners) if owners and r.random() < 0.7 else None,
                        registry=yard.site if r.random() < 0.4 else r.choice(w.ports))
            yard.hulls.append(ship)
            ship.master.deeds.append(ship)
            if ship.owner:
                ship.owner.fleet.append(ship)
            w.ships.append(ship)

    def expeditions(self) -> None:
        r, w = self.rng, self.w
        patrons = self.hire("patron", max(2, self.n["expedition"] * 10 // 25), 1875)
        for m in w.mariners:
            if not m.trade:
                m.trade = r.choice(TRADES)
        for i in range(self.n["expedition"]):
            ship = w.ships[i % len(w.ships)] if i < len(w.ships) else r.choice(w.ships)
            year = min(LAST_YEAR, ship.launched + r.randint(1, 12))
            funders = [p for p in patrons if p.first_voyage <= year] or patrons
            exp = Expedition(self.key("expedition", i), r.choice(EXPEDITION_NAMES).format(self.names.word()),
                             vessel=ship, patron=r.choice(funders),
                             bound_for=r.choice([p for p in w.ports if p is not ship.registry]), set_sail=year)
            exp.patron.deeds.append(exp)
            w.expeditions.append(exp)
