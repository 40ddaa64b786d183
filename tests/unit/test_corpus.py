"""Corpus reading: every supported shape, chunking, auto-detection and the errors people see."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from searchrl.errors import DataError, SearchRLError
from searchrl.retrieval.corpus import (
    CorpusWarning,
    chunk_document,
    detect_format,
    read_passages,
    split_contents,
)

LONG = " ".join(f"w{i}" for i in range(250))  # 250 distinct words -> 3 chunks of 84/83/83


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def jsonl(path: Path, records: list) -> Path:
    return write(path, "".join(json.dumps(r) + "\n" for r in records))


# --- chunking --------------------------------------------------------------------------


def test_chunking_splits_evenly_and_keeps_title():
    chunks = chunk_document("d7", "  Big   Title ", LONG, chunk_words=100)
    assert [p.id for p in chunks] == ["d7-0", "d7-1", "d7-2"]
    assert [len(p.text.split()) for p in chunks] == [84, 83, 83]
    assert {p.title for p in chunks} == {"Big Title"}
    # Nothing lost, nothing duplicated, order kept.
    assert " ".join(p.text for p in chunks) == LONG


@pytest.mark.parametrize(
    ("n_words", "chunk_words", "sizes"),
    [(149, 100, [149]), (150, 100, [75, 75]), (40, 100, [40]), (1000, 0, [1000]), (7, 3, [4, 3])],
)
def test_chunk_sizes(n_words, chunk_words, sizes):
    chunks = chunk_document("x", "", " ".join(["a"] * n_words), chunk_words)
    assert [len(p.text.split()) for p in chunks] == sizes
    if len(sizes) == 1:
        assert chunks[0].id == "x"  # a short document keeps its own id


def test_whitespace_collapsed_and_blank_text_gives_nothing():
    assert chunk_document("a", "T", "  one\n two\tthree ")[0].text == "one two three"
    assert chunk_document("a", "T", " \n ") == []


# --- each format -----------------------------------------------------------------------


def test_jsonl_title_text(tmp_path):
    path = jsonl(
        tmp_path / "c.jsonl",
        [
            {"id": "d1", "title": "Alpha", "text": "short text here"},
            {"id": 2, "title": "Beta", "text": LONG},
            {"title": "Gamma", "text": "no id given"},
        ],
    )
    ps = list(read_passages(path))
    assert [p.id for p in ps] == ["d1", "2-0", "2-1", "2-2", "2"]
    assert ps[0].title == "Alpha" and ps[0].text == "short text here" and ps[0].score is None
    assert {p.title for p in ps[1:4]} == {"Beta"}
    assert ps[4].title == "Gamma"  # id falls back to the record number (0-based)


def test_flashrag_contents(tmp_path):
    path = jsonl(
        tmp_path / "wiki.jsonl",
        [
            {"id": "0", "contents": '"Evan Morris"\nEvan Morris was a lobbyist.'},
            {"id": "1", "contents": "Absalon\nAbsalon was a bishop."},
            {"id": "2", "contents": "no title line at all"},
        ],
    )
    assert detect_format(path) == "flashrag"
    ps = list(read_passages(path))
    assert [(p.id, p.title, p.text) for p in ps] == [
        ("0", "Evan Morris", "Evan Morris was a lobbyist."),
        ("1", "Absalon", "Absalon was a bishop."),
        ("2", "", "no title line at all"),
    ]
    assert split_contents('"A "quoted" title"\nx') == ('A "quoted" title', "x")


def test_kilt_pages(tmp_path):
    page = {
        "wikipedia_id": "290",
        "wikipedia_title": "A",
        "text": [
            "A\n",
            "A is the first letter.\n",
            "Section::::History.\n",
            "BULLET::::- aleph came first\n",
        ],
    }
    path = jsonl(tmp_path / "kilt.jsonl", [page, {"wikipedia_title": "B", "text": ["B\n", LONG]}])
    assert detect_format(path) == "kilt"
    ps = list(read_passages(path))
    assert ps[0] == ps[0].__class__(
        "290", "A", "A is the first letter. History. - aleph came first"
    )
    assert [p.id for p in ps[1:]] == ["1-0", "1-1", "1-2"]  # no wikipedia_id: record number
    assert ps[1].text.startswith("w0 w1")  # the repeated title paragraph is dropped


def test_dpr_tsv_with_header_and_quotes(tmp_path):
    path = write(
        tmp_path / "psgs.tsv",
        'id\ttext\ttitle\n1\t"He said ""hi"" twice"\tAaron\n2\tplain text\tBob\n',
    )
    ps = list(read_passages(path))
    assert [(p.id, p.title, p.text) for p in ps] == [
        ("1", "Aaron", 'He said "hi" twice'),
        ("2", "Bob", "plain text"),
    ]


def test_tsv_header_in_any_order(tmp_path):
    path = write(tmp_path / "psgs.tsv", "title\tid\ttext\nZed\t9\tsome words\n")
    assert [(p.id, p.title, p.text) for p in read_passages(path)] == [("9", "Zed", "some words")]


def test_two_column_tsv_title_text_shape_with_bom_and_crlf(tmp_path):
    path = tmp_path / "abs.tsv"
    path.write_bytes(
        '\ufeff0\t"Title: Lucy Mair Text:  Lucy Mair was a ""British"" anthropologist."\r\n'
        "1\tTitle: Urique Text:  A municipality.\r\n".encode("utf-8")
    )
    ps = list(read_passages(path))
    assert [(p.id, p.title, p.text) for p in ps] == [
        ("0", "Lucy Mair", 'Lucy Mair was a "British" anthropologist.'),
        ("1", "Urique", "A municipality."),
    ]


def test_two_column_tsv_spaces_shape_and_truncated_last_row(tmp_path):
    # R1-Searcher's KILT page sample: "Title   text", and the file is cut off mid-row.
    path = write(
        tmp_path / "kilt.tsv",
        "0\tAlbedo   Albedo is whiteness.\n1\tAllan Dwan   Allan Dwan Allan D",
    )
    with pytest.warns(CorpusWarning, match=r"kilt\.tsv:2: the last row has no line ending"):
        ps = list(read_passages(path))
    assert [(p.id, p.title, p.text) for p in ps] == [
        ("0", "Albedo", "Albedo is whiteness."),
        ("1", "Allan Dwan", "Allan Dwan Allan D"),
    ]


def test_json_list(tmp_path):
    path = write(
        tmp_path / "corpus.json",
        json.dumps([{"title": "T1", "text": "one"}, {"title": "T2", "text": LONG}]),
    )
    assert detect_format(path) == "json-list"
    assert [(p.id, p.title) for p in read_passages(path)] == [
        ("0", "T1"),
        ("1-0", "T2"),
        ("1-1", "T2"),
        ("1-2", "T2"),
    ]


def test_json_dict_title_to_sentences(tmp_path):
    path = write(
        tmp_path / "corpus.json",
        json.dumps({"Demon Dice": ["It is a game.", " It has dice."], "X": ["y"]}),
    )
    assert detect_format(path) == "json-dict"
    ps = list(read_passages(path))
    assert [(p.id, p.title, p.text) for p in ps] == [
        ("0", "Demon Dice", "It is a game. It has dice."),
        ("1", "X", "y"),
    ]


def test_pretty_printed_json_dict_is_detected(tmp_path):
    path = write(tmp_path / "corpus.json", json.dumps({"A": ["a b"], "B": ["c"]}, indent=2))
    assert detect_format(path) == "json-dict"
    assert len(list(read_passages(path, fmt="auto"))) == 2


def test_explicit_format_overrides_detection(tmp_path):
    path = write(tmp_path / "data.txt", '{"id": "7", "text": "hello there"}\n')
    assert [p.id for p in read_passages(path, fmt="jsonl")] == ["7"]


def test_blank_lines_are_skipped(tmp_path):
    path = write(tmp_path / "c.jsonl", '\n{"text": "a b"}\n\n  \n{"text": "c d"}\n')
    assert [p.text for p in read_passages(path)] == ["a b", "c d"]


# --- errors people see -----------------------------------------------------------------


def test_missing_field_names_file_line_and_field(tmp_path):
    path = jsonl(
        tmp_path / "bad.jsonl",
        [{"id": 1, "text": "ok"}, {"id": 2, "text": "ok"}, {"id": 3, "body": "x"}],
    )
    passages = read_passages(path)  # lazy: the first two rows stream before the error
    with pytest.raises(
        DataError, match=r"bad\.jsonl:3: record has no 'text' field \(has: id, body\)"
    ):
        list(passages)


def test_missing_contents_and_kilt_fields(tmp_path):
    path = jsonl(
        tmp_path / "f.jsonl", [{"id": "0", "contents": "T\nx"}, {"id": "1", "content": "typo"}]
    )
    with pytest.raises(DataError, match=r"f\.jsonl:2: .*'contents'"):
        list(read_passages(path))
    path = jsonl(
        tmp_path / "k.jsonl", [{"wikipedia_title": "A", "text": ["x"]}, {"wikipedia_title": "B"}]
    )
    with pytest.raises(DataError, match=r"k\.jsonl:2: .*'text'"):
        list(read_passages(path))


def test_invalid_json_line_is_an_error_but_a_cut_off_last_line_a_warning(tmp_path):
    path = write(tmp_path / "c.jsonl", '{"text": "a"}\n{"text": broken}\n{"text": "b"}\n')
    with pytest.raises(DataError, match=r"c\.jsonl:2: invalid JSON at column 10 "):
        list(read_passages(path))
    path = write(tmp_path / "cut.jsonl", '{"text": "a"}\n{"text": "b"}\n{"text": "cut of')
    with pytest.warns(CorpusWarning, match=r"cut\.jsonl:3: the last line is cut off"):
        assert [p.text for p in read_passages(path)] == ["a", "b"]


def test_wrong_types_are_errors(tmp_path):
    path = jsonl(tmp_path / "c.jsonl", [{"text": "fine"}, {"text": 42}])
    with pytest.raises(DataError, match=r"c\.jsonl:2: field 'text' must be a string"):
        list(read_passages(path))
    path = write(tmp_path / "c2.jsonl", '{"text": "fine"}\n["a", "list"]\n')
    with pytest.raises(DataError, match=r"c2\.jsonl:2: expected a JSON object"):
        list(read_passages(path, fmt="jsonl"))


def test_tsv_short_row_names_line_and_missing_column(tmp_path):
    path = write(tmp_path / "p.tsv", "id\ttext\ttitle\n1\ttext one\tA\n2\ttext two\n")
    with pytest.raises(DataError, match=r"p\.tsv:3: row has 2 column\(s\); missing title"):
        list(read_passages(path))
    path = write(tmp_path / "one.tsv", "just one column\n")
    with pytest.raises(DataError, match=r"one\.tsv:1: expected id<TAB>text"):
        list(read_passages(path))


def test_json_list_item_errors_name_the_item(tmp_path):
    path = write(tmp_path / "c.json", json.dumps([{"title": "a", "text": "x"}, {"title": "b"}]))
    with pytest.raises(DataError, match=r"c\.json: item 1: record has no 'text'"):
        list(read_passages(path))
    path = write(tmp_path / "d.json", '{"A": ["x"],\n "B": }')
    with pytest.raises(DataError, match=r"d\.json:2: invalid JSON at column"):
        list(read_passages(path, fmt="json-dict"))


def test_empty_corpus_errors(tmp_path):
    with pytest.raises(DataError, match="held no passages"):
        read_passages(write(tmp_path / "empty.jsonl", ""))
    with pytest.raises(DataError, match="held no passages"):
        list(read_passages(write(tmp_path / "empty.json", "[]")))
    blank = jsonl(tmp_path / "blank.jsonl", [{"text": "  "}, {"text": ""}])
    skipped = r"skipped 2 record\(s\) with empty text \(first at .*blank\.jsonl:1\)"
    with (
        pytest.warns(CorpusWarning, match=skipped),
        pytest.raises(DataError, match=r"blank\.jsonl: the file held no passages"),
    ):
        list(read_passages(blank))


def test_missing_file_unknown_format_and_undetectable_shape(tmp_path):
    with pytest.raises(DataError, match="no such corpus file"):
        read_passages(tmp_path / "nope.jsonl")
    path = write(tmp_path / "c.jsonl", '{"text": "x"}\n')
    with pytest.raises(SearchRLError, match="unknown corpus format 'parquet'"):
        read_passages(path, fmt="parquet")
    with pytest.raises(
        DataError, match=r"odd\.jsonl:1: cannot tell the corpus format .*keys: question, answer"
    ):
        read_passages(write(tmp_path / "odd.jsonl", '{"question": "q", "answer": "a"}\n'))
    with pytest.raises(DataError, match="cannot tell the corpus format"):
        read_passages(write(tmp_path / "notes.txt", "just prose\n"))


@pytest.mark.parametrize(
    ("name", "data", "line"),
    [
        ("c.jsonl", b'{"text": "a"}\n{"text": "caf\xe9"}\n', 2),
        ("c.tsv", b"id\ttext\ttitle\n1\tok\tT\n2\tcaf\xe9\tT\n", 3),
        ("c.json", b'[\n{"title": "T", "text": "a"},\n{"title": "T", "text": "caf\xe9"}\n]', 3),
        ("first.jsonl", b'{"text": "caf\xe9"}\n', 1),  # found by format detection
    ],
)
def test_non_utf8_corpus_names_file_and_line(tmp_path, name, data, line):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(DataError, match=rf"{name}:{line}: not UTF-8 text \(byte 0xe9"):
        list(read_passages(path))
