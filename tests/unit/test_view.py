"""The trajectory viewer: parsing, escaping, and the page as real headless Chromium renders it."""

from __future__ import annotations

import html
import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.data.trajectory import Segment, Trajectory
from searchrl.errors import DataError, DataWarning, SearchRLError
from searchrl.eval.view import ENV_LABEL, load_items, tool_results, write_view
from searchrl.protocols.prompts import build_prompt
from searchrl.protocols.tags import get_tags

DOCS = (
    "\n\n<|begin_of_documents|>\n(1)Title: Quellbridge Text: A town on the Tessaly & <Vell>.\n"
    "<|end_of_documents|>\n\n"
)
# Both an inline script and an event-handler attack: either would set data-pwned if injected.
EVIL = "<script>alert(1)</script><img src=x onerror=\"document.body.dataset.pwned='1'\">"


def _records() -> list[dict]:
    t1 = Trajectory(
        "q1",
        "Where is Quellbridge?",
        [1, 2],
        [3, 4, 5],
        [1, 0, 1],
        [-0.1, 0.0, -0.2],
        [
            Segment("Let me search. <|begin_of_query|>Quellbridge town<|end_of_query|>", "policy"),
            Segment(DOCS, "env"),
            Segment("It is on the Tessaly.</think>\n<answer>Tessaly</answer>", "policy"),
        ],
        queries=["Quellbridge town"],
        retrieved_ids=[["p7", "p9"]],
        n_searches=1,
        answer="Tessaly",
        stop_reason="answer",
    ).to_dict()
    t1.update(
        answers=["Tessaly"],
        prediction="Tessaly",
        method="agent",
        scores={"em": 1.0, "f1": 1.0},
        format_ok=True,
        format_failed=[],
    )
    # No token keys, no scores: the viewer must compute them from gold and prediction.
    t2 = {
        "question_id": "q2",
        "question": "Who <b>wrote</b> it?",
        "segments": [{"text": f"<think>{EVIL}</think><answer>Bob</answer>", "source": "policy"}],
        "answers": ["Alice"],
        "prediction": "Bob",
        "method": "direct",
        "stop_reason": "answer",
        "format_ok": False,
        "format_failed": ["think_closed"],
    }
    t3 = {
        "question_id": "q3",
        "question": "Which river?",
        "segments": [
            {"text": "<search>river</search>", "source": "policy"},
            {"text": "\n\n<information>\n(1)Title: X Text: y\n</information>\n\n", "source": "env"},
            {"text": "<answer>Ost river</answer>", "source": "policy"},
        ],
        "queries": ["river"],
        "retrieved_ids": [["p1"]],
        "n_searches": 1,
        "answers": ["Vell river"],
        "prediction": "Ost river",
        "method": "rag",
    }
    return [t1, t2, t3]


def _write(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture()
def page(tmp_path) -> Path:
    return write_view(_write(tmp_path / "predictions.jsonl", _records()))


def test_page_escapes_model_output_and_is_self_contained(page):
    text = page.read_text(encoding="utf-8")
    assert page.name == "predictions.html"
    assert "<script>alert(1)" not in text and "<img src=x" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "Who &lt;b&gt;wrote&lt;/b&gt; it?" in text
    assert text.count("<script>") == 1  # the page's own
    assert text.count('<article class="card"') == 3
    # Offline page: no fetched resources of any kind.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
    # Computed metrics: EM over the three records is 1/3; F1 of "Ost river" vs "Vell river" is .5.
    assert "all 7 metrics: computed from the 3 records" in text
    assert "<tr><th>em</th><td>0.3333</td></tr><tr><th>f1</th><td>0.5</td></tr>" in text
    assert '<p class="summary"><span><b>questions</b> 3</span> · <span><b>EM</b> 33.3 %</span> · <span><b>F1</b> 50.0 %</span>' in text
    assert "<title>predictions.jsonl · searchrl</title>" in text  # no run around it: the file names it


def test_load_items_normalises_and_grades(tmp_path):
    items = load_items(_write(tmp_path / "p.jsonl", _records()))
    assert [it.correct for it in items] == [True, False, False]
    assert items[0].scores["em"] == 1.0 and items[0].scores["cem"] == 1.0  # filled from gold
    assert items[2].scores["f1"] == pytest.approx(0.5)
    assert [s.source for s in items[0].segments] == ["policy", "env", "policy"]
    # Plain-text records: documents blocks of either tag preset become env segments.
    _write(
        tmp_path / "t.jsonl",
        [
            {
                "question": "q",
                "response": "<search>a</search>"
                + DOCS.replace("<|begin_of_documents|>", "<information>").replace(
                    "<|end_of_documents|>", "</information>"
                )
                + "<answer>b</answer>",
            }
        ],
    )
    (item,) = load_items(tmp_path / "t.jsonl")
    assert [s.source for s in item.segments] == ["policy", "env", "policy"]
    assert item.correct is None and item.prediction is None


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"segments": [{"text": "x", "source": "user"}]}', "segments[0].source"),
        ('{"segments": "x"}', "must be a list"),
        ('{"retrieved_ids": ["p1"]}', "retrieved_ids"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(_records()[1]) + "\n\n" + line + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"bad\.jsonl:3: .*{re.escape(message)}"):
        load_items(path)


