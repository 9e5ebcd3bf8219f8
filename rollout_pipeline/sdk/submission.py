"""Submitting work: dataset files (validated locally, uploaded under `datasets/`) and in-memory payloads
(straight to the rollout queue, through the ingestion stage's ledger API).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from rollout_pipeline import ids
from rollout_pipeline.config import ExperimentConfig, SamplingParams
from rollout_pipeline.contracts import (
    DatasetRow,
    FileOptions,
    RowError,
    parse_row,
)
from rollout_pipeline.sdk.errors import DatasetInvalid

#: At most this many problems are collected (and listed) per validation.
MAX_PROBLEMS: Final = 20
_CHUNK: Final = 1 << 20


def file_options(
    config: ExperimentConfig,
    *,
    group_size: int | None = None,
    sampling_params: Mapping[str, Any] | SamplingParams | None = None,
    timeout_s: int | None = None,
    max_attempts: int | None = None,
    policy_version: str | None = None,
    budget_usd: float | None = None,
    oversample: int | None = None,
) -> FileOptions:
    """The experiment's defaults with the given overrides (sampling params merge key by key); `ValueError` if bad."""
    from pydantic import ValidationError

    values = FileOptions.defaults(config).model_dump()
    if group_size is not None:
        values["group_size"] = group_size
    if timeout_s is not None:
        values["rollout_timeout_s"] = timeout_s
    if max_attempts is not None:
        values["max_attempts"] = max_attempts
    if policy_version is not None:
        values["policy_version"] = policy_version
    if budget_usd is not None:
        values["budget_usd"] = budget_usd
    if oversample is not None:
        values["oversample"] = oversample
    if sampling_params is not None:
        extra = (
            sampling_params.model_dump(exclude_none=True)
            if isinstance(sampling_params, SamplingParams)
            else dict(sampling_params)
        )
        values["sampling_params"] = {**values["sampling_params"], **extra}
    try:
        return FileOptions.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "options"
        raise ValueError(f"{where}: {err['msg']} (got {err.get('input')!r})") from None


# ------------------------------------------------------------------------------------------ local validation


def _file_chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            yield chunk


def validate_file(path: str | os.PathLike[str], *, max_problems: int = MAX_PROBLEMS) -> int:
    """Validate a dataset file the way ingestion will (same reader, same row validator, duplicate ids).

    Returns the number of valid rows; raises `DatasetInvalid` naming the file, the line and the reason.
    """
    from rollout_pipeline.ingest.reader import DatasetFormatError, dataset_kind, read_records

    file_path = Path(path)
    name = str(path)
    if not file_path.is_file():
        raise DatasetInvalid(name, [("", "no such file")])
    try:
        kind = dataset_kind(file_path.name)
    except DatasetFormatError as exc:
        raise DatasetInvalid(name, [("", str(exc))]) from None
    problems: list[tuple[str, str]] = []
    total_bad = 0
    seen: dict[str, int] = {}
    rows = 0
    try:
        for record in read_records(_file_chunks(file_path), kind):
            reason: str | None = None
            if record.oversized:
                reason = f"oversized: row is {record.oversized_bytes} bytes"
            else:
                try:
                    row = parse_row(record.text, record.position)
                except RowError as exc:
                    reason = f"{exc.reason}: {exc}"
                else:
                    first = seen.setdefault(row.input_id, record.position)
                    if first != record.position:
                        reason = f"duplicate_id: id {row.input_id!r} is already used on line {first}"
            if reason is None:
                rows += 1
                continue
            total_bad += 1
            if len(problems) < max_problems:
                problems.append((str(record.position), reason))
    except DatasetFormatError as exc:
        problems.append((str(exc.position) if exc.position else "", str(exc)))
        total_bad += 1
    if problems:
        raise DatasetInvalid(name, problems, total_bad)
    if rows == 0:
        raise DatasetInvalid(name, [("", "the file has no rows")])
    return rows


def validate_payloads(payloads: Iterable[Mapping[str, Any]], *, source: str = "payloads") -> list[DatasetRow]:
    """Validate in-memory payloads as dataset rows (position = 1-based index); `DatasetInvalid` if any is bad."""
    rows: list[DatasetRow] = []
    problems: list[tuple[str, str]] = []
    total_bad = 0
    seen: dict[str, int] = {}
    for position, payload in enumerate(payloads, start=1):
        try:
            row = parse_row(payload, position)
        except RowError as exc:
            total_bad += 1
            if len(problems) < MAX_PROBLEMS:
                problems.append((f"#{position - 1}", f"{exc.reason}: {exc}"))
            continue
        first = seen.setdefault(row.input_id, position)
        if first != position:
            total_bad += 1
            if len(problems) < MAX_PROBLEMS:
                problems.append(
                    (f"#{position - 1}", f"duplicate_id: id {row.input_id!r} is already used by #{first - 1}")
                )
            continue
        rows.append(row)
    if problems:
        raise DatasetInvalid(source, problems, total_bad)
    if not rows:
        raise DatasetInvalid(source, [("", "no payloads to submit")])
    return rows


def dataset_key(path: str | os.PathLike[str], key: str | None = None) -> str:
    """The input-bucket key of an uploaded dataset: `datasets/{file name}` unless given. `ids.InvalidId` for a key
    with `+`, `%` or a space (`ids.validate_dataset_key`)."""
    if key is None:
        key = f"datasets/{Path(path).name}"
    elif not key.startswith("datasets/"):
        key = f"datasets/{key.lstrip('/')}"
    return ids.validate_dataset_key(key)


def content_type(key: str) -> str:
    return "application/gzip" if key.endswith(".gz") else "application/json"


def new_lease_owner() -> str:
    return f"sdk-{uuid.uuid4().hex[:12]}"
