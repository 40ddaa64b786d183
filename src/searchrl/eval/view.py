"""`searchrl view PREDICTIONS.jsonl`: one self-contained HTML page to read trajectories by eye.

Reads the records `searchrl eval run` writes (`Trajectory.to_dict()` plus `answers`, `prediction`,
`method`, optional `scores`, `reward`, `format_ok`, `format_failed`) and training-sample files of
the same shape. Plain-text records (`response` or the authors' `gen_text_store`) are accepted
too; their documents blocks are shown as inserted by the environment.

Model output is untrusted text: every string goes through `html.escape` and the page's only markup
is built here, so a trajectory that writes `<script>` shows it and never runs it.

Tool-call trajectories (`protocol.format: tool-calls`: an environment block that is no documents
block, or a policy turn with a `<tool_call>`) are shown turn by turn: each turn as its call format
reads it (`searchrl.protocols`: reasoning, text, each call's tool and pretty arguments, malformed
calls with their reason and the turn as written), each call marked from the record's
`tool_calls` (invalid, failed, or not run), each result block as the tools' results without the
chat template's role headers and special tokens, and the calls counted per tool. Control
characters in them are shown as `\\xNN`.

A file that a running (or killed) `eval run` is writing ends in a torn line: the page shows the
whole records and a warning says the tail was skipped. A numeric field that is not a number
(`n_searches: "many"`, a NaN score) is shown as written, left out of the means and named in one
warning per field; a NaN or infinite metric is flagged on the page and in a warning.
"""

from __future__ import annotations

import html
import json
import math
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from searchrl.data.textio import iter_json_lines, read_json
from searchrl.data.trajectory import Segment
from searchrl.errors import DataError, DataWarning, listing
from searchrl.eval.view_assets import CSS, JS
from searchrl.eval.view_run import (
    group_advantages,
    page_title,
    prompt_builder,
    resolve_input,
    run_config,
)
from searchrl.metrics import answer_scores
from searchrl.protocols.call_formats import CALL_FORMATS, Turn
from searchrl.protocols.tags import TAG_PRESETS, get_tags, segments_from_text
from searchrl.tools.batch import INVALID

ENV_LABEL = "inserted by the environment (not trained on)"


@dataclass
class ViewItem:
    """One trajectory, normalised for display. `correct` is None when there is nothing to grade."""

    line: int
    question_id: str
    question: str
    segments: list[Segment]
    answers: list[str] = field(default_factory=list)
    prediction: str | None = None
    method: str | None = None
    queries: list[str] = field(default_factory=list)
    retrieved_ids: list[list[str]] = field(default_factory=list)
    n_searches: int | None = 0  # None: the record's value is not a count (see `bad`)
    stop_reason: str | None = None
    scores: dict[str, float] = field(default_factory=dict)
    reward: dict | None = None
    format_ok: bool | None = None
    format_failed: list[str] = field(default_factory=list)
    bad: dict[str, object] = field(default_factory=dict)  # field -> value as written, when not a valid number
    tool_calls: list[dict] = field(default_factory=list)  # {name, arguments, ok, error} per call
    call_format: str | None = None  # tool-call trajectories: the call format; None: tags
    group: int | None = None  # training samples: the question group within the step
    advantage: float | None = None  # training samples: reward minus the group's mean (`view_run`)
    prompt: str | None = None  # the prompt the run gave the model, when it can be rebuilt

    @property
    def correct(self) -> bool | None:
        if "em" not in self.scores:
            return None
        return self.scores["em"] >= 1.0


# ----------------------------------------------------------------------------------------------
# Reading


def _text_segments(text: str) -> list[Segment]:
    # Whichever preset's documents tag the text contains decides how its blocks are found.
    for name in TAG_PRESETS.names():
        tags = get_tags(name)
        if tags.docs_open in text:
            return segments_from_text(text, tags)
    return [Segment(text, "policy")] if text else []


def _segments(rec: dict, where: str) -> list[Segment]:
    raw = rec.get("segments")
    if raw is None:
        for key in ("response", "gen_text_store"):
            if isinstance(rec.get(key), str):
                return _text_segments(rec[key])
        return []
    if not isinstance(raw, list):
        raise DataError(f"{where}: `segments` must be a list of {{text, source}} objects")
    out = []
    for j, s in enumerate(raw):
        if not isinstance(s, dict) or not isinstance(s.get("text"), str):
            raise DataError(f"{where}: segments[{j}] needs a string `text`")
        if s.get("source") not in ("policy", "env"):
            raise DataError(
                f"{where}: segments[{j}].source is {s.get('source')!r}; use 'policy' or 'env'"
            )
        out.append(Segment(s["text"], s["source"]))
    return out