def test_metrics_json_limit_and_cli(tmp_path):
    preds = _write(tmp_path / "predictions.jsonl", _records())
    (tmp_path / "metrics.json").write_text(json.dumps({"em": 0.125, "hotpotqa": {"f1": 0.5}}))
    out = tmp_path / "sub" / "v.html"
    result = CliRunner().invoke(app, ["view", str(preds), "--out", str(out), "--limit", "2"])
    assert result.exit_code == 0, result.output
    text = out.read_text(encoding="utf-8")
    assert "<tr><th>em</th><td>0.125</td></tr><tr><th>hotpotqa/f1</th><td>0.5</td></tr>" in text
    assert "<b>EM</b> 12.5 %" in text
    assert "3 trajectories, showing the first 2" in text
    assert text.count('<article class="card"') == 2
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DataError, match="no trajectories"):
        write_view(empty)


def test_out_directory_and_non_utf8_input_are_clear_errors(tmp_path):
    preds = _write(tmp_path / "predictions.jsonl", _records())
    (tmp_path / "site").mkdir()
    result = CliRunner().invoke(app, ["view", str(preds), "--out", str(tmp_path / "site")])
    assert isinstance(result.exception, DataError)
    assert "site is a directory; give a file name, e.g." in str(result.exception)
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(preds.read_bytes() + b'{"question": "caf\xe9", "response": "x"}\n')
    with pytest.raises(DataError, match=r"latin1\.jsonl:4: not UTF-8 text"):
        write_view(latin1)


@pytest.mark.parametrize(
    "rows",
    [
        [{"id": "q1", "question": "Who?", "answers": ["Ann"]}],  # a question file
        [{"idx": 1, "question": "Who?", "answer": "Ann"}],  # R1-Searcher questions: `answer` is gold
        [{"id": "p1", "title": "T", "text": "A passage."}],  # a corpus
    ],
)
def test_files_without_predictions_are_refused(tmp_path, rows):
    path = _write(tmp_path / "questions.jsonl", rows * 3)
    with pytest.raises(DataError, match=r"questions\.jsonl holds no predictions: no record has any of prediction"):
        write_view(path)
    assert not (tmp_path / "questions.html").exists()


# ----------------------------------------------------------------------------------------------
# Real browser


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip(
        "headless Chromium not installed: `apt-get install -y chromium` (Debian package `chromium`)"
    )


def _run_chromium(tmp_path: Path, *args: str) -> str:
    cmd = [
        _chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        *args,
    ]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _cards(dom: str) -> dict[str, bool]:
    """card id -> hidden, from Chromium's serialised DOM."""
    return {
        m.group(1): "hidden" in m.group(0)
        for m in re.finditer(r'<article class="card" id="(t\d+)"[^>]*>', dom)
    }


def test_chromium_renders_escapes_and_filters(page, tmp_path):
    url = page.resolve().as_uri()
    dom = _run_chromium(tmp_path, "--dump-dom", url + "?q=tessaly")
    assert 'data-js="ready"' in dom  # the page's own script ran
    assert "data-pwned" not in dom  # the injected ones did not
    assert dom.count("<script") == 1 and "<img" not in dom
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom
    # Text filter from ?q= applied on load: only the Tessaly card is left visible.
    assert _cards(dom) == {"t1": False, "t2": True, "t3": True}
    assert re.search(r'id="shown">1 of 3 shown<', dom)
    # Env boxes hold exactly the inserted blocks, labelled as not trained on.
    env_texts = [
        html.unescape(re.sub(r"<[^>]+>", "", m))
        for m in re.findall(r'<div class="env-text">(.*?)</div>', dom, re.DOTALL)
    ]
    assert env_texts == [DOCS, "\n\n<information>\n(1)Title: X Text: y\n</information>\n\n"]
    assert dom.count(ENV_LABEL) == 2
    assert re.search(r'<span class="r-query">Quellbridge town</span>', dom)

    dom = _run_chromium(tmp_path, "--dump-dom", url + "#incorrect=1&searches=1")
    assert _cards(dom) == {"t1": True, "t2": True, "t3": False}

    shot = tmp_path / "shot.png"
    _run_chromium(tmp_path, "--window-size=1000,800", f"--screenshot={shot}", url)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


