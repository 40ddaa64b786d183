"""Invented names built from syllables.

Every word the forge hands out is new (a root or root+suffix never repeats), so no two
entities share a name, and no answer string can hide inside another entity's name: a
question that names one entity never contains, word for word, the name of another.
The syllable inventory leans on clusters that English and the big European languages
rarely use, which keeps accidental real names (and so memorised answers) unlikely.
"""

from __future__ import annotations

import random

ONSETS = ("b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "r", "s",
          "st", "t", "th", "tr", "v", "vr", "z", "zh", "y", "sk", "kh")
INNER_ONSETS = ("b", "d", "g", "k", "l", "m", "n", "r", "s", "t", "v", "z", "th")
NUCLEI = ("a", "e", "i", "o", "u", "a", "e", "o", "ei", "ou", "y", "ae")
CODAS = ("", "", "", "n", "r", "l", "s", "th", "m", "k", "x", "nd", "rn")
VOWELS = set("aeiouy")

# Famous real names the syllable rules can produce; cheap insurance, not a dictionary check.
BLOCKED = frozenset((
    "paris", "rome", "lima", "oslo", "riga", "baku", "doha", "kiev", "milan", "tokyo",
    "delhi", "cairo", "dubai", "berlin", "london", "madrid", "roma", "lisbon", "sofia",
    "vera", "maria", "anna", "elena", "mara", "nora", "dora", "sara", "lara", "tina",
    "nina", "linda", "monica", "diana", "helen", "peter", "thomas", "martin", "david",
    "daniel", "simon", "adam", "lena", "hanna", "banana", "sonata", "sierra", "havana",
    "kenya", "texas", "tulsa", "boston", "dallas", "derby", "bristol",
))

MALE_ENDINGS = ("", "", "o", "an", "us", "ek", "or")
FEMALE_ENDINGS = ("a", "a", "ia", "e", "ine", "ella", "ys")
FAMILY_SUFFIXES = ("", "", "ard", "ell", "ovic", "sen", "ani", "ton", "ski", "ley")
CITY_SUFFIXES = ("", "", "", "ford", "port", "haven", "burg", "mouth", "grad", "dale")
COUNTRY_SUFFIXES = ("ia", "ia", "and", "ora", "istan", "esh")
REGIONS = ("Peninsula", "Basin", "Highlands", "Archipelago", "Steppe", "Coast")


class NameForge:
    """Hands out invented, never-repeated words and multi-word names."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def _syllables(self, lo: int, hi: int) -> str:
        # Clusters only word-initially and single codas keep words pronounceable ("Vrantel").
        n = self.rng.randint(lo, hi)
        out = self.rng.choice(ONSETS) + self.rng.choice(NUCLEI) + self.rng.choice(CODAS)
        for i in range(1, n):
            coda = self.rng.choice(CODAS) if i == n - 1 else ""
            out += self.rng.choice(INNER_ONSETS) + self.rng.choice(NUCLEI) + coda
        return out

    def _claim(self, word: str) -> bool:
        key = word.lower()
        # Triple letters and odd lengths read as typos, not names.
        if key in self.used or key in BLOCKED or not 4 <= len(key) <= 11:
            return False
        # Three consonants or three vowels in a row read as typos, not names.
        if any((a in VOWELS) == (b in VOWELS) == (c in VOWELS) for a, b, c in zip(key, key[1:], key[2:])):
            return False
        self.used.add(key)
        return True

    def word(self, suffixes: tuple[str, ...] = ("",), lo: int = 2, hi: int = 3) -> str:
        """A fresh capitalised word: syllables plus one of `suffixes`."""
        while True:
            candidate = (self._syllables(lo, hi) + self.rng.choice(suffixes)).capitalize()
            if self._claim(candidate):
                return candidate

    def given(self, gender: str) -> str:
        if gender == "f":
            return self.word(FEMALE_ENDINGS, 1, 2)
        while True:  # a male name ending in -a or -e reads as female to most readers
            name = self.word(MALE_ENDINGS, 1, 2)
            if name[-1] not in "ae":
                return name

    def family(self) -> str:
        return self.word(FAMILY_SUFFIXES, 1, 2)

    def city(self) -> str:
        return self.word(CITY_SUFFIXES)

    def country(self) -> tuple[str, str]:
        """(name, adjective), e.g. ("Vraskia", "Vraskian"); both words are claimed."""
        while True:
            name = self.word(COUNTRY_SUFFIXES)
            stem = name.removesuffix("a")
            adjective = stem + ("an" if name.endswith("a") else "i" if name.endswith(("sh", "stan")) else "ese")
            if self._claim(adjective):
                return name, adjective

    def region(self) -> str:
        return f"the {self.word()} {self.rng.choice(REGIONS)}"
