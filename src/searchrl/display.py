"""Untrusted text (corpus passages, questions, model output) made safe for a terminal.

A passage may hold terminal escape sequences (`\\x1b[2J` clears the screen, OSC 8 writes links,
some terminals answer queries into the input); printed raw they act on the user's terminal.
`visible` keeps newlines and tabs and shows every other control character as an escape.
Print its result with `markup=False` (rich would read `[...]` in the text as markup).
"""

from __future__ import annotations

import re

# C0 controls except tab and newline, DEL, C1 controls, and the bidi overrides/isolates that can
# make a line read differently from what it is (CVE-2021-42574, "Trojan Source").
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match) -> str:
    ch = match.group(0)
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str, keep_newlines: bool = True) -> str:
    r"""`text` with control characters shown as escapes; newlines kept unless `keep_newlines` is False.

    >>> visible("ok\x1b[2J\tnext\nline")
    'ok\\x1b[2J\tnext\nline'
    >>> visible("a\nb", keep_newlines=False)
    'a\\nb'
    """
    out = _UNSAFE.sub(_escape, text)
    if not keep_newlines:
        out = out.replace("\n", "\\n")
    return out