# ----------------------------------------------------------------------------------------------
# Files being written, odd numbers


def test_a_torn_last_line_is_skipped_with_a_warning(tmp_path):
    """What a running or killed `eval run` leaves: two whole records and half of the third."""
    path = tmp_path / "predictions.jsonl"
    whole = "".join(json.dumps(r) + "\n" for r in _records())
    path.write_text(whole[: len(whole) - 30], encoding="utf-8")
    with pytest.warns(DataWarning) as caught:
        page = write_view(path)
    assert [str(w.message) for w in caught] == [
        f"{path}:3: the last line is cut off (no line ending, not valid JSON); skipped it"
    ]
    assert page.read_text(encoding="utf-8").count('<article class="card"') == 2
    path.write_text(whole[:30], encoding="utf-8")  # not one whole record
    with pytest.warns(DataWarning), pytest.raises(DataError, match="holds no trajectories"):
        write_view(path)


def test_bad_numbers_are_shown_as_written_left_out_of_means_and_warned_once_per_field(tmp_path):
    t1, t2, t3 = _records()
    t2["n_searches"] = "many"
    t3.update(n_searches=1e999, scores={"em": float("nan"), "f1": 0.5, "acc_l": None})
    extra = {**t3, "question_id": "q4", "n_searches": "2", "scores": {"em": 0.0}}
    path = tmp_path / "predictions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (t1, t2, t3, extra)), encoding="utf-8")
    with pytest.warns(DataWarning) as caught:
        page = write_view(path)
    assert [str(w.message) for w in caught] == [
        f"{path}: `n_searches` is not a valid number on line(s) 2, 3 (e.g. \"many\"); shown as written and left out of the means",
        f"{path}: `scores.em` is not a valid number on line(s) 3 (e.g. NaN); shown as written and left out of the means",
    ]
    with pytest.warns(DataWarning):
        items = load_items(path)
    assert [it.n_searches for it in items] == [1, None, None, 2]  # "2" is a count
    assert items[2].bad == {"n_searches": float("inf"), "scores.em": items[2].bad["scores.em"]}
    assert math.isnan(items[2].bad["scores.em"]) and "acc_l" not in items[2].scores
    text = page.read_text(encoding="utf-8")
    assert "searches: &quot;many&quot; (not a count)" in text and "searches: Infinity (not a count)" in text
    assert "scores.em NaN · n_searches Infinity" in text
    assert 'data-searches="na"' in text
    # EM is computed from gold for line 3 (its NaN left out): 1, 0, 0, 0 -> 0.25; searches (1 + 2) / 2.
    table = re.search(r'<table class="metrics">.*?</table>', text).group(0)
    assert "<tr><th>n</th><td>4</td></tr><tr><th>em</th><td>0.25</td></tr>" in table
    assert "<tr><th>n_searches_mean</th><td>1.5</td></tr>" in table and "nonfinite" not in table


def test_nan_or_infinite_metrics_are_flagged(tmp_path):
    preds = _write(tmp_path / "predictions.jsonl", _records())
    (tmp_path / "metrics.json").write_text('{"em": NaN, "f1": Infinity, "n": 3}')
    with pytest.warns(DataWarning, match=r"metrics\.json.*: 'em', 'f1' is NaN or infinite \(flagged on the page\)"):
        page = write_view(preds)
    text = page.read_text(encoding="utf-8")
    assert ('<tr><th>em</th><td class="nonfinite">nan (not finite)</td></tr><tr><th>f1</th><td class="nonfinite">'
            'inf (not finite)</td></tr><tr><th>n</th><td>3</td></tr>') in text
    assert "<b>EM</b> nan (not finite)" in text


# ----------------------------------------------------------------------------------------------
# Tool-call trajectories


