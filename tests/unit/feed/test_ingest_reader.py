"""The streaming dataset reader: JSON Lines (plain and gzip) and JSON arrays, in arbitrary chunkings."""

from __future__ import annotations

import gzip
import json
import tracemalloc
import zlib
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_pipeline.ingest.errors import ErrorLog
from rollout_pipeline.ingest.reader import (
    DatasetFormatError,
    RawRecord,
    dataset_kind,
    gunzip,
    iter_json_array,
    iter_lines,
    read_records,
)


def chunked(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)] or [b""]


def texts(records: list[RawRecord]) -> list[tuple[int, str]]:
    return [(r.position, r.text.decode() if isinstance(r.text, bytes) else r.text) for r in records if not r.oversized]


@pytest.mark.parametrize("chunk_size", [1, 2, 7, 1 << 20])
def test_jsonl_lines_are_numbered_from_one_and_blank_lines_are_skipped(chunk_size: int) -> None:
    data = b'{"a":1}\n\n   \n{"b":2}\n\t\n{"c":3}'  # no trailing newline on the last line
    records = list(read_records(chunked(data, chunk_size), "jsonl"))
    assert texts(records) == [(1, '{"a":1}'), (4, '{"b":2}'), (6, '{"c":3}')]


@pytest.mark.parametrize("chunk_size", [1, 3, 1 << 20])
def test_crlf_line_endings_and_utf8_bom(chunk_size: int) -> None:
    data = b'\xef\xbb\xbf{"a":"\xc3\xa9"}\r\n\r\n{"b":2}\r\n'
    records = list(read_records(chunked(data, chunk_size), "jsonl"))
    assert texts(records) == [(1, '{"a":"é"}'), (3, '{"b":2}')]


def test_a_line_over_the_limit_is_reported_oversized_without_being_buffered() -> None:
    huge = b"x" * 5000
    data = b'{"a":1}\n' + huge + b'\n{"b":2}\n' + huge  # also a huge last line without newline
    records = list(iter_lines(chunked(data, 64), max_record_bytes=100))
    assert [(r.position, r.oversized_bytes) for r in records if r.oversized] == [(2, 5000), (4, 5000)]
    assert texts(records) == [(1, '{"a":1}'), (3, '{"b":2}')]


def test_a_line_exactly_at_the_limit_is_kept_and_crlf_does_not_count() -> None:
    line = b'{"k":"' + b"v" * 92 + b'"}'  # 100 bytes
    records = list(iter_lines(chunked(line + b"\r\n" + line + b"x\n", 5), max_record_bytes=100))
    assert [(r.position, r.oversized) for r in records] == [(1, False), (2, True)]


def test_huge_line_memory_stays_bounded() -> None:
    def stream() -> Iterator[bytes]:
        yield b'{"a":1}\n'
        for _ in range(64):  # a 64 MiB line, streamed
            yield b"y" * (1 << 20)
        yield b'\n{"b":2}\n'

    tracemalloc.start()
    records = list(iter_lines(stream(), max_record_bytes=1 << 20))
    _current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert [(r.position, r.oversized) for r in records] == [(1, False), (2, True), (3, False)]
    assert records[1].oversized_bytes == 64 << 20
    assert peak < 8 << 20, f"peak {peak} bytes: the huge line was buffered"


@pytest.mark.parametrize("chunk_size", [1, 10, 1 << 20])
def test_gzip_is_streamed_including_concatenated_members(chunk_size: int) -> None:
    data = gzip.compress(b'{"a":1}\n{"b":2}\n') + gzip.compress(b'\n{"c":3}\n')
    records = list(read_records(chunked(data, chunk_size), "jsonl.gz"))
    assert texts(records) == [(1, '{"a":1}'), (2, '{"b":2}'), (4, '{"c":3}')]


def test_truncated_gzip_raises_a_clear_error_after_the_rows_before_it() -> None:
    data = gzip.compress(b"".join(b'{"n":%d}\n' % i for i in range(2000)))
    records: list[RawRecord] = []
    with pytest.raises(DatasetFormatError, match="gzip stream is truncated"):
        records.extend(read_records(chunked(data[: len(data) - 20], 256), "jsonl.gz"))
    assert records, "rows before the truncation are still read"
    assert [r.position for r in records] == list(range(1, len(records) + 1))


def test_not_gzip_raises_a_clear_error() -> None:
    with pytest.raises(DatasetFormatError, match="not a valid gzip stream"):
        list(gunzip([b"this is plain text, not gzip"]))


def test_gzip_bomb_output_is_produced_in_bounded_slices() -> None:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    bomb = compressor.compress(b"\n" * (32 << 20)) + compressor.flush()
    assert len(bomb) < 100_000
    slices = list(gunzip([bomb]))
    assert sum(len(s) for s in slices) == 32 << 20
    assert max(len(s) for s in slices) <= 1 << 20


