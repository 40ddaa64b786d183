"""`searchrl ask`'s live view: model output, questions and passages are untrusted terminal text."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

from rich.console import Console

from searchrl.ask import _LiveView
from searchrl.data.types import Passage
from searchrl.tools.base import Observation


def test_live_view_shows_control_characters_as_escapes_and_never_reads_markup():
    console = Console(file=io.StringIO(), width=200, color_system=None)
    view = _LiveView(console, protocol=None)
    view.header("Who?\x1b[2J [bold]", "models/m[1]", "toyworld", sample=False)
    view.text(0, "thinking\x1b]8;;http://evil\x07 on\u202e")
    view.calls("search", [{"query": "lava\x1b[5m"}], [Observation("", passages=[Passage("p\x9b1", "Etna\x1b[31m [/]", "text")])])
    view.calls("calculate", [{"expression": "1\x1b[5m"}], [Observation("bad\x07 [red]", ok=False)])
    view.finish(SimpleNamespace(answer="Sicily\x07", stop_reason="answer", n_searches=1, loss_mask=[1, 1],
                                tool_calls=[{}, {}]), 1.0)
    shown = console.file.getvalue()
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]", shown)  # nothing reaches the terminal raw
    for piece in ("Who?\\x1b[2J [bold]", "models/m[1]", "thinking\\x1b]8;;http://evil\\x07 on\\u202e", "lava\\x1b[5m",
                  "Etna\\x1b[31m [/]", "[p\\x9b1]", "Sicily\\x07", '{"expression": "1\\u001b[5m"}', "bad\\x07 [red]",
                  "1 search · 1 other call · 2 tokens generated"):
        assert piece in shown, piece