def _native_records() -> list[dict]:
    """Real tool-call rollouts (the scripted policy of test_native_rollout: two searches and a
    calculation; each kind of invalid call), and a hostile one written by hand."""
    from test_native_rollout import agent

    from searchrl.assets import load_tokenizer
    from searchrl.data.types import Question

    engine, _ = agent(load_tokenizer("tiny-random"))
    trajs = engine.run([Question(q, f"[{q}] Which river?", ("Orrin Bay",)) for q in ("q-two", "q-bad")], n=1)
    records = [dict(t.to_dict(tokens=False), answers=["Orrin Bay"], prediction=t.answer) for t in trajs]
    args = {"query": 'x</b><script>alert(1)</script> "quoted" \x1b[31m'}
    records.append({
        "question_id": "q-evil",
        "question": "Evil?",
        "segments": [
            {"text": "Looking.\n<tool_call>\n" + json.dumps({"name": "search", "arguments": args}) + "\n</tool_call>",
             "source": "policy"},
            {"text": f"\n<|im_start|>tool\n{EVIL} \"q\" \x00\x07<|im_end|>\n<|im_start|>assistant\n", "source": "env"},
            {"text": "<answer>x</answer>", "source": "policy"},
        ],
        "tool_calls": [{"name": "search", "arguments": args, "ok": True, "error": None}],
        "queries": [args["query"]],
        "retrieved_ids": [["p<1>"]],
        "answers": ["x"],
        "prediction": "x",
    })
    return records


def _card(text: str, n: int) -> str:
    return re.search(rf'<article class="card" id="t{n}".*?</article>', text, re.DOTALL).group(0)


def test_tool_call_trajectories_show_calls_results_and_invalid_calls(tmp_path):
    items = load_items(_write(tmp_path / "native.jsonl", _native_records()))
    assert [it.call_format for it in items] == ["hermes", "hermes", "hermes"]
    text = write_view(tmp_path / "native.jsonl").read_text(encoding="utf-8")
    two, bad = _card(text, 1), _card(text, 2)
    for card in (two, re.sub("<details>.*?</details>", "", bad, flags=re.DOTALL)):
        # the template's role headers and special tokens are not shown, nor the call tags
        assert "im_start" not in card and "im_end" not in card and "tool_call&gt;" not in card
    # q-two: each call as its tool and pretty arguments, each result under its tool's name
    assert two.count('<span class="tag tag-query">search</span>') == 2
    assert '<span class="r-query">{\n  &quot;query&quot;: &quot;Quellbridge river&quot;\n}</span>' in two
    assert '<span class="tag tag-query">calculate</span>' in two and "fmt-bad" not in two
    results = re.findall(r'<span class="env-label">(\w+) result', two)
    assert results == ["search", "search", "calculate"] and "<dd>search 2 · calculate 1</dd>" in two
    assert '<span class="r-answer">Orrin Bay</span></div>' in two
    assert '<div class="env-text">160</div>' in two and two.count(f'<span class="env-label">{ENV_LABEL}') == 2
    assert '<div class="env-text">(1)Title: Quellbridge' in two
    # q-bad: each invalid call marked from tool_calls[i].error, malformed ones with the turn as written
    assert re.findall(r"invalid call: (\w+)", bad) == ["malformed", "unknown_tool", "bad_arguments"]
    assert "<dd>malformed 1 · weather 1 · search 1; 3 invalid</dd>" in bad
    assert "tool call 1: bad JSON" in bad and "<summary>the turn as written</summary>" in bad
    assert re.findall(r'<span class="env-label">(\w+) result', bad) == ["error", "weather", "search"]


def test_a_hostile_tool_call_is_escaped_and_its_control_characters_shown(tmp_path):
    text = write_view(_write(tmp_path / "evil.jsonl", _native_records())).read_text(encoding="utf-8")
    evil = _card(text, 3)
    assert "<script>alert" not in text and "<img src=x" not in text and text.count("<script>") == 1
    assert "</b>" not in evil and "\x1b" not in text and "\x00" not in text and "\x07" not in text
    # the arguments as pretty JSON (json escapes the control character), the result escaped
    assert "&lt;/b&gt;&lt;script&gt;alert(1)&lt;/script&gt; \\&quot;quoted\\&quot; \\u001b[31m" in evil
    assert f'<div class="env-text">{html.escape(EVIL)} &quot;q&quot; \\x00\\x07</div>' in evil
    assert "search result <span class=\"env-ids\">· ids: p&lt;1&gt;</span>" in evil
    assert "im_start" not in evil and '<span class="r-answer">&lt;answer&gt;x&lt;/answer&gt;</span>' in evil
    dom = _run_chromium(tmp_path, "--dump-dom", (tmp_path / "evil.html").resolve().as_uri())
    assert 'data-js="ready"' in dom and "data-pwned" not in dom and dom.count("<script") == 1


