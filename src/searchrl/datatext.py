"""Text from outside is data: it never becomes a control token (docs/security.md).

Everything the environment puts into the model's context that it did not write itself — corpus
passages, web pages and snippets, tool results, error messages that quote the policy, questions —
may hold the text of a control token: `<|im_end|>\\n<|im_start|>system ...`, `<|endoftext|>`,
`<tool_call>`. Tokenized as usual, that text BECOMES the control token: a forged turn or an end
of text in the middle of the context. Here it is tokenized as the characters it is.

How (one mechanism for every path):

1. Where data enters a text, it is wrapped in data marks: `data(text)` (two Unicode
   noncharacters, U+FDD0 / U+FDD1, reserved for exactly this internal use; marks already in the
   data are dropped). The marked text goes through whatever builds the context — a documents
   block, a prompt template, the chat template's rendering of tool results — unchanged.
2. `encode(tokenizer, text)`, which every backend's `encode` and `NativeChat` use, removes the
   marks and tokenizes the text as usual except for every occurrence of a control token's text
   that includes at least one data character (inside the data, or straddling its edge with the
   template's text): those are tokenized as plain text, with no added token matched
   (`plain_ids`). Control tokens that the template or the environment wrote themselves, wholly
   outside data, stay control tokens.

Text without marks is tokenized exactly as before, and data without control-token text is
tokenized exactly as without marks (the marks only decide where control tokens may come from), so
the ids of ordinary passages do not change. "Control token": every special token and every added
token (`added_tokens_decoder`: Qwen's `<tool_call>`, `<think>`), except added tokens that are
whitespace only (Gemma's `"\\n"`, runs of spaces), which are text in any context.

A template that takes data apart (slices it, drops one mark) cannot make data a control token: a
lone opening mark makes the rest of the text data (safe, and the chat-template self-test then
fails, as the rendering no longer matches), a lone closing mark ends data.
"""

from __future__ import annotations

import re
import weakref
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

OPEN, CLOSE = "\ufdd0", "\ufdd1"  # noncharacters: never in interchanged text, free for internal use


def data(text: str) -> str:
    """`text` marked as data; leading and trailing whitespace stay outside the marks, so a
    template's `| trim` still trims it. Marks inside `text` are dropped first (no forged marks)."""
    text = strip_marks(text)
    core = text.strip()
    if not core:
        return text
    start = text.index(core[0])
    return f"{text[:start]}{OPEN}{core}{CLOSE}{text[start + len(core):]}"


def strip_marks(text: str) -> str:
    """`text` without data marks."""
    if OPEN in text or CLOSE in text:
        return text.replace(OPEN, "").replace(CLOSE, "")
    return text


def data_passage(p):
    """A `Passage` whose title and text are marked as data."""
    return replace(p, title=data(p.title), text=data(p.text))


def data_messages(messages: Sequence[dict[str, Any]], roles: Sequence[str] = ("user", "tool")) -> list[dict[str, Any]]:
    """Chat messages whose string content is marked as data for `roles` (user questions, tool
    results); the others (system prompt, the policy's own turns) are left as they are."""
    return [
        {**m, "content": data(m["content"])} if m.get("role") in roles and isinstance(m.get("content"), str) else m
        for m in messages
    ]


def has_marks(text: str) -> bool:
    return OPEN in text or CLOSE in text


# -- the tokenizer's control tokens ------------------------------------------------------------
_CONTROLS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _control_info(tokenizer) -> tuple[tuple[str, ...], frozenset[int]]:
    """(control texts longest first, control ids), cached per tokenizer while its vocabulary
    keeps its size (a test or a user may add tokens)."""
    try:
        size = len(tokenizer)
        cached = _CONTROLS.get(tokenizer)
    except TypeError:  # neither sized, hashable nor weak-referenceable: computed each time
        size, cached = None, None
    if cached is not None and cached[0] == size:
        return cached[1]
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    texts: dict[str, None] = {}
    ids: set[int] = set()
    for i, token in added.items():
        content = getattr(token, "content", str(token))
        if content and (getattr(token, "special", False) or not content.isspace()):
            texts[content] = None
            ids.add(int(i))
    for content in getattr(tokenizer, "all_special_tokens", []) or []:
        if content:
            texts[content] = None
    ids.update(int(i) for i in getattr(tokenizer, "all_special_ids", []) or [] if i is not None)
    info = (tuple(sorted(texts, key=len, reverse=True)), frozenset(ids))
    try:
        _CONTROLS[tokenizer] = (size, info)
    except TypeError:
        pass
    return info


def control_texts(tokenizer) -> tuple[str, ...]:
    """The text of every control token of `tokenizer` (module docstring), longest first."""
    return _control_info(tokenizer)[0]


def control_ids(tokenizer) -> frozenset[int]:
    """The ids of every control token of `tokenizer`: what data may never become."""
    return _control_info(tokenizer)[1]


# -- encoding ----------------------------------------------------------------------------------
Encoder = Callable[[str, bool], list[int]]


