"""Export batches' results from the ledger (authoritative, complete) plus the result objects: as JSON Lines
(`export_rows`, `write_jsonl`) or as the rollout dataset in Parquet (`write_dataset`: schema `sdk.dataset`, files
`sdk.parquet`).

Why the ledger and not consumed events: events are handed to whichever consumer took them (and only once), while
the ledger holds every rollout's terminal state until its TTL (`ledger_ttl_days`), so an export is complete and
repeatable from any machine. One row per rollout, groups in input-id order, indices ascending. Each batch is read as
two sorted Queries joined as they stream (`dataset.join_groups`): memory holds one group and one Parquet row group,
whatever the number of batches or rollouts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

from rollout_pipeline import ids
from rollout_pipeline.contracts import iso
from rollout_pipeline.costs import PriceBook
from rollout_pipeline.ledger.items import GroupItem, RolloutRecord
from rollout_pipeline.sdk._aws import aws_errors
from rollout_pipeline.sdk.dataset import (
    DatasetExport,
    FetchResult,
    Row,
    RowFilter,
    group_rows,
    join_groups,
    result_field_columns,
    schema_columns,
)
from rollout_pipeline.sdk.errors import BatchNotFound, SdkError

if TYPE_CHECKING:
    from rollout_pipeline.ledger.ledger import Ledger
    from rollout_pipeline.sdk.handle import ExperimentHandle
    from rollout_pipeline.sdk.rescore import Rescorer

logger = logging.getLogger(__name__)

#: Result objects read at once (S3 GETs in threads) ...
FETCH_WORKERS: Final = 8
#: ... for chunks of about this many rollouts (whole groups).
FETCH_CHUNK_ROLLOUTS: Final = 64


def rollout_fields(rec: RolloutRecord | None, prices: PriceBook | None = None) -> dict[str, Any]:
    """What an export line carries of a rollout item (bookkeeping such as outbox and index keys is left out); a
    rollout without an item was never dispatched: `queued`. `cost`: what its event said it cost (with `prices`)."""

    def at(value: datetime | None) -> str | None:
        return iso(value) if value is not None else None

    if rec is None:
        return dict.fromkeys(ROLLOUT_FIELDS) | {"state": "queued"}
    return {
        "state": rec.state.value,
        "attempt": rec.attempt,
        "session_id": rec.session_id,
        "reward": rec.reward,
        "reason": rec.reason,
        "error": rec.error,
        "warning": rec.warning,
        "result_uri": rec.result_uri,
        "submitted_at": at(rec.submitted_at),
        "dispatched_at": at(rec.dispatched_at),
        "finished_at": at(rec.finished_at),
        "session_warmed_at": None
        if rec.session_warmed_at is None
        else at(datetime.fromtimestamp(rec.session_warmed_at, UTC)),
        "cost": _cost(rec, prices),
    }


#: The rollout fields of an export line, in order.
ROLLOUT_FIELDS = (
    "state",
    "attempt",
    "session_id",
    "reward",
    "reason",
    "error",
    "warning",
    "result_uri",
    "submitted_at",
    "dispatched_at",
    "finished_at",
    "session_warmed_at",
    "cost",
)


def _cost(rec: RolloutRecord, prices: PriceBook | None) -> dict[str, Any] | None:
    cost = None if prices is None else rec.stored_cost(prices.label, local=prices.local)
    return None if cost is None else cost.model_dump()


def export_rows(
    *,
    groups: Iterable[GroupItem],
    rollouts: Iterable[RolloutRecord],
    prices: PriceBook | None = None,
    fetch_result: FetchResult | None,
    include_payload: bool = False,
) -> Iterator[dict[str, Any]]:
    """Join groups and rollout items into export rows.

    A rollout without a rollout item was never dispatched: its state is `queued`. With `fetch_result`, each row
    with a `result_uri` gets the result object under `result` (None if it cannot be read).
    """
    for group, members in join_groups(groups, rollouts):
        for index in range(group.group_size):
            row: dict[str, Any] = {
                "exp_id": group.exp_id,
                "batch_id": group.batch_id,
                "input_id": group.input_id,
                "index": index,
                "rollout_id": ids.rollout_id(group.input_id, index),
                "line": group.line,
            }
            row.update(rollout_fields(members.get(index), prices))
            if include_payload:
                row["payload"] = dict(group.payload) if group.payload is not None else None
                if group.payload_ref:
                    row["payload_ref"] = group.payload_ref
            if fetch_result is not None:
                uri = row.get("result_uri")
                row["result"] = fetch_result(str(uri)) if uri else None
            yield row


def write_jsonl(rows: Iterator[dict[str, Any]], out: IO[str]) -> int:
    """Write rows as JSON Lines; return how many."""
    count = 0
    for row in rows:
        out.write(json.dumps(row, ensure_ascii=False, separators=(",", ":"), default=str))
        out.write("\n")
        count += 1
    return count


# ---------------------------------------------------------------------------------------------- the dataset

#: One group as read: its rows (schema `dataset.COLUMNS`) and its result objects by index (None: none or unreadable).
GroupRead = tuple[list[Row], dict[int, Mapping[str, Any] | None]]
#: What re-scoring does to a group before it is filtered and written (`sdk.rescore`).
GroupTransform = Callable[[list[Row], Mapping[int, Mapping[str, Any] | None]], list[Row]]


def _chunks(
    joined: Iterator[tuple[GroupItem, dict[int, RolloutRecord]]], rollouts: int
) -> Iterator[list[tuple[GroupItem, dict[int, RolloutRecord]]]]:
    chunk: list[tuple[GroupItem, dict[int, RolloutRecord]]] = []
    size = 0
    for group, members in joined:
        chunk.append((group, members))
        size += max(1, group.group_size)
        if size >= rollouts:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def batch_groups(
    ledger: Ledger,
    batch_id: str,
    *,
    fetch: FetchResult | None,
    result_fields: Sequence[str] = (),
    workers: int = FETCH_WORKERS,
    chunk_rollouts: int = FETCH_CHUNK_ROLLOUTS,
    prices: PriceBook | None = None,
) -> Iterator[GroupRead]:
    """Each group of a batch as dataset rows, in input-id order, with its result objects read `workers` at a time
    (`fetch`; None: no result columns), a chunk of about `chunk_rollouts` rollouts ahead at most."""
    joined = join_groups(ledger.groups.batch_groups(batch_id), ledger.rollouts.batch_rollouts(batch_id))
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="export") as pool:
        for chunk in _chunks(joined, chunk_rollouts):
            wanted = [
                ((group.input_id, index), rec.result_uri)
                for group, members in chunk
                for index, rec in members.items()
                if rec.result_uri
            ]
            read: dict[tuple[str, int], Mapping[str, Any] | None] = {}
            if fetch is not None and wanted:
                read = dict(zip((key for key, _ in wanted), pool.map(fetch, [uri for _, uri in wanted]), strict=True))
            for group, members in chunk:
                results = {
                    index: read.get((group.input_id, index)) for index in range(group.group_size) if index in members
                }
                rows = group_rows(group, members, results=results, result_fields=result_fields, prices=prices)
                yield rows, results


def write_dataset(
    ledger: Ledger,
    *,
    exp_id: str,
    batch_ids: Sequence[str],
    directory: str | os.PathLike[str],
    fetch: FetchResult | None,
    row_filter: RowFilter | None = None,
    result_fields: Sequence[str] = (),
    overwrite: bool = False,
    transform: GroupTransform | None = None,
    rescored_with: str | None = None,
    row_group_rows: int | None = None,
    row_group_bytes: int | None = None,
    chunk_rollouts: int = FETCH_CHUNK_ROLLOUTS,
    prices: PriceBook | None = None,
) -> DatasetExport:
    """Write the rollout dataset of `batch_ids` to `directory`: `data/{batch}.parquet` each (row groups written as
    the rows are read) and the dataset card `README.md`. `transform` (re-scoring) rewrites each group's rows before
    `row_filter` applies. `row_group_rows`/`row_group_bytes` (default: `parquet.ROW_GROUP_ROWS`/`ROW_GROUP_BYTES`) and
    `chunk_rollouts` (results read ahead) bound the memory. The cost columns are priced with `prices` (None: null).
    Returns what was written. An export that fails leaves nothing of its own behind (its files, and the directories
    it made), so running it again needs no `overwrite`."""
    from rollout_pipeline.sdk import parquet

    target = Path(directory)
    made = [path for path in (target, target / parquet.DATA_DIR) if not path.exists()]
    data = parquet.prepare_directory(target, overwrite=overwrite)
    row_filter = row_filter or RowFilter()
    columns = schema_columns(result_fields=result_fields, rescored=transform is not None)
    sizes: dict[str, int] = {}
    if row_group_rows is not None:
        sizes["row_group_rows"] = row_group_rows
    if row_group_bytes is not None:
        sizes["row_group_bytes"] = row_group_bytes
    export = DatasetExport(directory=str(target))
    summaries: list[parquet.FileSummary] = []
    try:
        for batch_id in batch_ids:
            metadata = parquet.file_metadata(
                exp_id, batch_id, filters=row_filter.describe(), rescored_with=rescored_with
            )
            writer = parquet.ParquetFileWriter(
                data / f"{batch_id}.parquet", columns, metadata, batch_id=batch_id, **sizes
            )
            try:
                read = batch_groups(
                    ledger,
                    batch_id,
                    fetch=fetch,
                    result_fields=result_fields,
                    chunk_rollouts=chunk_rollouts,
                    prices=prices,
                )
                for rows, results in read:
                    writer.add(row_filter.keep(transform(rows, results) if transform is not None else rows))
            except BaseException:
                writer.abort()
                raise
            summary = writer.close()
            summaries.append(summary)
            export.files.append(summary.path)
            export.rows += summary.rows
            export.rows_by_batch[batch_id] = summary.rows
        card = parquet.dataset_card(
            exp_id=exp_id,
            files=summaries,
            columns=columns,
            filters=row_filter.describe(),
            rescored_with=rescored_with,
            directory=target,
        )
        (target / parquet.CARD).write_text(card, encoding="utf-8")
    except BaseException:
        _remove_written(export.files, made)
        raise
    return export


def _remove_written(files: Sequence[str], made: Sequence[Path]) -> None:
    """What a failed export wrote: its files, then the directories it made (innermost first) when left empty."""
    for name in files:
        Path(name).unlink(missing_ok=True)
    for directory in reversed(made):
        with contextlib.suppress(OSError):  # not empty: something else is in it
            directory.rmdir()


# ------------------------------------------------------------------------------------------ from an experiment


def quiet_fetch(experiment: ExperimentHandle) -> FetchResult:
    """`experiment.fetch_result`, with None (and a warning) for a result object that cannot be read."""

    def fetch(uri: str) -> Mapping[str, Any] | None:
        try:
            return experiment.fetch_result(uri)
        except (SdkError, ValueError) as exc:
            logger.warning("cannot read %s: %s", uri, exc)
            return None

    return fetch


def quiet_payload(experiment: ExperimentHandle) -> Callable[[str], Any]:
    """Reads a payload stored aside (`payload_ref`, a claim check of at most `MAX_ROW_BYTES`): the parsed object, or
    None (and a warning) when it cannot be read."""
    from rollout_pipeline.adapters.s3 import S3ObjectStore
    from rollout_pipeline.contracts import MAX_ROW_BYTES

    store = S3ObjectStore(experiment.client("s3"))

    def load(uri: str) -> Any:
        try:
            bucket, key = ids.parse_s3_uri(uri)
            with aws_errors(f"read {uri}"):
                body, size = store.get_bytes(bucket, key, MAX_ROW_BYTES)
            if size > MAX_ROW_BYTES:
                raise ValueError(f"larger than {MAX_ROW_BYTES} bytes")
            return json.loads(body)
        except (SdkError, ValueError, ids.InvalidId, LookupError) as exc:
            logger.warning("cannot read the payload %s: %s", uri, exc)
            return None

    return load


def resolve_batches(experiment: ExperimentHandle, batch_id: str | Iterable[str] | None) -> list[str]:
    """The batches one export covers: those named (each must exist: `BatchNotFound`), or every batch of the
    experiment (None: the ledger's batch listing, one Query of its index), oldest first."""
    ledger = experiment.wiring().ledger()
    with aws_errors("read the experiment's batches"):
        if batch_id is None:
            views = [view for b in ledger.batches.batch_ids() if (view := ledger.batches.read_batch(b)) is not None]
            if not views:
                raise SdkError(f"experiment {experiment.name!r} has no batch to export")
            oldest = min((v.created_at for v in views if v.created_at is not None), default=None)
            views.sort(key=lambda v: (v.created_at or oldest or datetime.min, v.batch_id))
            return [view.batch_id for view in views]
        named = [batch_id] if isinstance(batch_id, str) else list(dict.fromkeys(batch_id))
        if not named:
            raise SdkError("no batch given")
        for name in named:
            if ledger.batches.read_batch(name) is None:
                raise BatchNotFound(f"no batch {name!r} in experiment {experiment.name!r}")
        return named


def export_dataset(
    experiment: ExperimentHandle,
    batch_id: str | Iterable[str] | None,
    directory: str | os.PathLike[str],
    *,
    include_results: bool = True,
    row_filter: RowFilter | None = None,
    result_fields: Sequence[str] = (),
    overwrite: bool = False,
    rescorer: Rescorer | None = None,
    rescored_with: str | None = None,
) -> DatasetExport:
    """`exp.data.export_dataset` and `exp.data.rescore`: the batches' dataset written to `directory`."""
    try:
        result_field_columns(result_fields)
    except ValueError as exc:
        raise SdkError(str(exc)) from None
    batches = resolve_batches(experiment, batch_id)
    with aws_errors(f"export {len(batches)} batch(es) of experiment {experiment.name}"):
        export = write_dataset(
            experiment.wiring().ledger(),
            exp_id=experiment.name,
            batch_ids=batches,
            directory=directory,
            fetch=quiet_fetch(experiment) if include_results or rescorer is not None else None,
            row_filter=row_filter,
            result_fields=result_fields,
            overwrite=overwrite,
            transform=rescorer,
            rescored_with=rescored_with,
            prices=experiment.price_book(),
        )
    if rescorer is not None:
        export.rescored, export.failed, export.errors = rescorer.rescored, rescorer.failed, dict(rescorer.errors)
    return export
