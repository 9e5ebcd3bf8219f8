"""Streaming dataset reader: `.jsonl`, `.jsonl.gz` and `.json` (one array) with bounded memory.

The reader never holds the whole object: it consumes an iterator of byte chunks (`ObjectStore.iter_bytes`),
decompresses gzip incrementally (`zlib.decompressobj`, output capped per step) and splits records as it goes.
Each record carries its 1-based position: the line number of a JSON Lines file, the element index of a JSON array.
A record longer than `max_record_bytes` is skipped without buffering it and reported as oversized.

Errors of the whole file (truncated gzip, a broken JSON array) raise `DatasetFormatError`; errors of one record
are left to the row validator (`contracts.parse_row`), so one bad row never stops the others.
"""

from __future__ import annotations

import codecs
import json
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final, Literal

from rollout_pipeline.contracts import MAX_ROW_BYTES

DatasetKind = Literal["jsonl", "jsonl.gz", "json"]

#: Largest decompressed slice produced per step (bounds memory whatever the compression ratio).
_INFLATE_STEP: Final = 1 << 20
_JSON_WHITESPACE: Final = " \t\r\n"
_GZIP_WBITS: Final = 16 + zlib.MAX_WBITS


class DatasetFormatError(ValueError):
    """The file as a whole cannot be read further (truncated gzip, broken JSON array, unknown kind).

    `position` is the last record position reached (records before it were read fine).
    """

    def __init__(self, message: str, position: int = 0) -> None:
        super().__init__(message)
        self.position = position


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One record as read: its position and its JSON text, or the size it had when it was too big to keep."""

    position: int
    text: bytes | str
    oversized_bytes: int = 0
    #: A blank line (yielded only with `blanks=True`): no record, but progress through the file.
    blank: bool = False

    @property
    def oversized(self) -> bool:
        return self.oversized_bytes > 0


def dataset_kind(key: str) -> DatasetKind:
    """The kind of a dataset file from its key's suffix; `DatasetFormatError` for anything else."""
    if key.endswith(".jsonl.gz"):
        return "jsonl.gz"
    if key.endswith(".jsonl"):
        return "jsonl"
    if key.endswith(".json"):
        return "json"
    raise DatasetFormatError(f"unsupported dataset file {key!r}: use .jsonl, .jsonl.gz or .json")


def read_records(
    chunks: Iterable[bytes], kind: DatasetKind, *, max_record_bytes: int = MAX_ROW_BYTES, blanks: bool = False
) -> Iterator[RawRecord]:
    """Yield the records of a dataset file given as byte chunks. Blank lines are not records: skipped, or with
    `blanks=True` yielded as `RawRecord(blank=True)` so a reader can count progress through them."""
    if kind == "jsonl":
        return iter_lines(chunks, max_record_bytes=max_record_bytes, blanks=blanks)
    if kind == "jsonl.gz":
        return iter_lines(gunzip(chunks), max_record_bytes=max_record_bytes, blanks=blanks)
    return iter_json_array(chunks, max_record_bytes=max_record_bytes)


