"""The fictional world: entities, their relations, and how they are drawn at random.

Dates are drawn so that the world is consistent (people found companies as adults, a film
comes out after the novel it adapts, a label exists before it releases an album), because a
question whose answer contradicts another passage would teach a searching model nonsense.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import ClassVar

from searchrl.data.toyworld.names import NameForge

LAST_YEAR = 2023

FILM_TITLES = ("The {} Gate", "Night over {}", "{}", "The Last Days of {}", "{} Rising",
               "Return to {}", "The {} Affair", "A Summer in {}", "Beyond {}", "The {} Protocol")
BOOK_TITLES = ("The House of {}", "{}", "Letters from {}", "The {} Chronicles", "A Song for {}",
               "The Winter of {}", "Under the {} Moon", "The {} Inheritance")
ALBUM_TITLES = ("{}", "Blue {}", "{} Nights", "Songs from {}", "Electric {}", "The {} Sessions",
                "Glass {}", "{} Radio")
BAND_NAMES = ("The {}s", "{} Parade", "{} Circuit", "The {} Lanterns", "{} Collective")
UNIVERSITY_NAMES = ("{} University", "University of {}", "{} Institute of Technology",
                    "{} College", "Royal {} Academy")
INDUSTRIES = {  # industry -> company-name patterns
    "record label": ("{} Records", "{} Music"),
    "publishing house": ("{} Press", "{} Books"),
    "film studio": ("{} Pictures", "{} Studios"),
    "shipping": ("{} Shipping Lines",), "brewing": ("{} Brewery",), "software": ("{} Systems",),
    "automotive": ("{} Motors",), "pharmaceutical": ("{} Pharma",), "aviation": ("{} Aero",),
    "textile": ("{} Textiles",),
}
FILM_GENRES = ("drama", "comedy", "thriller", "science fiction", "war", "crime", "musical",
               "historical drama", "horror", "romantic comedy")
BOOK_GENRES = ("historical", "crime", "science fiction", "fantasy", "literary", "satirical", "gothic")
BAND_GENRES = ("rock", "folk", "jazz", "synth-pop", "punk", "indie", "heavy metal", "soul")
BAND_ROLES = ("lead vocalist", "guitarist", "bassist", "drummer", "keyboardist")
OTHER_JOBS = ("politician", "physicist", "painter", "architect", "diplomat", "chemist",
              "journalist", "sculptor", "economist", "mathematician", "composer", "athlete")


@dataclass(eq=False)
class Entity:
    key: str
    name: str
    kind: ClassVar[str] = "entity"


@dataclass(eq=False)
class Country(Entity):
    kind: ClassVar[str] = "country"
    adjective: str = ""
    official: str = ""
    region: str = ""
    language: str = ""
    currency: str = ""
    independence: int = 0
    population_m: float = 0.0
    capital: City | None = None
    cities: list[City] = field(default_factory=list)


@dataclass(eq=False)
class City(Entity):
    kind: ClassVar[str] = "city"
    country: Country | None = None
    population: int = 0
    founded: int = 0
    river: str = ""


@dataclass(eq=False)
class University(Entity):
    kind: ClassVar[str] = "university"
    city: City | None = None
    founded: int = 0
    style: str = ""


@dataclass(eq=False)
class Person(Entity):
    kind: ClassVar[str] = "person"
    gender: str = "m"
    born: int = 0
    died: int | None = None
    birthplace: City | None = None
    deathplace: City | None = None
    citizenship: Country | None = None
    job: str = ""
    father: Person | None = None
    mother: Person | None = None
    spouse: Person | None = None
    married: int = 0
    alma_mater: University | None = None
    children: list[Person] = field(default_factory=list)
    works: list[Entity] = field(default_factory=list)  # films, books, companies, bands, starring

    @property
    def surname(self) -> str:
        return self.name.split()[-1]


@dataclass(eq=False)
class Company(Entity):
    kind: ClassVar[str] = "company"
    industry: str = ""
    founded: int = 0
    founder: Person | None = None
    hq: City | None = None
    output: list[Entity] = field(default_factory=list)  # works it published / released / produced


@dataclass(eq=False)
class Band(Entity):
    kind: ClassVar[str] = "band"
    genre: str = ""
    city: City | None = None
    formed: int = 0
    members: list[tuple[Person, str]] = field(default_factory=list)
    label: Company | None = None
    albums: list[Album] = field(default_factory=list)


@dataclass(eq=False)
class Book(Entity):
    kind: ClassVar[str] = "book"
    genre: str = ""
    year: int = 0
    author: Person | None = None
    publisher: Company | None = None


@dataclass(eq=False)
class Film(Entity):
    kind: ClassVar[str] = "film"
    genre: str = ""
    year: int = 0
    director: Person | None = None
    studio: Company | None = None
    based_on: Book | None = None
    star: Person | None = None


@dataclass(eq=False)
class Album(Entity):
    kind: ClassVar[str] = "album"
    year: int = 0
    band: Band | None = None
    label: Company | None = None


@dataclass
class World:
    countries: list[Country] = field(default_factory=list)
    cities: list[City] = field(default_factory=list)
    universities: list[University] = field(default_factory=list)
    people: list[Person] = field(default_factory=list)
    companies: list[Company] = field(default_factory=list)
    bands: list[Band] = field(default_factory=list)
    books: list[Book] = field(default_factory=list)
    films: list[Film] = field(default_factory=list)
    albums: list[Album] = field(default_factory=list)

    def entities(self) -> list[Entity]:
        return [*self.countries, *self.cities, *self.universities, *self.people, *self.companies,
                *self.bands, *self.books, *self.films, *self.albums]


# Share of entities per kind. Nearly every entity fits one ~100-word passage (only rich ones
# take two), so there are about as many entities as passages.
SHARES = {"country": 0.012, "city": 0.09, "university": 0.03, "person": 0.45, "company": 0.075,
          "band": 0.035, "book": 0.12, "film": 0.12, "album": 0.068}


def entity_counts(passages: int) -> dict[str, int]:
    counts = {kind: max(2, round(share * passages)) for kind, share in SHARES.items()}
    counts["country"] = max(4, counts["country"])
    counts["city"] = max(3 * counts["country"], counts["city"])
    return counts


class Builder:
    """Draws one world; every random choice goes through `self.rng` in a fixed order."""

    def __init__(self, rng: random.Random, passages: int) -> None:
        self.rng = rng
        self.names = NameForge(rng)
        self.n = entity_counts(passages)
        self.w = World()
        self.person_names: set[str] = set()
        self.given = {g: [self.names.given(g) for _ in range(60 + self.n["person"] // 8)] for g in "mf"}

    def key(self, kind: str, i: int) -> str:
        return f"{kind}-{i:05d}"

    def build(self) -> World:
        self.places()
        self.people()
        self.companies()
        self.bands()
        self.books_and_films()
        self.lifespans()
        return self.w

    def places(self) -> None:
        r, w = self.rng, self.w
        regions = [self.names.region() for _ in range(max(2, self.n["country"] // 5))]
        for i in range(self.n["country"]):
            name, adjective = self.names.country()
            form = r.choice(("Republic", "Kingdom", "Federation", "Commonwealth", "Union"))
            w.countries.append(Country(
                self.key("country", i), name, adjective=adjective, official=f"{form} of {name}",
                region=r.choice(regions), language=self.names.word(("ic", "ish", "an")),
                currency=self.names.word(("", "o", "a")).lower(), independence=r.randint(1650, 1990),
                population_m=round(r.uniform(0.8, 90.0), 1)))
        for i in range(self.n["city"]):
            # Every country gets three cities first, so each has a capital and comparisons.
            country = w.countries[i % len(w.countries)] if i < 3 * len(w.countries) else r.choice(w.countries)
            city = City(self.key("city", i), self.names.city(), country=country,
                        population=int(10 ** r.uniform(4.3, 6.4)) // 100 * 100,
                        founded=r.randint(700, 1900), river=self.names.word())
            country.cities.append(city)
            w.cities.append(city)
        for country in w.countries:
            country.capital = max(country.cities, key=lambda c: c.population)
        for i in range(self.n["university"]):
            pattern = r.choice(UNIVERSITY_NAMES)
            w.universities.append(University(
                self.key("university", i), pattern.format(self.names.word()), city=r.choice(w.cities),
                founded=r.randint(1200, 1960),
                style=r.choice(("public research university", "private university", "technical university",
                                "liberal arts college", "university"))))

    def new_person(self, gender: str, born: int, surname: str | None = None,
                   birthplace: City | None = None) -> Person:
        r = self.rng
        surname = surname or self.names.family()
        while True:
            name = f"{r.choice(self.given[gender])} {surname}"
            if name not in self.person_names:
                break
        self.person_names.add(name)
        birthplace = birthplace or r.choice(self.w.cities)
        # A quarter hold another country's citizenship, so birthplace does not give it away.
        citizenship = birthplace.country if r.random() < 0.75 else r.choice(self.w.countries)
        schools = [u for u in self.w.universities if u.founded <= born + 18]
        p = Person(self.key("person", len(self.w.people)), name, gender=gender, born=born,
                   birthplace=birthplace, citizenship=citizenship,
                   alma_mater=r.choice(schools) if schools and r.random() < 0.55 else None)
        self.w.people.append(p)
        return p

    def marry(self, a: Person, b: Person) -> None:
        a.spouse, b.spouse = b, a
        a.married = b.married = min(LAST_YEAR, max(a.born, b.born) + self.rng.randint(20, 34))

    def people(self) -> None:
        """Three-generation families first (for grandparent questions), then unrelated people."""
        r = self.rng
        target = self.n["person"]
        lineages = max(3, target // 22)
        gen1: list[Person] = []
        for _ in range(lineages):
            head = self.new_person("m", r.randint(1850, 1900))
            wife = self.new_person("f", head.born + r.randint(-6, 4))
            self.marry(head, wife)
            for _ in range(r.randint(2, 3)):
                child = self.child(head, wife)
                gen1.append(child)
        sons = [p for p in gen1 if p.gender == "m"]
        daughters = [p for p in gen1 if p.gender == "f"]
        r.shuffle(daughters)
        for son in sons:
            match = next((d for d in daughters if d.spouse is None and d.father is not son.father
                          and abs(d.born - son.born) <= 10), None)
            wife = match or self.new_person("f", son.born + r.randint(-5, 5))
            self.marry(son, wife)
            for _ in range(r.randint(1, 3)):
                self.child(son, wife)
        while len(self.w.people) < target:
            p = self.new_person(r.choice("mf"), r.randint(1850, 1995))
            if r.random() < 0.3 and len(self.w.people) < target:
                partner = self.new_person("f" if p.gender == "m" else "m", p.born + r.randint(-6, 6))
                self.marry(p, partner)

    def child(self, father: Person, mother: Person) -> Person:
        r = self.rng
        born = max(father.married + 1, mother.born + r.randint(20, 38))
        home = father.birthplace if r.random() < 0.6 else None
        child = self.new_person(r.choice("mf"), born, father.surname, home)
        child.father, child.mother = father, mother
        father.children.append(child)
        mother.children.append(child)
        return child

    def pick(self, pool: list[Person], n: int, born: tuple[int, int]) -> list[Person]:
        """Take up to `n` unassigned people born in the `born` range out of `pool`."""
        chosen = [p for p in pool if not p.job and born[0] <= p.born <= born[1]][:n]
        for p in chosen:
            p.job = "-"  # reserved; the real job title is set by the caller
        return chosen

    def companies(self) -> None:
        r, w = self.rng, self.w
        pool = r.sample(w.people, len(w.people))
        industries = sorted(INDUSTRIES)
        weights = [6 if i in ("record label", "publishing house", "film studio") else 1 for i in industries]
        for i, founder in enumerate(self.pick(pool, self.n["company"], (0, 1990))):
            industry = r.choices(industries, weights)[0] if i >= 3 else ("record label", "publishing house",
                                                                         "film studio")[i]
            founder.job = "entrepreneur"
            name = r.choice(INDUSTRIES[industry]).format(self.names.word())
            c = Company(self.key("company", i), name, industry=industry,
                        founded=min(LAST_YEAR - 1, founder.born + r.randint(24, 55)), founder=founder,
                        hq=founder.birthplace if r.random() < 0.4 else r.choice(w.cities))
            founder.works.append(c)
            w.companies.append(c)

    def firms(self, industry: str, year: int) -> Company | None:
        options = [c for c in self.w.companies if c.industry == industry and c.founded <= year]
        return self.rng.choice(options) if options else None

    def bands(self) -> None:
        r, w = self.rng, self.w
        pool = r.sample(w.people, len(w.people))
        # Birth windows keep media in their era: no albums before the 1920s, no films before the 1890s.
        musicians = sorted(self.pick(pool, self.n["band"] * 3, (1900, 1995)), key=lambda p: p.born)
        i = 0
        while len(w.bands) < self.n["band"] and i + 2 <= len(musicians):
            size = r.randint(2, 4)
            group, i = musicians[i:i + size], i + size
            formed = min(LAST_YEAR - 2, max(p.born for p in group) + r.randint(18, 26))
            roles = ["lead vocalist", *r.sample(BAND_ROLES[1:], len(group) - 1)]
            band = Band(self.key("band", len(w.bands)), r.choice(BAND_NAMES).format(self.names.word()),
                        genre=r.choice(BAND_GENRES), city=r.choice(w.cities), formed=formed,
                        members=list(zip(group, roles)), label=self.firms("record label", formed + 5))
            for p, role in band.members:
                p.job = "singer" if role == "lead vocalist" else role
                p.works.append(band)
            w.bands.append(band)
        for i in range(self.n["album"]):
            band = w.bands[i % len(w.bands)] if i < len(w.bands) else r.choice(w.bands)
            year = min(LAST_YEAR, band.formed + r.randint(1, 25))
            label = band.label if band.label and band.label.founded <= year else self.firms("record label", year)
            album = Album(self.key("album", i), r.choice(ALBUM_TITLES).format(self.names.word()),
                          year=year, band=band, label=label)
            band.albums.append(album)
            if label:
                label.output.append(album)
            w.albums.append(album)

    def books_and_films(self) -> None:
        r, w = self.rng, self.w
        pool = r.sample(w.people, len(w.people))
        authors = self.pick(pool, max(2, self.n["book"] * 10 // 22), (0, 1993))
        directors = self.pick(pool, max(2, self.n["film"] * 10 // 25), (1865, 1993))
        actors = self.pick(pool, max(2, self.n["film"] * 10 // 25), (1860, 2000))
        for p in authors:
            p.job = "novelist"
        for p in directors:
            p.job = "film director"
        for p in actors:
            p.job = "actor" if p.gender == "m" else "actress"
        for p in w.people:
            if not p.job:
                p.job = r.choice(OTHER_JOBS)
        for i in range(self.n["book"]):
            author = authors[i] if i < len(authors) else r.choice(authors)
            year = min(LAST_YEAR, author.born + r.randint(24, 70))
            book = Book(self.key("book", i), r.choice(BOOK_TITLES).format(self.names.word()),
                        genre=r.choice(BOOK_GENRES), year=year, author=author,
                        publisher=self.firms("publishing house", year))
            author.works.append(book)
            if book.publisher:
                book.publisher.output.append(book)
            w.books.append(book)
        adaptable = sorted(w.books, key=lambda b: b.year)
        adapted: set[str] = set()
        for i in range(self.n["film"]):
            director = directors[i] if i < len(directors) else r.choice(directors)
            year = min(LAST_YEAR, director.born + r.randint(25, 65))
            stars = [a for a in actors if a.born + 8 <= year]
            source = None
            if r.random() < 0.4:
                options = [b for b in adaptable if b.year < year and b.key not in adapted]
                source = r.choice(options[-40:]) if options else None
                if source:
                    adapted.add(source.key)
            film = Film(self.key("film", i), r.choice(FILM_TITLES).format(self.names.word()),
                        genre=r.choice(FILM_GENRES), year=year, director=director,
                        studio=self.firms("film studio", year), based_on=source,
                        star=r.choice(stars) if stars else None)
            director.works.append(film)
            if film.star:
                film.star.works.append(film)
            if film.studio:
                film.studio.output.append(film)
            w.films.append(film)

    def lifespans(self) -> None:
        """Death years last, once every dated event of a life is known."""
        r = self.rng
        for p in self.w.people:
            events = [p.born + 30, p.married, *(c.born for c in p.children)]
            events += [getattr(x, "year", 0) or getattr(x, "founded", 0) or getattr(x, "formed", 0)
                       for x in p.works]
            died = r.randint(max(events) + 1, max(max(events) + 2, p.born + 97))
            p.died = died if died <= LAST_YEAR else None
            if p.died:
                p.deathplace = p.birthplace if r.random() < 0.3 else r.choice(self.w.cities)
