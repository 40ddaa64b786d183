"""Invented names for the held-out world, from a name space disjoint from the main world's.

Every main-world word opens with one of `names.ONSETS` (b, d, f, g, h, k, l, m, n, p, r, s, t,
v, y, z); every word here opens with c, j, q, w or a vowel, so no invented word, and so no
entity name, can be shared by the two worlds whatever their seeds.
"""

from __future__ import annotations

from searchrl.data.toyworld.names import CODAS, INNER_ONSETS, NameForge

FIRST_ONSETS = ("c", "ch", "cl", "cr", "j", "w", "wh", "qu", "", "", "")
# No "y": a vowel-initial word must not open with a letter the main world opens with.
NUCLEI = ("a", "e", "i", "o", "u", "a", "o", "ai", "au", "ea")
MALE_ENDINGS = ("", "", "in", "as", "ric", "ald")
FEMALE_ENDINGS = ("a", "eth", "wen", "ice", "ara", "ina")
FAMILY_SUFFIXES = ("", "", "wright", "combe", "ling", "hurst", "away", "more")
PORT_SUFFIXES = ("", "", "wick", "holm", "ness", "sund", "hithe", "strand")
DOMINION_FORMS = ("{} Isles", "{} Reach", "{} Marches", "{} Shore")


class AltForge(NameForge):
    """`NameForge` with the held-out world's first syllables and suffixes."""

    def _syllables(self, lo: int, hi: int) -> str:
        n = self.rng.randint(lo, hi)
        out = self.rng.choice(FIRST_ONSETS) + self.rng.choice(NUCLEI) + self.rng.choice(CODAS)
        for i in range(1, n):
            coda = self.rng.choice(CODAS) if i == n - 1 else ""
            out += self.rng.choice(INNER_ONSETS) + self.rng.choice(NUCLEI) + coda
        return out

    def given(self, gender: str) -> str:
        return self.word(FEMALE_ENDINGS if gender == "f" else MALE_ENDINGS, 1, 2)

    def family(self) -> str:
        return self.word(FAMILY_SUFFIXES, 1, 2)

    def port(self) -> str:
        return self.word(PORT_SUFFIXES)

    def dominion(self) -> str:
        return self.rng.choice(DOMINION_FORMS).format(self.word())