def gunzip(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Decompress a gzip stream (also several concatenated members) chunk by chunk.

    Raises `DatasetFormatError` when the stream is not gzip or ends before its last member is complete.
    """
    inflater = zlib.decompressobj(_GZIP_WBITS)
    seen_input = False
    for chunk in chunks:
        data = chunk
        while data:
            seen_input = True
            if inflater.eof:  # a new gzip member follows the previous one
                inflater = zlib.decompressobj(_GZIP_WBITS)
            try:
                out = inflater.decompress(data, _INFLATE_STEP)
                if out:
                    yield out
                while inflater.unconsumed_tail and not inflater.eof:
                    out = inflater.decompress(inflater.unconsumed_tail, _INFLATE_STEP)
                    if out:
                        yield out
            except zlib.error as exc:
                raise DatasetFormatError(f"not a valid gzip stream: {exc}") from None
            data = inflater.unused_data if inflater.eof else b""
    if seen_input and not inflater.eof:
        raise DatasetFormatError("gzip stream is truncated: the file ends before the compressed data does")


def iter_lines(
    chunks: Iterable[bytes], *, max_record_bytes: int = MAX_ROW_BYTES, blanks: bool = False
) -> Iterator[RawRecord]:
    """Split bytes into lines (LF or CRLF); yield non-blank lines with their 1-based line numbers (and blank ones
    as `blank` records when `blanks`)."""
    carry = b""
    line_no = 0
    skipping = 0  # > 0 while discarding the rest of an oversized line: its size so far
    for chunk in chunks:
        if not chunk:
            continue
        start = 0
        while True:
            newline = chunk.find(b"\n", start)
            if newline < 0:
                break
            line_no += 1
            if skipping:
                yield RawRecord(line_no, b"", oversized_bytes=skipping + newline - start)
                skipping = 0
            else:
                line = carry + chunk[start:newline] if carry else chunk[start:newline]
                carry = b""
                record = _line_record(line_no, line, max_record_bytes)
                if record is not None:
                    yield record
                elif blanks:
                    yield RawRecord(line_no, b"", blank=True)
            start = newline + 1
        rest = chunk[start:]
        if skipping:
            skipping += len(rest)
        elif rest:
            carry = carry + rest if carry else rest
            if len(carry) > max_record_bytes + 1:  # +1: a trailing CR does not count
                skipping = len(carry)
                carry = b""
    if skipping:
        yield RawRecord(line_no + 1, b"", oversized_bytes=skipping)
    elif carry:
        record = _line_record(line_no + 1, carry, max_record_bytes)
        if record is not None:
            yield record
        elif blanks:
            yield RawRecord(line_no + 1, b"", blank=True)


def _line_record(line_no: int, line: bytes, max_record_bytes: int) -> RawRecord | None:
    if line.endswith(b"\r"):
        line = line[:-1]
    if line_no == 1 and line.startswith(codecs.BOM_UTF8):
        line = line[len(codecs.BOM_UTF8) :]
    if len(line) > max_record_bytes:
        return RawRecord(line_no, b"", oversized_bytes=len(line))
    if not line.strip():
        return None
    return RawRecord(line_no, line)


def iter_json_array(chunks: Iterable[bytes], *, max_record_bytes: int = MAX_ROW_BYTES) -> Iterator[RawRecord]:
    """Yield the elements of one top-level JSON array as JSON texts, with 1-based element positions.

    Incremental: `json.JSONDecoder.raw_decode` over a buffer that holds at most about one element plus one input
    chunk. An element bigger than `max_record_bytes` is skipped by a small scanner and reported oversized.
    Malformed array syntax cannot be resynchronised and raises `DatasetFormatError` naming the position.
    """
    return _ArraySplitter(chunks, max_record_bytes).records()


class _ArraySplitter:
    """State of `iter_json_array`: a text buffer, the read position in it, and the element count."""

    def __init__(self, chunks: Iterable[bytes], max_record_bytes: int) -> None:
        self._source = iter(chunks)
        self._utf8 = codecs.getincrementaldecoder("utf-8")("strict")
        self._decoder = json.JSONDecoder()
        self._max = max_record_bytes
        self._buffer = ""
        self._pos = 0
        self._eof = False
        self.position = 0

    def _refill(self, *, keep_from: int | None = None) -> bool:
        """Append the next chunk (dropping what precedes `keep_from`, default the read position)."""
        if self._eof:
            return False
        keep = self._pos if keep_from is None else keep_from
        for chunk in self._source:
            if not chunk:
                continue
            try:
                text = self._utf8.decode(chunk)
            except UnicodeDecodeError:
                raise DatasetFormatError(
                    f"array is not valid UTF-8 at or after element {max(self.position, 1)}", self.position
                ) from None
            self._buffer = self._buffer[keep:] + text
            self._pos -= keep
            return True
        try:
            tail = self._utf8.decode(b"", final=True)
        except UnicodeDecodeError:
            raise DatasetFormatError("array ends inside a UTF-8 character", self.position) from None
        self._buffer = self._buffer[keep:] + tail
        self._pos -= keep
        self._eof = True
        return bool(tail)

    def _next_char(self) -> str | None:
        """Skip whitespace; the next significant character (not consumed), or None at end of input."""
        while True:
            buffer = self._buffer
            pos = self._pos
            while pos < len(buffer) and buffer[pos] in _JSON_WHITESPACE:
                pos += 1
            self._pos = pos
            if pos < len(buffer):
                return buffer[pos]
            if not self._refill():
                return None

    def records(self) -> Iterator[RawRecord]:
        char = self._next_char()
        if char == "\ufeff":
            self._pos += 1
            char = self._next_char()
        if char is None:
            return  # an empty file holds no rows
        if char != "[":
            raise DatasetFormatError("a .json dataset must be one JSON array of objects", 0)
        self._pos += 1
        if self._next_char() == "]":
            self._pos += 1
        else:
            while True:
                if self._next_char() is None:
                    raise self._unclosed()
                self.position += 1
                yield self._element()
                char = self._next_char()
                if char == ",":
                    self._pos += 1
                    continue
                if char == "]":
                    self._pos += 1
                    break
                if char is None:
                    raise self._unclosed()
                raise DatasetFormatError(
                    f"expected ',' or ']' after element {self.position}, got {char!r}", self.position
                )
        if self._next_char() is not None:
            raise DatasetFormatError(
                f"unexpected data after the closing ']' (after element {self.position})", self.position
            )

    def _unclosed(self) -> DatasetFormatError:
        return DatasetFormatError(f"array is not closed: the file ends after element {self.position}", self.position)

    def _element(self) -> RawRecord:
        """Decode the element at the read position, refilling until it is complete or provably too big."""
        while True:
            buffer, pos = self._buffer, self._pos
            try:
                _value, end = self._decoder.raw_decode(buffer, pos)
            except json.JSONDecodeError as exc:
                available = len(buffer) - pos
                if available > self._max:
                    return self._skip_oversized()
                if self._refill():
                    continue
                raise DatasetFormatError(f"element {self.position}: invalid JSON ({exc.msg})", self.position) from None
            # A number at the very end of the buffer may continue in the next chunk: decode again then.
            if end == len(buffer) and self._refill():
                continue
            text = buffer[pos:end]
            self._pos = end
            size = len(text.encode())
            if size > self._max:
                return RawRecord(self.position, "", oversized_bytes=size)
            return RawRecord(self.position, text)

    def _skip_oversized(self) -> RawRecord:
        """Scan past an oversized element (string and nesting aware) without keeping it in memory."""
        depth = 0
        in_string = False
        escaped = False
        skipped = 0
        while True:
            buffer = self._buffer
            index = self._pos
            while index < len(buffer):
                char = buffer[index]
                if in_string:
                    if escaped:
                        escaped = False
                    elif char == "\\":
                        escaped = True
                    elif char == '"':
                        in_string = False
                elif char == '"':
                    in_string = True
                elif char in "[{":
                    depth += 1
                elif char in "]}" and depth > 0:
                    depth -= 1
                elif char in ",]" and depth == 0:
                    skipped += len(buffer[self._pos : index].encode())
                    self._pos = index
                    return RawRecord(self.position, "", oversized_bytes=skipped)
                index += 1
            skipped += len(buffer[self._pos :].encode())
            self._pos = len(buffer)
            if not self._refill():
                raise DatasetFormatError(
                    f"element {self.position}: the file ends inside an oversized element", self.position
                )