def _default_encoder(tokenizer) -> Encoder:
    return lambda text, specials: list(tokenizer(text, add_special_tokens=specials, verbose=False)["input_ids"])


def encode(tokenizer, text: str, *, add_special_tokens: bool = False, encoder: Encoder | None = None) -> list[int]:
    """Token ids of `text`, in which data marks (`data`) say what came from outside: no control
    token is made from text that includes a data character. `encoder(text, add_special_tokens)`
    tokenizes the rest (default: the tokenizer, as usual); a text without marks is just
    `encoder(text, add_special_tokens)`."""
    enc = encoder or _default_encoder(tokenizer)
    if not has_marks(text):
        return enc(text, add_special_tokens)
    clean, data_spans = _unmark(text)
    pieces = _pieces(clean, data_spans, control_texts(tokenizer))
    if len(pieces) == 1 and not pieces[0][2]:  # data without control-token text: as without marks
        return enc(clean, add_special_tokens)
    ids: list[int] = []
    newline = enc("\n", False)
    for k, (a, b, plain) in enumerate(pieces):
        piece = clean[a:b]
        if k == 0:
            if plain:
                ids += (enc("", True) if add_special_tokens else []) + plain_ids(tokenizer, piece)
            else:
                ids += enc(piece, add_special_tokens)
            continue
        ids += _middle(tokenizer, piece, plain, enc, newline)
    return ids


def _middle(tokenizer, piece: str, plain: bool, enc: Encoder, newline: list[int]) -> list[int]:
    """Ids of a piece from the middle of a text. Encoded after a newline, which is then removed,
    so that a SentencePiece tokenizer adds no word-start space to it (what transformers does for
    the same reason); byte-level BPE tokenizers give the same ids either way."""
    if not piece:
        return []
    code = (lambda t: plain_ids(tokenizer, t)) if plain else (lambda t: enc(t, False))
    ids = code("\n" + piece)
    if newline and ids[: len(newline)] == newline:
        return ids[len(newline) :]
    return code(piece)


_MARK = re.compile(f"([{OPEN}{CLOSE}])")


def _unmark(text: str) -> tuple[str, list[tuple[int, int]]]:
    """(text without marks, the (start, end) spans of it that are data, in order)."""
    out: list[str] = []
    spans: list[tuple[int, int]] = []
    at, start = 0, None  # start: where the open data span began
    for part in _MARK.split(text):
        if part == OPEN:
            start = at if start is None else start
        elif part == CLOSE:
            if start is not None and at > start:
                spans.append((start, at))
            start = None
        else:
            out.append(part)
            at += len(part)
    if start is not None and at > start:
        spans.append((start, at))
    return "".join(out), spans


def _pieces(clean: str, data_spans: list[tuple[int, int]], controls: Sequence[str]) -> list[tuple[int, int, bool]]:
    """`clean` cut into (start, end, plain) pieces: every occurrence of a control token's text,
    overlapping ones included, that holds a data character is plain; the rest is not. No piece
    that is not plain then holds such an occurrence, whatever the tokenizer's matching order."""
    ends = [b for _, b in data_spans]

    def holds_data(a: int, b: int) -> bool:
        k = bisect_right(ends, a)  # the first data span ending after a
        return k < len(data_spans) and data_spans[k][0] < b

    spans: list[tuple[int, int]] = []
    for c in controls:
        at = clean.find(c)
        while at != -1:
            if holds_data(at, at + len(c)):
                spans.append((at, at + len(c)))
            at = clean.find(c, at + 1)
    if not spans:
        return [(0, len(clean), False)]
    spans.sort()
    merged: list[list[int]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    out: list[tuple[int, int, bool]] = []
    pos = 0
    for a, b in merged:
        if a > pos:
            out.append((pos, a, False))
        out.append((a, b, True))
        pos = b
    if pos < len(clean):
        out.append((pos, len(clean), False))
    return out


def plain_ids(tokenizer, text: str) -> list[int]:
    """Ids of `text` as plain text: no special or added token is matched, whatever it holds.

    Fast tokenizers: the backend's own pipeline without its added vocabulary (normalizer,
    pre-tokenizer, model), as transformers encodes marked chat content. Others: the
    tokenizer with `split_special_tokens=True`, character by character where an added token
    that is not special still comes out (a character that is one on its own is left out)."""
    if not text:
        return []
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        normalized = backend.normalizer.normalize_str(text) if backend.normalizer is not None else text
        splits = [s for s, _ in backend.pre_tokenizer.pre_tokenize_str(normalized)] if backend.pre_tokenizer is not None else [normalized]
        ids = [t.id for s in splits for t in backend.model.tokenize(s)]
    else:
        ids = list(tokenizer(text, add_special_tokens=False, split_special_tokens=True, verbose=False)["input_ids"])
    bad = control_ids(tokenizer)
    if not bad.intersection(ids):
        return ids
    out: list[int] = []
    for ch in text:
        piece = list(tokenizer(ch, add_special_tokens=False, split_special_tokens=True, verbose=False)["input_ids"])
        if not bad.intersection(piece):
            out += piece
    return out
