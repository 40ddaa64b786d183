"""Background sentences that bring passages up to length without stating any asked-about fact.

They vary per entity (random slots, random subset), and some name other cities of the world
("shot on location in ...", "twinned with ..."): true in the world, never asked about, and a
realistic trap for a reader that grabs the first place name it sees.
"""

from __future__ import annotations

import random

from searchrl.data.toyworld.world import (
    LAST_YEAR,
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

QUALITIES = ("restrained", "sweeping", "playful", "austere", "lyrical", "bold", "meticulous",
             "unhurried", "inventive", "melancholy", "brisk", "generous")
TRAITS = ("reserved", "witty", "stubborn", "generous", "restless", "patient", "exacting", "warm")
PASTIMES = ("sailing", "beekeeping", "chess", "mountain walking", "restoring old clocks",
            "amateur astronomy", "gardening", "collecting maps")
SEASONS = ("spring", "summer", "autumn", "winter")
TRADES = ("trade", "light industry", "shipbuilding", "textiles", "tourism", "food processing", "printing")
CROPS = ("grain", "fruit", "wine grapes", "potatoes", "sugar beet", "olives", "hops")
NUMBERS = ("two", "three", "four", "five", "six", "seven", "eight", "nine")

PERSON = (
    "{S} was known among colleagues for {q_a} working style.",
    "Later in life {s} devoted much time to {pastime}.",
    "Contemporaries described {o} as {trait} and {trait2}.",
    "{S} gave few interviews and kept {pp} private life out of the press.",
    "A collection of {pp} letters and notebooks is held in a private archive.",
    "{S} received several national honours over the course of {pp} career.",
    "In {moved}, {s} moved to {city}, where the family kept a house for many years.",
    "{S} spoke {number} languages and read widely in each.",
    "A street in {city} was later named in {pp} honour.",
    "{S} spent a year abroad as a young adult, an experience {s} later called formative.",
)
MUSIC = ("{S} began performing in small clubs as a teenager.", "{S} was largely self-taught.",
         "{S} also wrote songs for other performers.", "{S} toured for much of {pp} twenties.")
JOBS = {
    "film director": ("{P} films are noted for long takes and natural light.",
                      "{S} began {pp} career as an assistant editor.",
                      "Several of {pp} films were restored by a national film archive.",
                      "{S} often worked with the same small crew for decades."),
    "novelist": ("{S} wrote most of {pp} books in the early morning hours.",
                 "{P} prose is admired for its clarity and dry humour.",
                 "{S} also published essays and short stories in literary magazines.",
                 "{S} taught creative writing for some years."),
    "entrepreneur": ("{S} built the business from a single rented workshop.",
                     "{S} was known for reinvesting nearly all of the profits.",
                     "{S} later sat on the boards of several charities.",
                     "Rivals regarded {o} as a shrewd negotiator."),
    "actor": ("{S} trained at a drama school before moving into film.", "{S} also appeared regularly on stage.",
              "Critics admired {pp} restraint in dramatic roles.", "{S} later worked as a voice actor."),
    "other": ("{S} worked in the field for more than three decades.",
              "{S} published widely and lectured at home and abroad.",
              "{S} held several public posts during a long career.",
              "Younger colleagues often sought {o} out for advice."),
}
JOBS |= {"actress": JOBS["actor"], **{job: MUSIC for job in ("singer", "guitarist", "bassist", "drummer",
                                                            "keyboardist")}}
CITY = (
    "The old town is known for its narrow lanes and a market held every {season}.",
    "Local festivals draw visitors each {season2}, filling the central square.",
    "The local economy rests on {trade}, {trade2} and a growing service sector.",
    "A tram network links the historic centre with the newer districts.",
    "Several museums in the centre document the region's crafts and history.",
    "The surrounding countryside is farmed for {crop} and {crop2}.",
    "Parks laid out along the old fortifications ring the inner city.",
    "{S} is twinned with {city}.",
    "A railway line opened in {rail} connects the city with {city2}.",
    "Its cathedral, completed in {later}, is the tallest building in the old town.",
)
COUNTRY = (
    "The country is a parliamentary democracy with a two-chamber legislature.",
    "Its economy is based on {trade}, mining and a growing tourism industry.",
    "The climate ranges from mild along the coast to harsh in the mountains.",
    "A national railway connects the capital with the main provincial towns.",
    "Its national holiday is celebrated each {season} with parades and concerts.",
    "The country is divided into {provinces} provinces.",
    "Its highest peak rises to {peak} metres above sea level.",
    "About {pct} percent of the population lives in towns and cities.",
)
FILM = (
    "Critics praised its {q} pacing and the cinematography.",
    "The film runs for {minutes} minutes.",
    "It premiered at a film festival in {city} before a wider release.",
    "Shooting took place on location in {city2} over {number} months.",
    "The score was recorded with a small chamber orchestra.",
    "A restored version was released in {later}.",
    "It received {number} nominations at the national film awards.",
    "It was a modest success at the box office.",
)
BOOK = (
    "Reviewers singled out its {q} prose and its large cast of characters.",
    "The novel runs to {pages} pages in its first edition.",
    "It has been translated into {number} languages.",
    "The story is set in {city} in the years before a great flood.",
    "The story unfolds over three generations of a single household.",
    "Its closing chapters divided critics on publication.",
    "A revised edition appeared in {later} with a new foreword.",
    "It was serialised in a literary magazine before appearing as a book.",
)
ALBUM = (
    "The album contains {tracks} tracks.",
    "Critics noted its {q} arrangements and spare production.",
    "The album produced {number} singles.",
    "It was recorded in {city} over {number} weeks.",
    "The cover art is a photograph taken at dusk.",
    "It peaked at number {chart} on the national albums chart.",
    "A deluxe edition with demos and outtakes followed in {later}.",
    "Several guest musicians appear on it.",
)
BAND = (
    "The band built a following with {q} live shows.",
    "Its early songs were recorded on borrowed equipment.",
    "The group first toured abroad in {later}, playing clubs as far as {city}.",
    "Its members have also worked on side projects.",
    "Music writers often cite the band as an influence on later groups.",
    "The band took its name from a line in an old poem.",
    "The group played its first concert in a small hall in {city2}.",
)
COMPANY = (
    "The company grew steadily and is known for its {q} management.",
    "It employs about {staff} people.",
    "The firm went through a restructuring in {later}.",
    "It opened a second office in {city} in {later2}.",
    "The company has remained privately held for most of its history.",
    "An archive of its early records is open to researchers.",
    "Its offices occupy a converted warehouse near the river.",
)
UNIVERSITY = (
    "It is organised into faculties of arts, sciences, law and medicine.",
    "Its library holds {q_a} collection of manuscripts and early maps.",
    "About {pct} percent of its students come from abroad.",
    "The main campus is built around a quadrangle of stone buildings.",
    "It enrols about {students} students.",
    "Its medical school opened in {later}.",
    "It runs an exchange programme with partner institutions in {city}.",
)
POOLS = {Person: PERSON, City: CITY, Country: COUNTRY, Film: FILM, Book: BOOK, Album: ALBUM, Band: BAND,
         Company: COMPANY, University: UNIVERSITY}
# Left as placeholders for `pack`, which knows whether the sentence opens a passage.
SUBJECT = {k: "{" + k + "}" for k in ("S", "s", "P", "p", "o", "pp")}


def anchor_year(e: Entity) -> int:
    for attr in ("year", "founded", "formed", "born", "independence"):
        if getattr(e, attr, 0):
            return getattr(e, attr)
    return 1900


def fillers(e: Entity, r: random.Random, cities: list[City], n: int = 8) -> list[str]:
    """`n` background sentences for `e`, slots filled, subject placeholders kept."""
    start = anchor_year(e)
    later = min(LAST_YEAR, start + r.randint(3, 40))
    others = [c.name for c in r.sample(cities, 3) if c is not e]
    q = r.choice(QUALITIES)
    moved_by = (e.died or LAST_YEAR) - 1 if isinstance(e, Person) else LAST_YEAR
    slots = {
        "q": q, "q_a": f"{'an' if q[0] in 'aeio' else 'a'} {q}", "pastime": r.choice(PASTIMES),
        "trait": (t := r.sample(TRAITS, 2))[0], "trait2": t[1], "season": r.choice(SEASONS),
        "season2": r.choice(SEASONS), "trade": (tr := r.sample(TRADES, 2))[0], "trade2": tr[1],
        "crop": (c := r.sample(CROPS, 2))[0], "crop2": c[1], "number": r.choice(NUMBERS),
        "city": others[0], "city2": others[1], "later": later, "later2": min(LAST_YEAR, later + r.randint(1, 15)),
        "moved": min(start + r.randint(18, 40), moved_by),
        "rail": min(LAST_YEAR, max(start + 5, r.randint(1840, 1910))),
        "provinces": r.randint(6, 30), "peak": r.randint(900, 5200), "pct": r.randint(8, 85),
        "minutes": r.randint(84, 172), "pages": r.randint(180, 720), "tracks": r.randint(8, 14),
        "chart": r.randint(1, 40), "staff": f"{r.randint(2, 90) * 100:,}",
        "students": f"{r.randint(20, 400) * 100:,}",
    }
    pool = list(POOLS[type(e)])
    if isinstance(e, Person):
        pool = r.sample(pool, n - 2) + r.sample(JOBS.get(e.job, JOBS["other"]), 2)
    return [t.format(**slots, **SUBJECT) for t in r.sample(pool, min(n, len(pool)))]