def _tool_calls(value, where: str) -> list[dict]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(c, dict) for c in value):
        raise DataError(f"{where}: `tool_calls` must be a list of {{name, arguments, ok, error}} objects")
    return value


def _call_format(segments: Sequence[Segment]) -> str | None:
    """The call format of a tool-call trajectory (see the module docstring), None for tags:
    Llama's when its results come in `ipython` turns, else Hermes'."""
    env = [s.text for s in segments if s.source == "env"]
    docs = [get_tags(name).docs_open for name in TAG_PRESETS.names()]
    if env:
        native = not any(d in text for text in env for d in docs)
    else:
        native = any(s.source == "policy" and "<tool_call>" in s.text for s in segments)
    if not native:
        return None
    return "llama3-json" if any("<|start_header_id|>ipython" in text for text in env) else "hermes"


def _str_list(value, name: str, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise DataError(f"{where}: `{name}` must be a list of strings, got {type(value).__name__}")
    return [str(v) for v in value]


def _count(value) -> int | None:
    """A search count: a whole number >= 0 (3, 3.0, "3"); None for anything else."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if float(value).is_integer() and value >= 0 else None


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _item(rec: dict, line: int, where: str) -> ViewItem:
    answers = _str_list(rec.get("answers", rec.get("golden_answers")), "answers", where)
    prediction = rec.get("prediction", rec.get("answer"))
    prediction = None if prediction is None else str(prediction)
    queries = _str_list(rec.get("queries"), "queries", where)
    retrieved = rec.get("retrieved_ids") or []
    if not isinstance(retrieved, list) or not all(isinstance(r, list) for r in retrieved):
        raise DataError(f"{where}: `retrieved_ids` must be a list (one per query) of id lists")
    # Gold answers give all four metrics for every record, so page means share one denominator;
    # scores the record carries win (they may come from a judge or another normalisation).
    scores = answer_scores(prediction, answers) if answers else {}
    bad: dict[str, object] = {}
    for k, v in (rec["scores"] if isinstance(rec.get("scores"), dict) else {}).items():
        if _finite(v):
            scores[k] = float(v)
        elif v is not None:  # null: not scored
            bad[f"scores.{k}"] = v
    n_searches = rec.get("n_searches")
    n_searches = len(queries) if n_searches is None else _count(n_searches)
    if n_searches is None:
        bad["n_searches"] = rec["n_searches"]
    failed = rec.get("format_failed") or []
    segments = _segments(rec, where)
    return ViewItem(
        line=line,
        question_id=str(rec.get("question_id", rec.get("id", f"line {line}"))),
        question=str(rec.get("question", "")),
        segments=segments,
        answers=answers,
        prediction=prediction,
        method=None if rec.get("method") is None else str(rec["method"]),
        queries=queries,
        retrieved_ids=[[str(i) for i in r] for r in retrieved],
        n_searches=n_searches,
        stop_reason=None if rec.get("stop_reason") is None else str(rec["stop_reason"]),
        scores=scores,
        reward=rec.get("reward") if isinstance(rec.get("reward"), dict) else None,
        format_ok=rec.get("format_ok") if isinstance(rec.get("format_ok"), bool) else None,
        format_failed=[str(f) for f in failed] if isinstance(failed, list) else [str(failed)],
        bad=bad,
        tool_calls=_tool_calls(rec.get("tool_calls"), where),
        call_format=_call_format(segments),
        group=rec["group"] if isinstance(rec.get("group"), int) and not isinstance(rec["group"], bool) else None,
    )


# A record carries model output when it has one of these; question files and corpora have none.
_OUTPUT_KEYS = ("prediction", "segments", "response", "gen_text_store")


def _warn(message: str) -> None:
    warnings.warn(message, DataWarning, stacklevel=2)


def _records(path: Path):
    """(line number, value) of each whole line; a torn last line is skipped with a warning."""
    return iter_json_lines(path, on_torn_tail=_warn)


def load_items(path: Path) -> list[ViewItem]:
    """Every record of a predictions / trajectories JSONL file; DataError names file:line. Bad
    numeric fields get one warning per field, naming its lines."""
    if not path.exists():
        raise DataError(f"{path} does not exist; pass the predictions.jsonl of `searchrl eval run`")
    items, has_output = [], False
    for line_no, rec in _records(path):
        where = f"{path}:{line_no}"
        if not isinstance(rec, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(rec).__name__}")
        has_output = has_output or any(key in rec for key in _OUTPUT_KEYS)
        items.append(_item(rec, line_no, where))
    if not items:
        raise DataError(f"{path} holds no trajectories (no whole record)")
    _warn_bad_fields(path, items)
    if not has_output:
        raise DataError(
            f"{path} holds no predictions: no record has any of {', '.join(_OUTPUT_KEYS)} "
            "(a question file or corpus?); pass the predictions.jsonl of `searchrl eval run`"
        )
    return items


def _warn_bad_fields(path: Path, items: Sequence[ViewItem]) -> None:
    lines: dict[str, list[int]] = {}
    for it in items:
        for name in it.bad:
            lines.setdefault(name, []).append(it.line)
    for name, where in lines.items():
        example = next(_raw(it.bad[name]) for it in items if name in it.bad)
        _warn(f"{path}: `{name}` is not a valid number on line(s) {listing(where)} (e.g. {example}); "
              "shown as written and left out of the means")


def _raw(value: object) -> str:
    """A value as its JSON text (NaN, Infinity, "many")."""
    return json.dumps(value, ensure_ascii=False)[:80]


def _flatten(d: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "/"))
        else:
            out[name] = value
    return out


def load_metrics(path: Path) -> dict[str, object] | None:
    """metrics.json beside `path`, flattened (`a/b` for nested keys); None when absent."""
    metrics_path = path.parent / "metrics.json"
    if not metrics_path.is_file():
        return None
    data = read_json(metrics_path)
    if not isinstance(data, dict):
        raise DataError(f"{metrics_path}: expected a JSON object of metric name -> number")
    return _flatten(data)


def computed_metrics(items: Sequence[ViewItem]) -> dict[str, object]:
    """Means of the per-record scores (over records that have them), searches and format rate."""
    out: dict[str, object] = {"n": len(items)}
    graded = [it for it in items if it.scores]
    names = sorted({k for it in graded for k in it.scores}, key=lambda k: (k != "em", k != "f1", k))
    for name in names:
        values = [it.scores[name] for it in graded if name in it.scores]
        out[name] = sum(values) / len(values)
    counts = [it.n_searches for it in items if it.n_searches is not None]
    if counts:
        out["n_searches_mean"] = sum(counts) / len(counts)
    fmt = [it.format_ok for it in items if it.format_ok is not None]
    if fmt:
        out["format_ok_rate"] = sum(fmt) / len(fmt)
    return out


# ----------------------------------------------------------------------------------------------
# Rendering


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _tag_roles() -> dict[str, tuple[str, str]]:
    # tag string -> (region, "open"|"close"), for every preset, so either preset's files render.
    roles: dict[str, tuple[str, str]] = {}
    for name in TAG_PRESETS.names():
        t = get_tags(name)
        for region, open_, close in (
            ("query", t.query_open, t.query_close),
            ("docs", t.docs_open, t.docs_close),
            ("think", t.think_open, t.think_close),
            ("answer", t.answer_open, t.answer_close),
        ):
            roles[open_], roles[close] = (region, "open"), (region, "close")
    return roles


_ROLES = _tag_roles()
_TAG_RE = re.compile("|".join(re.escape(t) for t in sorted(_ROLES, key=len, reverse=True)))


def _render_text(text: str, region: str | None) -> tuple[str, str | None]:
    """Escaped text with tags highlighted and tagged regions wrapped; returns the region open at
    the end, so a region can continue into the next policy segment."""
    parts: list[str] = []

    def emit(chunk: str) -> None:
        if chunk:
            cls = f' class="r-{region}"' if region else ""
            parts.append(f"<span{cls}>{_e(chunk)}</span>" if cls else _e(chunk))

    pos = 0
    for m in _TAG_RE.finditer(text):
        emit(text[pos : m.start()])
        kind, edge = _ROLES[m.group(0)]
        parts.append(f'<span class="tag tag-{kind}">{_e(m.group(0))}</span>')
        region = kind if edge == "open" else None
        pos = m.end()
    emit(text[pos:])
    return "".join(parts), region


def _starts_in_think(segments: Sequence[Segment]) -> bool:
    # Prompts often end with <think>: the response then closes a block it never opened.
    policy = "".join(s.text for s in segments if s.source == "policy")
    first = _TAG_RE.search(policy)
    return first is not None and _ROLES[first.group(0)] == ("think", "close")


# Tool-result blocks: a chat template's role headers (ChatML `<|im_start|>tool\n`, Llama 3's
# `<|start_header_id|>ipython<|end_header_id|>\n\n`), the end of a turn, Qwen's result tags.
_RESULT_HEADER = re.compile(r"<\|im_start\|>(\w+)\n|<\|start_header_id\|>(\w+)<\|end_header_id\|>\n\n")
_END_OF_TURN = re.compile(r"<\|(?:im_end|eot_id|eom_id)\|>")
_RESPONSE = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.DOTALL)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def tool_results(text: str) -> list[str] | None:
    """The results a tool-result block holds, without role headers and special tokens; None
    when it has no header of these templates (it is then shown as written)."""
    heads = list(_RESULT_HEADER.finditer(text))
    if not heads:
        return None
    out: list[str] = []
    for head, end in zip(heads, [h.start() for h in heads[1:]] + [len(text)]):
        if (head.group(1) or head.group(2)) == "assistant":
            continue  # the next generation prompt
        body = _END_OF_TURN.split(text[head.end() : end], maxsplit=1)[0]
        out += _RESPONSE.findall(body) or [body]
    return out


def _ev(value: object) -> str:
    """Escaped, with control characters made visible."""
    return _e(_CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}", str(value)))


def _call_status(record: dict | None) -> str:
    if record is None:
        return ' <span class="pill">not run</span>'
    error = record.get("error")
    if error in INVALID:
        return f' <span class="pill fmt-bad">invalid call: {_ev(error)}</span>'
    if error is not None or record.get("ok") is False:
        return f' <span class="pill fmt-bad">failed: {_ev(error or "not ok")}</span>'
    return ""


def _render_turn(turn: Turn, records: Sequence[dict | None]) -> str:
    """One policy turn of a tool-call trajectory: reasoning, text, calls (then malformed ones,
    the order the engine records them in), each with the status of its record."""
    parts = [f'<span class="r-think">{_ev(turn.reasoning)}</span>\n'] if turn.reasoning else []
    if turn.final_text:  # the final message is the answer
        text = _ev(turn.final_text)
        parts.append(f'<span class="r-answer">{text}</span>' if turn.is_final else text)
    attempts = [(c.name, json.dumps(c.arguments, indent=2, ensure_ascii=False)) for c in turn.calls]
    attempts += [(None, reason) for reason in turn.malformed]
    for (name, body), record in zip(attempts, records):
        label = "malformed call" if name is None else name
        parts.append(
            f'<div class="call"><span class="tag tag-query">{_ev(label)}</span>{_call_status(record)}'
            f'\n<span class="r-query">{_ev(body)}</span></div>'
        )
    if turn.malformed:
        parts.append(f'<details><summary>the turn as written</summary>{_ev(turn.text)}</details>')
    return "".join(parts)


def _render_results(text: str, records: Sequence[dict | None], ids: Sequence[list[str] | None]) -> str:
    """One tool-result block: each result under its tool's name (from the calls' records)."""
    results = tool_results(text)
    label = f'<span class="env-label">{_e(ENV_LABEL)}</span>'
    if results is None:
        return f'<div class="env">{label}<div class="env-text">{_ev(text)}</div></div>'
    named = len(results) == len(records)
    parts = []
    for k, result in enumerate(results):
        record = records[k] if named else None
        name = (record.get("name") or "error") if record else "tool"
        found = ""
        if named and ids[k] is not None:
            found = f' <span class="env-ids">· ids: {_ev(", ".join(ids[k]) or "none")}</span>'
        parts.append(f'<div class="result"><span class="env-label">{_ev(name)} result{found}</span>'
                     f'<div class="env-text">{_ev(result)}</div></div>')
    return f'<div class="env">{label}{"".join(parts)}</div>'


def render_tool_response(item: ViewItem) -> str:
    """A tool-call trajectory turn by turn (module docstring). A turn followed by a result block
    was served: its calls take the next entries of `tool_calls`; one without (the rollout
    stopped there) ran none."""
    fmt = CALL_FORMATS.get(item.call_format)()
    records, passages = iter(item.tool_calls), iter(item.retrieved_ids)
    parts, served = [], []
    for i, seg in enumerate(item.segments):
        if seg.source == "env":
            ids = [next(passages, None) if r and r.get("name") == "search" and r.get("ok") else None for r in served]
            parts.append(_render_results(seg.text, served, ids))
            continue
        turn = fmt.parse(seg.text)
        n = len(turn.calls) + len(turn.malformed)
        answered = i + 1 < len(item.segments) and item.segments[i + 1].source == "env"
        served = [next(records, None) for _ in range(n)] if answered else [None] * n
        parts.append(_render_turn(turn, served))
    return f'<div class="response">{"".join(parts)}</div>'


def _calls_summary(calls: Sequence[dict]) -> str:
    """The record's calls counted per tool, and how many were invalid or failed."""
    counts: dict[str, int] = {}
    for c in calls:
        name = str(c.get("name") or "malformed")
        counts[name] = counts.get(name, 0) + 1
    out = " · ".join(f"{name} {n}" for name, n in counts.items())
    invalid = sum(c.get("error") in INVALID for c in calls)
    failed = sum(c.get("ok") is False for c in calls) - invalid
    return out + (f"; {invalid} invalid" if invalid else "") + (f"; {failed} failed" if failed else "")