@pytest.mark.parametrize("chunk_size", [1, 2, 5, 1 << 20])
def test_json_array_elements_with_positions(chunk_size: int) -> None:
    data = '\ufeff [ {"a": "x,]}"} ,\n 12345, "s", [1, 2], {"z": "é", "n": {"d": [1]}} , null ]\n'.encode()
    records = list(read_records(chunked(data, chunk_size), "json"))
    assert texts(records) == [
        (1, '{"a": "x,]}"}'),
        (2, "12345"),
        (3, '"s"'),
        (4, "[1, 2]"),
        (5, '{"z": "é", "n": {"d": [1]}}'),
        (6, "null"),
    ]


def test_json_array_number_split_across_chunks_is_not_cut() -> None:
    records = list(iter_json_array([b"[1", b"23", b"45", b"]"]))
    assert texts(records) == [(1, "12345")]


@pytest.mark.parametrize("data", [b"[]", b"  [ ]  ", b""])
def test_empty_json_array_or_file_has_no_rows(data: bytes) -> None:
    assert list(read_records([data], "json")) == []


def test_json_array_oversized_element_is_skipped_by_the_scanner() -> None:
    big = '{"s": "' + 'q\\"],{' * 500 + '", "l": [[{}]]}'
    data = f'[{{"a":1}}, {big}, {{"b":2}}]'.encode()
    records = list(iter_json_array(chunked(data, 16), max_record_bytes=200))
    assert [(r.position, r.oversized) for r in records] == [(1, False), (2, True), (3, False)]
    assert records[1].oversized_bytes >= len(big) - 2
    assert texts(records) == [(1, '{"a":1}'), (3, '{"b":2}')]


@pytest.mark.parametrize(
    ("data", "message", "position"),
    [
        (b'{"a": 1}', "must be one JSON array", 0),
        (b'[{"a":1} {"b":2}]', "expected ',' or ']' after element 1", 1),
        (b'[{"a":1},', "array is not closed", 1),
        (b'[{"a":1}', "array is not closed", 1),
        (b'[{"a":1}] trailing', "unexpected data after the closing", 1),
        (b'[{"a":1}, {"b": tru}]', "element 2: invalid JSON", 2),
        (b'[{"a":1},]', "element 2: invalid JSON", 2),
        (b'[{"a": "\xff"}]', "not valid UTF-8 at or after element 1", 1),
    ],
)
def test_broken_json_array_raises_with_the_position(data: bytes, message: str, position: int) -> None:
    with pytest.raises(DatasetFormatError, match=message) as info:
        list(iter_json_array(chunked(data, 3)))
    assert info.value.position == position


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=8), st.none()), max_size=3),
        max_size=12,
    ),
    chunk_size=st.integers(min_value=1, max_value=40),
    blank_every=st.integers(min_value=0, max_value=4),
)
def test_any_chunking_yields_the_same_rows_in_all_three_formats(
    rows: list[dict[str, object]], chunk_size: int, blank_every: int
) -> None:
    lines: list[bytes] = []
    expected: list[tuple[int, object]] = []
    for row in rows:
        if blank_every and len(lines) % blank_every == 0:
            lines.append(b"")
        lines.append(json.dumps(row, ensure_ascii=False).encode())
        expected.append((len(lines), row))
    data = b"\r\n".join(lines) + b"\r\n"

    def decoded(records: list[RawRecord]) -> list[tuple[int, object]]:
        return [(r.position, json.loads(r.text)) for r in records]

    assert decoded(list(read_records(chunked(data, chunk_size), "jsonl"))) == expected
    assert decoded(list(read_records(chunked(gzip.compress(data), chunk_size), "jsonl.gz"))) == expected
    array = json.dumps(rows, ensure_ascii=False, indent=1).encode()
    assert decoded(list(read_records(chunked(array, chunk_size), "json"))) == [
        (i, row) for i, row in enumerate(rows, start=1)
    ]


@pytest.mark.parametrize(
    ("key", "kind"),
    [("datasets/a.jsonl", "jsonl"), ("datasets/a.b.jsonl.gz", "jsonl.gz"), ("datasets/x.json", "json")],
)
def test_dataset_kind_by_suffix(key: str, kind: str) -> None:
    assert dataset_kind(key) == kind


def test_unknown_dataset_kind_is_an_error() -> None:
    with pytest.raises(DatasetFormatError, match="unsupported dataset file"):
        dataset_kind("datasets/a.csv")


def test_error_log_caps_entries_counts_the_rest_and_restores_up_to_the_cursor() -> None:
    log = ErrorLog(file="datasets/a.jsonl", max_entries=2, max_error_chars=10)
    log.add(3, "invalid_json", "invalid JSON: Expecting value")
    log.add(5, "not_an_object", "x")
    log.add(9, "invalid_id", "y")
    assert log.total == 3
    assert log.listed == 2
    lines = [json.loads(line) for line in log.render(final=True).splitlines()]
    assert lines[0] == {"file": "datasets/a.jsonl", "line": 3, "reason": "invalid_json", "error": "invalid JS..."}
    assert lines[-1]["reason"] == "truncated"
    assert lines[-1]["line"] is None
    assert "1 more rejected row" in lines[-1]["error"]

    restored = ErrorLog(file="datasets/a.jsonl", max_entries=2)
    restored.restore(log.render(final=True), cursor=4, total=1)
    assert [e["line"] for e in restored.entries] == [3]
    assert restored.total == 1
    assert ErrorLog(file="f").render(final=True) == b""