@pytest.mark.parametrize(
    "block",
    [  # two results, as the templates of tests/unit/data/chat_templates and hermes-fallback render them
        "\n<|im_start|>tool\nA <b>\n2<|im_end|>\n<|im_start|>tool\nB<|im_end|>\n<|im_start|>assistant\n",
        (
            "\n<|im_start|>user\n<tool_response>\nA <b>\n2\n</tool_response>\n<tool_response>\nB\n</tool_response>"
            "<|im_end|>\n<|im_start|>assistant\n"
        ),
        (
            "<|start_header_id|>ipython<|end_header_id|>\n\nA <b>\n2<|eot_id|><|start_header_id|>ipython"
            "<|end_header_id|>\n\nB<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        ),
    ],
)
def test_tool_results_are_read_without_the_templates_headers(block):
    assert tool_results(block) == ["A <b>\n2", "B"]
    assert tool_results("(1)Title: T Text: no headers") is None  # shown as written


def test_llama_style_calls_are_read_by_their_call_format(tmp_path):
    env = "<|start_header_id|>ipython<|end_header_id|>\n\nR<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    record = {
        "question": "q",
        "segments": [
            {"text": '{"name": "search", "parameters": {"query": "a"}}', "source": "policy"},
            {"text": env, "source": "env"},
            {"text": "b", "source": "policy"},
        ],
        "tool_calls": [{"name": "search", "arguments": {"query": "a"}, "ok": True, "error": None}],
    }
    (item,) = load_items(_write(tmp_path / "llama.jsonl", [record]))
    assert item.call_format == "llama3-json"
    text = write_view(tmp_path / "llama.jsonl").read_text(encoding="utf-8")
    assert '<span class="tag tag-query">search</span>' in text and "search result</span>" in text
    assert '<div class="env-text">R</div>' in text and "header_id" not in text


# ----------------------------------------------------------------------------------------------
# The run behind the file: folder, title, prompt, advantages


def test_an_eval_run_folder_is_titled_by_run_and_model_and_folds_the_prompt(tmp_path):
    run = tmp_path / "eval-trained-agent"
    _write(run / "predictions.jsonl", _records())
    (run / "metrics.json").write_text(json.dumps({"n": 3, "em": 0.2, "model": "/x/runs/demo/train/checkpoints/step_0013"}))
    (run / "config.yaml").write_text("model: /x/runs/demo/train/checkpoints/step_0013\n"
                                     "protocol: {format: tags, tags: search-r1, template: oneshot}\n")
    page = write_view(run)  # the folder stands for its predictions.jsonl
    assert page == run / "predictions.html"
    text = page.read_text(encoding="utf-8")
    assert "<title>eval-trained-agent · train/step_0013 · searchrl</title>" in text
    prompt = build_prompt(_records()[0]["question"], get_tags("search-r1"), "oneshot")
    assert f'<details class="prompt"><summary>the prompt</summary><pre>{html.escape(prompt)}</pre></details>' in text
    assert text.count('<details class="prompt">') == 3


def test_a_training_run_folder_shows_its_newest_samples_with_group_advantages(tmp_path):
    run = tmp_path / "train"
    (run / "config.yaml").parent.mkdir(parents=True)
    (run / "config.yaml").write_text("model: tiny-random\nprotocol: {format: tool-calls, template: tools-oneshot}\n")
    old, new = _records()[:2], _records()
    _write(run / "samples" / "step_0001.jsonl", old)
    for rec, group, total in zip(new, (0, 0, 1), (1.0, 0.0, 0.5)):
        rec.update(group=group, reward={"total": total, "format": 1.0})
    _write(run / "samples" / "step_0002.jsonl", new)
    text = write_view(run).read_text(encoding="utf-8")
    assert "<title>train · step_0002 samples · searchrl</title>" in text
    advantages = re.findall(r"<dt>advantage</dt><dd>([^<]*)</dd>", text)
    assert advantages == ["+0.5 (reward minus the mean of group 0)", "-0.5 (reward minus the mean of group 0)",
                          "+0 (reward minus the mean of group 1)"]
    assert '<details class="prompt">' not in text  # a tool-call prompt needs the tokenizer: not rebuilt


def test_a_folder_with_no_trajectories_is_one_clear_error(tmp_path):
    with pytest.raises(SearchRLError, match="no predictions.jsonl and no samples"):
        write_view(tmp_path)


def test_group_advantages_are_reward_minus_group_mean():
    import doctest

    from searchrl.eval import view_run
    assert doctest.testmod(view_run).failed == 0