def render_response(item: ViewItem) -> str:
    """The response in order: policy text with tags and regions marked, env text in its own box."""
    if not item.segments:
        return '<div class="response"><span class="empty">(no response recorded)</span></div>'
    if item.call_format is not None:
        return render_tool_response(item)
    region = "think" if _starts_in_think(item.segments) else None
    env_ids = (
        item.retrieved_ids
        if sum(s.source == "env" for s in item.segments) == len(item.retrieved_ids)
        else None
    )
    parts, n_env = [], 0
    for seg in item.segments:
        if seg.source == "env":
            body, _ = _render_text(seg.text, None)
            ids = ""
            if env_ids is not None:
                ids = f' <span class="env-ids">· ids: {_e(", ".join(env_ids[n_env]) or "none")}</span>'
            n_env += 1
            parts.append(
                f'<div class="env"><span class="env-label">{_e(ENV_LABEL)}{ids}</span>'
                f'<div class="env-text">{body}</div></div>'
            )
        else:
            body, region = _render_text(seg.text, region)
            parts.append(body)
    return f'<div class="response">{"".join(parts)}</div>'


def _fmt(value: object) -> str:
    """A metric value as plain (unescaped) text: floats to 4 significant digits."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return json.dumps(value)[:80]
    return str(value)


def _badge(item: ViewItem) -> str:
    if item.correct is None:
        return '<span class="badge na">no gold</span>'
    if item.correct:
        return '<span class="badge ok">correct</span>'
    f1 = item.scores.get("f1")
    extra = f" (F1 {f1:.2f})" if f1 else ""
    return f'<span class="badge bad">incorrect{_e(extra)}</span>'


def render_card(item: ViewItem, index: int) -> str:
    """One `<article class="card">`; data-correct is 1/0/na and data-searches a count, for the JS."""
    correct = "na" if item.correct is None else str(int(item.correct))
    pills = [f'<span class="pill">{_e(item.method)}</span>'] if item.method else []
    if item.n_searches is None:
        pills.append(f'<span class="pill fmt-bad">searches: {_e(_raw(item.bad["n_searches"]))} (not a count)</span>')
    else:
        pills.append(
            f'<span class="pill">{item.n_searches} search{"es" if item.n_searches != 1 else ""}</span>'
        )
    if item.stop_reason:
        pills.append(f'<span class="pill">stop: {_e(item.stop_reason)}</span>')
    if item.format_ok is not None:
        fmt = "format ok" if item.format_ok else "format failed: " + ", ".join(item.format_failed)
        pills.append(f'<span class="pill{"" if item.format_ok else " fmt-bad"}">{_e(fmt)}</span>')
    facts = [("gold", " | ".join(item.answers) if item.answers else "—")]
    prediction = "(none)" if item.prediction is None else item.prediction
    facts.append(("prediction", prediction))
    if item.scores:
        facts.append(("scores", " · ".join(f"{k} {_fmt(v)}" for k, v in item.scores.items())))
    if item.reward:
        facts.append(
            ("reward", " · ".join(f"{k} {_fmt(v)}" for k, v in _flatten(item.reward).items()))
        )
    if item.advantage is not None:
        facts.append(("advantage", f"{item.advantage:+.3g} (reward minus the mean of group {item.group})"))
    if item.call_format is not None:
        facts.append(("tool calls", _calls_summary(item.tool_calls) if item.tool_calls else "none"))
    if item.bad:
        facts.append(("not numbers", " · ".join(f"{k} {_raw(v)}" for k, v in item.bad.items())))
    dl = "".join(
        f"<dt>{name}</dt><dd{' class=prediction' if name == 'prediction' else ''}>{_e(value)}</dd>"
        for name, value in facts
    )
    prompt = (f'<details class="prompt"><summary>the prompt</summary><pre>{_e(item.prompt)}</pre></details>'
              if item.prompt else "")
    searches = ""
    if item.queries:
        rows = []
        esc = _e if item.call_format is None else _ev  # tool calls: control characters shown
        for i, q in enumerate(item.queries):
            ids = item.retrieved_ids[i] if i < len(item.retrieved_ids) else []
            codes = (
                "".join(f"<code>{_e(x)}</code>" for x in ids) or '<span class="empty">no ids</span>'
            )
            rows.append(f'<li><span class="query">{esc(q)}</span> → {codes}</li>')
        searches = f'<ol class="searches">{"".join(rows)}</ol>'
    return (
        f'<article class="card" id="t{index}" data-correct="{correct}" '
        f'data-searches="{"na" if item.n_searches is None else item.n_searches}">'
        f'<div class="card-head"><span class="idx">#{index}</span>'
        f'<span class="qid">{_e(item.question_id)}</span>{_badge(item)}{"".join(pills)}</div>'
        f'<h2 class="question">{_e(item.question)}</h2><dl class="facts">{dl}</dl>{prompt}'
        f"{render_response(item)}{searches}</article>"
    )


def _nonfinite(metrics: dict[str, object]) -> list[str]:
    return [k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)]


def _metrics_table(metrics: dict[str, object], caption: str) -> str:
    """Every metric, one row each, folded under a line that counts them; a NaN or infinite value
    is flagged, so it cannot pass for a score."""
    flagged = set(_nonfinite(metrics))
    rows = "".join(
        f'<tr><th>{_e(k)}</th><td class="nonfinite">{_e(_fmt(v))} (not finite)</td></tr>' if k in flagged
        else f"<tr><th>{_e(k)}</th><td>{_e(_fmt(v))}</td></tr>"
        for k, v in metrics.items()
    )
    return (
        f'<details class="all-metrics"><summary>all {len(metrics)} metrics: {_e(caption)}</summary>'
        f'<table class="metrics">{rows}</table></details>'
    )


# The headline metrics of the summary line: (key, label, digits); None digits = a fraction in %.
# metrics.json names first, then the names `computed_metrics` gives the same figures.
_SUMMARY = (
    ("n", "questions", 0), ("em", "EM", None), ("f1", "F1", None), ("cover_em", "cover-EM", None),
    ("cem", "cover-EM", None), ("acc_l", "ACC_L", None), ("format_ok_rate", "format ok", None),
    ("search_rate", "searched", None), ("mean_searches", "searches/q", 2), ("n_searches_mean", "searches/q", 2),
    ("retrieval_recall", "supporting found", None), ("query_echo_rate", "echo", None),
)


def summary_line(metrics: dict[str, object]) -> str:
    """The headline metrics in one short line, fractions in percent (as the CLI shows them)."""
    parts, labels = [], set()
    for key, label, digits in _SUMMARY:
        value = metrics.get(key)
        if label in labels or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        labels.add(label)
        if not math.isfinite(value):
            text = f"{_fmt(value)} (not finite)"
        elif digits is None:
            text = f"{100 * value:.1f} %"
        else:
            text = f"{value:.{digits}f}"
        parts.append(f"<span><b>{_e(label)}</b> {_e(text)}</span>")
    return f'<p class="summary">{" · ".join(parts)}</p>' if parts else ""


def render_page(
    items: Sequence[ViewItem],
    title: str,
    metrics: dict[str, object] | None = None,
    metrics_caption: str = "",
    total: int | None = None,
    protocol: str | None = None,
) -> str:
    """The whole page. `total` is the record count when `items` is a prefix (--limit);
    `protocol` a line saying what the run's model spoke (`run_protocol`)."""
    total = len(items) if total is None else total
    count = f"{total} trajectories" + (
        f", showing the first {len(items)}" if total > len(items) else ""
    ) + (f" · {protocol}" if protocol else "")
    table = summary_line(metrics) + _metrics_table(metrics, metrics_caption) if metrics else ""
    cards = "\n".join(render_card(it, i) for i, it in enumerate(items, start=1))
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)} · searchrl</title><style>{CSS}</style></head>\n"
        f'<body data-js="off"><header><h1>{_e(title)}</h1><p class="sub">{_e(count)}</p>{table}'
        '<div class="controls"><input id="filter" type="search" placeholder="filter: any text"'
        ' aria-label="filter">'
        '<label><input id="only-incorrect" type="checkbox"> only incorrect</label>'
        '<label><input id="only-searches" type="checkbox"> only with searches</label>'
        f'<span id="shown">{len(items)} of {len(items)} shown</span></div></header>\n'
        f'<main id="cards">\n{cards}\n</main>\n<script>{JS}</script></body></html>\n'
    )


