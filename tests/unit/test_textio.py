"""The shared text / JSON-lines reader: every command that reads a file reports bad bytes,
broken JSON and directories as one line naming the file and line."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.data.textio import (
    MAX_DEPTH,
    iter_json_lines,
    read_appended_jsonl,
    read_json,
    read_lines,
)
from searchrl.errors import DataError, SearchRLError

# Each line suits every command: a question, a prediction, a response and a passage text.
_LINE = '{"id": "%s", "question": "%s?", "answers": ["%s"], "prediction": "%s", "response": "x", "text": "%s"}\n'
LATIN1 = (_LINE % (("q1",) + ("Bern",) * 4)).encode() + (_LINE % (("q2",) + ("Z\xfcrich",) * 4)).encode("latin-1")


@pytest.mark.parametrize(
    "command",
    [
        "data show {file}",
        "eval score {file}",
        "eval format-check {file}",
        "view {file}",
        "index build {file} --out {tmp}/idx",
    ],
)
def test_commands_report_non_utf8_input_with_file_and_line(tmp_path, command):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(LATIN1)
    args = command.format(file=path, tmp=tmp_path).split()
    result = CliRunner().invoke(app, args)
    assert isinstance(result.exception, DataError), result.output
    assert str(result.exception).startswith(f"{path}:2: not UTF-8 text (byte 0xfc")


def test_read_lines_drops_the_byte_order_mark_and_reads_gzip(tmp_path):
    import gzip

    plain = tmp_path / "a.jsonl"
    plain.write_bytes(b'\xef\xbb\xbf{"a": 1}\r\n\n{"a": 2}')
    assert [v for _, v in iter_json_lines(plain)] == [{"a": 1}, {"a": 2}]
    packed = tmp_path / "a.jsonl.gz"
    packed.write_bytes(gzip.compress(b'{"a": 1}\n\xff\n'))
    with pytest.raises(DataError, match=r"a\.jsonl\.gz:2: not UTF-8 text \(byte 0xff"):
        list(read_lines(packed))


def test_torn_last_line_is_an_error_unless_the_caller_skips_it(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": ')
    with pytest.raises(DataError, match=r"m\.jsonl:3: invalid JSON at column 7"):
        list(iter_json_lines(path))
    notes: list[str] = []
    assert [v for _, v in iter_json_lines(path, on_torn_tail=notes.append)] == [{"a": 1}, {"a": 2}]
    assert notes == [f"{path}:3: the last line is cut off (no line ending, not valid JSON); skipped it"]


def test_appended_jsonl_drops_a_torn_tail_ends_the_last_line_and_names_a_bad_middle_line(tmp_path):
    path = tmp_path / "progress.jsonl"
    assert read_appended_jsonl(path, "redo") == []  # nothing written yet
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": 3, "b"')  # killed mid-write
    assert read_appended_jsonl(path, "redo") == [{"a": 1}, {"a": 2}]
    assert path.read_text() == '{"a": 1}\n{"a": 2}\n'  # appending goes on after line 2
    path.write_text('{"a": 1}\n{"a": 2}')  # killed between the value and its newline
    assert read_appended_jsonl(path, "redo") == [{"a": 1}, {"a": 2}]
    assert path.read_text().endswith('{"a": 2}\n')  # the next append starts a line of its own
    path.write_text('{"a": 1}\nnot json\n{"a": 3}\n')
    with pytest.raises(DataError, match=r"progress.jsonl:2 is not JSON; delete that line \(its round"):
        read_appended_jsonl(path, "its round is then sampled again")


# 100,000 levels: json.loads alone would raise RecursionError near 1,000.
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    "command",
    ["data show {file}", "eval score {file}", "view {file}", "index build {file} --out {tmp}/idx"],
)
def test_commands_report_deeply_nested_json_with_file_and_line(tmp_path, command):
    path = tmp_path / "deep.jsonl"
    prefix = '{"id": "q2", "text": '
    path.write_text((_LINE % (("q1",) + ("Bern",) * 4)) + prefix + DEEP + "}\n")
    result = CliRunner().invoke(app, command.format(file=path, tmp=tmp_path).split())
    assert isinstance(result.exception, DataError), result.output
    column = len(prefix) + MAX_DEPTH  # the object is level 1, its 64th bracket level 65
    assert str(result.exception).startswith(f"{path}:2: JSON nested more than {MAX_DEPTH} levels deep (at column {column})")


def test_nesting_limit_counts_brackets_outside_strings_only(tmp_path):
    path = tmp_path / "n.jsonl"
    at_limit = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    brackets_in_text = json.dumps({"text": "[{" * 1000 + "\\\"]" * 10})  # escapes and brackets in a string
    path.write_text(f"{at_limit}\n{brackets_in_text}\n" + "{\"a\": " * (MAX_DEPTH + 1) + "1" + "}" * (MAX_DEPTH + 1) + "\n")
    lines = iter_json_lines(path)
    assert next(lines)[1] == json.loads(at_limit)
    assert next(lines)[1] == json.loads(brackets_in_text)
    with pytest.raises(DataError, match=rf"n\.jsonl:3: JSON nested more than {MAX_DEPTH} levels deep \(at column {6 * MAX_DEPTH + 1}\)"):
        next(lines)


def test_whole_file_json_nesting_names_the_line(tmp_path):
    path = tmp_path / "list.json"
    prefix = ' {"question": "q", "answer": '
    path.write_text('[\n {"question": "q", "answer": "a"},\n' + prefix + DEEP + "}\n]")
    column = len(prefix) + MAX_DEPTH - 1  # the list and the object are levels 1 and 2
    with pytest.raises(DataError, match=rf"list\.json:3: JSON nested more than {MAX_DEPTH} levels deep \(at column {column}\)"):
        read_json(path)
    path.write_text('[\n {"a": 1},\n {"a": }\n]')
    with pytest.raises(DataError, match=r"list\.json:3: invalid JSON at column 8"):
        read_json(path)


def test_over_long_json_line_is_refused_without_reading_it_whole(tmp_path, monkeypatch):
    from searchrl.data import textio

    monkeypatch.setattr(textio, "MAX_LINE_BYTES", 100)
    path = tmp_path / "long.jsonl"
    exactly = json.dumps({"t": "x" * 91})  # 100 bytes: allowed, its line ending not counted
    path.write_text(f"{exactly}\r\n" + json.dumps({"t": "x" * 10_000}) + "\n")
    lines = iter_json_lines(path)
    assert next(lines) == (1, {"t": "x" * 91})
    with pytest.raises(DataError, match=r"long\.jsonl:2: line longer than 100 bytes, the limit for one JSON-lines record"):
        next(lines)
    assert len(list(read_lines(path))) == 2  # plain text lines have no limit


@pytest.mark.parametrize(
    "command, message",
    [
        ("data show {dir}", "{dir} is a directory, not a file; pass a file"),
        ("eval format-check {dir}", "{dir} is a directory, not a file; pass a file"),
        ("view {dir}", "{dir}: no predictions.jsonl and no samples/step_*.jsonl; give a run folder"),
        ("index build {dir} --out {tmp}/idx", "{dir} is a directory, not a corpus file; pass a file"),
        ("eval run --config {dir}", "config file {dir} is a directory; give a YAML file"),
        ("index search {file} q", "{file} is a file, not an index directory"),
        ("serve --index {file}", "{file} is a file, not an index directory"),
        ("eval retrieval --dataset toyworld:test --index {file}", "{file} is a file, not an index directory"),
    ],
)
def test_a_directory_for_a_file_and_a_file_for_a_directory_are_named_so(tmp_path, command, message):
    folder, file = tmp_path / "folder", tmp_path / "index.jsonl"
    folder.mkdir()
    file.write_text("{}\n")
    result = CliRunner().invoke(app, command.format(dir=folder, file=file, tmp=tmp_path).split())
    assert isinstance(result.exception, SearchRLError), result.output
    assert str(result.exception).startswith(message.format(dir=folder, file=file))
    assert "does not exist" not in str(result.exception) and "no such" not in str(result.exception)