def run_protocol(predictions: Path) -> str | None:
    """What the run that wrote `predictions` spoke, from its config.yaml (`view_run.run_config`):
    model (an export's origin too), profile and protocol, in one line. None when there is no
    readable one (a file from elsewhere)."""
    from searchrl.checkpoint_meta import export_origin

    data = run_config(predictions)
    protocol = data.get("protocol") if data else None
    if not isinstance(protocol, dict):
        return None
    fmt = protocol.get("format", "tags")
    spoken = f"tags {protocol.get('tags')}" if fmt == "tags" else f"tool calls ({', '.join(data.get('tools') or ['search'])})"
    notes = [f"export of {origin}" for origin in [export_origin(str(data.get("model")))] if origin]
    notes += [f"profile {data['profile']}"] if data.get("profile") else []
    about = f" ({'; '.join(notes)})" if notes else ""
    return f"{data.get('model')}{about}: {spoken}, template {protocol.get('template')}"


def write_view(predictions: Path, out: Path | None = None, limit: int | None = None) -> Path:
    """Render `predictions` (JSONL, or a run folder: `view_run.resolve_input`) to `out` (default:
    same name, .html) and return the path. The page is titled by its run and model; a training
    sample shows its advantage within its group; each card folds the prompt when it can be rebuilt.

    Metrics come from metrics.json beside the file when present, else from the records' scores
    (all records, even past `limit`).
    """
    predictions = resolve_input(predictions)
    out = out or predictions.with_suffix(".html")
    if out.is_dir():
        raise DataError(f"--out {out} is a directory; give a file name, e.g. {out / predictions.with_suffix('.html').name}")
    items = load_items(predictions)
    metrics = load_metrics(predictions)
    if metrics is not None:
        caption = f"metrics.json ({predictions.parent / 'metrics.json'})"
    else:
        metrics = computed_metrics(items)
        caption = f"computed from the {len(items)} records' scores"
    if _nonfinite(metrics):
        _warn(f"{caption}: {listing(_nonfinite(metrics))} is NaN or infinite (flagged on the page); "
              "a record or the run that wrote it went wrong")
    shown = items[:limit] if limit is not None else items
    rewards = [it.reward.get("total") if it.reward and _finite(it.reward.get("total")) else None for it in items]
    for item, advantage in zip(items, group_advantages([it.group for it in items], rewards)):
        item.advantage = advantage
    prompt = prompt_builder(predictions)
    for item in shown if prompt else ():
        item.prompt = prompt(item.question)
    page = render_page(shown, page_title(predictions, metrics), metrics, caption, total=len(items),
                       protocol=run_protocol(predictions))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out


def view_command(file: Path, out: Path | None, limit: int | None) -> None:
    path = write_view(file, out, limit)
    print(f"wrote {path}  (open it in a browser: file://{path.resolve()})")
