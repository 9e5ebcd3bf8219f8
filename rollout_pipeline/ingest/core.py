"""Dataset ingestion: a dataset object (or an SDK submission) becomes validated rollout messages, accounted in
the ledger.

Plain Python over the ports (`ObjectStore`, `MessageQueue`, `EventPublisher`) and the ledger (its `batches`);
`lambdas/ingest.py` only wires the adapters. One file is processed in chunks of rows:

1. read and validate the rows (`contracts.parse_row`); bad rows go to the errors log;
2. create the chunk's group items in one DynamoDB transaction of conditional puts: a conflicting id with the
   same line was written by an earlier attempt of this ingestion (resume: its messages are sent again, the
   dispatcher de-duplicates through the ledger); any other conflict is a duplicate id and rejects the row;
3. store claim checks for big payloads, hand the accepted groups to the feed (`feed.feed.Feed.submit`: their
   `group_size` rollout messages sent at once, or released in line order by the release window);
4. rewrite the errors object, then checkpoint the cursor and counters on the batch item (conditional on the
   previous cursor and our lease), which also reveals a cancellation.

When the Lambda runs low on time it checkpoints, gives up its lease and enqueues a continuation message on the
ingest queue. Every step is idempotent, so any redelivery or crash resumes from the last checkpoint.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from rollout_pipeline import ids, routing
from rollout_pipeline.config import HandlerSettings
from rollout_pipeline.contracts import (
    CLAIM_CHECK_BYTES,
    MAX_ROW_BYTES,
    DatasetRow,
    FileOptions,
    RowError,
    json_size,
    parse_row,
    utcnow,
)
from rollout_pipeline.details import batch_accepted_detail, batch_completion_detail
from rollout_pipeline.feed.feed import Feed, start_warnings
from rollout_pipeline.feed.messages import QueuedGroup
from rollout_pipeline.ingest.errors import ErrorLog
from rollout_pipeline.ingest.reader import DatasetFormatError, RawRecord, dataset_kind, read_records
from rollout_pipeline.ledger.batches import IngestProgress
from rollout_pipeline.ledger.groups import GroupSpec
from rollout_pipeline.ledger.items import BatchView
from rollout_pipeline.ledger.ledger import Ledger
from rollout_pipeline.metric_names import ROLLOUTS_ENQUEUED, ROWS_ACCEPTED, ROWS_REJECTED, SUBMITTED
from rollout_pipeline.ports import EventPublisher, MessageQueue, ObjectNotFound, ObjectStore
from rollout_pipeline.sqs_batch import BatchOutcome, SqsRecord, run_partial_batch
from rollout_pipeline.topology import FUNCTIONS

logger = logging.getLogger(__name__)

CONTINUE_KEY: Final = "continue"
NDJSON: Final = "application/x-ndjson"
#: Reason of the errors-object entry written when the file itself breaks off (truncated gzip, broken array).
INVALID_FILE_REASON: Final = "invalid_file"
#: Reason of a file rejected as a whole because of its metadata.
INVALID_METADATA_REASON: Final = "invalid_metadata"
#: Reason of a file rejected as a whole because its key has `+`, `%` or a space (`ids.validate_dataset_key`).
INVALID_KEY_REASON: Final = "invalid_key"
#: Reason of a file rejected as a whole because the uploaded object (version) no longer exists.
MISSING_OBJECT_REASON: Final = "missing_object"
DUPLICATE_ID_REASON: Final = "duplicate_id"
OVERSIZED_REASON: Final = "oversized"
#: Reason of a file rejected as a whole because it holds no row (empty, or only blank lines).
EMPTY_FILE_REASON: Final = "empty_file"
#: Blank lines read without a row in between before progress through them is checkpointed (and the time checked).
BLANK_LINES_PER_CHECKPOINT: Final = 10_000

Outcome = Literal["accepted", "rejected", "cancelled", "continued", "already_done", "in_progress", "ignored"]


class IngestMessageError(ValueError):
    """An ingest-queue message is neither an S3 Object Created event nor a continuation."""


@dataclass(frozen=True, slots=True)
class IngestTuning:
    """Knobs of the ingestion loop (defaults suit a Lambda with a 15-minute timeout)."""

    chunk_rows: int = 100
    #: The ingest function's timeout: a lease outlives the invocation that holds it, and no longer.
    lease_seconds: int = FUNCTIONS["ingest"].timeout_s
    #: Stop and continue in a new invocation when less than this is left.
    min_remaining_ms: int = 90_000
    max_error_entries: int = 1000
    read_chunk_bytes: int = 1 << 20


@dataclass(frozen=True)
class IngestPorts:
    """The collaborators of ingestion."""

    store: ObjectStore
    queue: MessageQueue
    publisher: EventPublisher
    ledger: Ledger
    settings: HandlerSettings
    #: Work into the rollout queue (`wiring.Wiring.feed`: one per process, shared with the lifecycle).
    feed: Feed


@dataclass(frozen=True, slots=True)
class DatasetObject:
    """The uploaded object an S3 event names."""

    bucket: str
    key: str
    version_id: str | None = None
    etag: str | None = None
    #: The key exactly as the S3 event carried it, when decoding changed it: tried once if `key` is not found.
    carried_key: str | None = None

    @property
    def batch_id(self) -> str:
        return ids.batch_id_for_upload(self.bucket, self.key, self.version_id, self.etag)

    @property
    def source(self) -> str:
        base = f"s3://{self.bucket}/{self.key}"
        return f"{base}?versionId={self.version_id}" if self.version_id else base

    def detail(self) -> dict[str, Any]:
        """The S3 event detail subset that identifies the object (carried by continuation messages)."""
        obj: dict[str, Any] = {"key": self.key}
        if self.version_id:
            obj["version-id"] = self.version_id
        if self.etag:
            obj["etag"] = self.etag
        return {"bucket": {"name": self.bucket}, "object": obj}


@dataclass(slots=True)
class IngestResult:
    """What one call did. Counters cover this invocation only; `progress` is the batch's total so far."""

    outcome: Outcome
    batch_id: str | None = None
    rows_accepted: int = 0
    rows_rejected: int = 0
    rollouts_enqueued: int = 0
    progress: IngestProgress = field(default_factory=IngestProgress)
    published: list[str] = field(default_factory=list)
    #: Rejected rows in detail (SDK submissions only: files get an errors object instead).
    errors: list[dict[str, Any]] = field(default_factory=list)
    #: Why some rollouts may wait too long for a session and fail `throttled` (also in `Batch Accepted`).
    warnings: list[str] = field(default_factory=list)


@dataclass
class IngestRecordsResult(BatchOutcome[IngestResult]):
    """What one SQS batch of ingest messages did: each message's `IngestResult`, and the failed ones (reported as
    `batchItemFailures`)."""

    def counts(self) -> dict[str, int]:
        """The invocation's metric counts (`metric_names`)."""
        done = list(self.outcomes.values())
        enqueued = sum(r.rollouts_enqueued for r in done)
        return {
            ROWS_ACCEPTED: sum(r.rows_accepted for r in done),
            ROWS_REJECTED: sum(r.rows_rejected for r in done),
            ROLLOUTS_ENQUEUED: enqueued,
            SUBMITTED: enqueued,
        }

    def summaries(self) -> BatchOutcome[str]:
        """Each message's batch and outcome, as the summary line shows them."""
        return BatchOutcome({mid: f"{r.batch_id}: {r.outcome}" for mid, r in self.outcomes.items()}, self.failures)


def parse_ingest_message(body: Mapping[str, Any]) -> DatasetObject:
    """The dataset object of an ingest-queue body: an EventBridge S3 "Object Created" event, or a continuation
    `{"continue": {"detail": <the same S3 detail>, ...}}`."""
    detail: Any
    encoded = False
    if CONTINUE_KEY in body:
        detail = (body.get(CONTINUE_KEY) or {}).get("detail")  # written by us: the key is already decoded
    elif body.get("source") == "aws.s3" and body.get("detail-type") == "Object Created":
        detail = body.get("detail")
        encoded = True
    else:
        raise IngestMessageError("not an S3 Object Created event nor an ingest continuation")
    try:
        bucket = str(detail["bucket"]["name"])
        obj = detail["object"]
        key = str(obj["key"])
    except (KeyError, TypeError):
        raise IngestMessageError("S3 event detail lacks bucket.name or object.key") from None
    carried_key = None
    if encoded:
        key, *others = routing.event_key_candidates(key)
        carried_key = others[0] if others else None
    # S3's EventBridge events spell it `etag`; moto spells it `eTag`. The SDK derives the same batch id from
    # PutObject's VersionId and ETag, so both spellings must be read.
    etag = obj.get("etag") or obj.get("eTag")
    return DatasetObject(bucket=bucket, key=key, version_id=obj.get("version-id"), etag=etag, carried_key=carried_key)


def continuation_body(obj: DatasetObject, batch_id: str, cursor: int) -> str:
    """Ingest-queue body that resumes an ingestion in a fresh invocation."""
    return json.dumps({CONTINUE_KEY: {"detail": obj.detail(), "batch_id": batch_id, "cursor": cursor}})


class Ingestion:
    """Ingests dataset objects and SDK submissions into one experiment."""

    def __init__(self, ports: IngestPorts, tuning: IngestTuning | None = None) -> None:
        self.ports = ports
        self.tuning = tuning or IngestTuning()
        self.settings = ports.settings
        self.exp_id = ports.settings.experiment.name
        self.feed = ports.feed

    # ----------------------------------------------------------------------------------------- entry points

    def handle_message(
        self, body: Mapping[str, Any], *, owner: str, remaining_ms: Callable[[], int] | None = None
    ) -> IngestResult:
        """Process one ingest-queue message body.

        `owner` owns the ingest lease: pass the SQS message id, so a redelivery of the same message (after a crash
        or timeout) takes its own lease back at once while duplicates of the S3 event (other messages) acknowledge.
        `remaining_ms` reports the invocation's time left (None: unlimited, never continue).
        """
        return self.ingest_object(parse_ingest_message(body), owner=owner, remaining_ms=remaining_ms)

    def handle_records(
        self,
        records: Sequence[SqsRecord],
        *,
        request_id: str = "",
        remaining_ms: Callable[[], int] | None = None,
    ) -> IngestRecordsResult:
        """Process an SQS batch of ingest-queue records (`messageId`, `body`), one after the other. Each message owns
        its ingest lease (a redelivery of this same message, after a crash or timeout, takes its own lease back at
        once; duplicates of the S3 event are other messages and acknowledge); `request_id` for a record without an
        id. A record that raises is a failure (redelivered)."""

        def one(record: SqsRecord) -> IngestResult:
            owner = str(record.get("messageId") or request_id)
            return self.handle_message(json.loads(record["body"]), owner=owner, remaining_ms=remaining_ms)

        result = IngestRecordsResult()
        run_partial_batch(records, one, result, what="ingest message")
        return result

    def ingest_object(
        self, obj: DatasetObject, *, owner: str, remaining_ms: Callable[[], int] | None = None
    ) -> IngestResult:
        """Ingest one uploaded dataset object, or resume / acknowledge an ingestion already under way or done."""
        if obj.bucket != self.settings.input_bucket:
            logger.info("ignoring object %s/%s: not a dataset of this experiment", obj.bucket, obj.key)
            return IngestResult("ignored")
        obj = self._found_key(obj)
        if not routing.is_dataset_key(obj.key):
            logger.info("ignoring object %s/%s: not a dataset of this experiment", obj.bucket, obj.key)
            return IngestResult("ignored")
        ledger = self.ports.ledger.batches
        batch_id = obj.batch_id
        item = ledger.read_batch(batch_id)
        if item is None:
            try:
                ids.validate_dataset_key(obj.key)
            except ids.InvalidId as exc:
                return self._reject_file(obj, batch_id, str(exc), reason=INVALID_KEY_REASON)
            try:
                info = self.ports.store.head(obj.bucket, obj.key, obj.version_id)
            except ObjectNotFound as exc:
                return self._reject_file(
                    obj, batch_id, f"{exc}: it was deleted before it could be ingested", reason=MISSING_OBJECT_REASON
                )
            try:
                options = FileOptions.from_metadata(self.settings.experiment, info.metadata)
            except ValueError as exc:
                return self._reject_file(obj, batch_id, str(exc))
            item = ledger.create_batch(
                exp_id=self.exp_id,
                batch_id=batch_id,
                options=options,
                source=obj.source,
                lease_owner=owner,
                lease_seconds=self.tuning.lease_seconds,
            )
            if item is not None:
                logger.info("batch %s created for %s", batch_id, obj.source)
                return self._run(obj, item, owner=owner, remaining_ms=remaining_ms)
            item = ledger.read_batch(batch_id)  # created concurrently by another worker
            assert item is not None
        if item.rollouts_total is not None:
            return self._republish(item, "already_done")
        acquired = ledger.acquire_lease(batch_id, owner, self.tuning.lease_seconds)
        if acquired is None:
            logger.info("batch %s is being ingested by another worker; acknowledging", batch_id)
            return IngestResult("in_progress", batch_id, progress=IngestProgress.of(item))
        logger.info("resuming batch %s after line %s", batch_id, acquired.cursor)
        return self._run(obj, acquired, owner=owner, remaining_ms=remaining_ms)

    def submit_rows(
        self,
        rows: Iterable[Mapping[str, Any] | DatasetRow],
        *,
        name: str = "sdk",
        options: FileOptions | None = None,
        owner: str = "sdk",
    ) -> IngestResult:
        """Submit in-memory rows (each a dataset row: payload plus optional `id` / `_rollout`) as a new batch.
        A `DatasetRow` (already validated by the SDK) is taken as it is, not parsed again.

        Same validation, ledger accounting, messages and events as a dataset file; positions are 1-based
        indexes into `rows`; rejected rows are counted in the result and `Batch Accepted` (no errors object).
        """
        return self.submit_once(ids.new_batch_id(name), rows, options=options, owner=owner)

    def submit_once(
        self,
        batch_id: str,
        rows: Iterable[Mapping[str, Any] | DatasetRow],
        *,
        options: FileOptions | None = None,
        source: str = "sdk",
        owner: str = "sdk",
    ) -> IngestResult:
        """`submit_rows` under a batch id the caller chose, once: a batch that already exists is never submitted
        again. Its ingestion ended -> `already_done` (nothing sent); another caller holds its lease ->
        `in_progress`; a caller that crashed mid-way (lease expired) -> taken over and finished (rows the batch
        checkpointed are skipped, a row whose group it wrote is sent again: the dispatcher de-duplicates)."""
        effective = options or FileOptions.defaults(self.settings.experiment)
        ledger = self.ports.ledger.batches
        item = ledger.create_batch(
            exp_id=self.exp_id,
            batch_id=batch_id,
            options=effective,
            source=source,
            lease_owner=owner,
            lease_seconds=self.tuning.lease_seconds,
        )
        if item is None:
            existing = ledger.read_batch(batch_id)
            if existing is None or existing.rollouts_total is not None:
                progress = IngestProgress.of(existing) if existing is not None else IngestProgress()
                return IngestResult("already_done", batch_id, progress=progress)
            item = ledger.acquire_lease(batch_id, owner, self.tuning.lease_seconds)
            if item is None:
                return IngestResult("in_progress", batch_id, progress=IngestProgress.of(existing))
            logger.info("batch %s: taking over a submission left after line %s", batch_id, item.cursor)
        run = _Run(self, item, owner=owner, errors=ErrorLog(file=source, max_entries=self.tuning.max_error_entries))
        for position, row in enumerate(rows, start=1):
            if position > run.progress.cursor:
                run.add(_parse(row, position))
        result = run.finish(errors_uri=None)
        result.errors = list(run.errors.entries)
        return result

    # ------------------------------------------------------------------------------------------------ steps

    def _found_key(self, obj: DatasetObject) -> DatasetObject:
        """The object under the key that exists: the decoded one, else (once) the key as the event carried it
        (whichever way S3's events encode keys); the decoded one when neither is found (it is then missing).
        The probes are best effort: an error other than "not found" on either leaves the decoded key, whose own
        reads then report it."""
        if obj.carried_key is None:
            return obj
        decoded = replace(obj, carried_key=None)
        carried = replace(obj, key=obj.carried_key, carried_key=None)
        try:  # with the event's version id: another object under the decoded key is not this upload
            self.ports.store.head(decoded.bucket, decoded.key, decoded.version_id)
            return decoded
        except Exception as exc:  # not found; or S3 refusing the version id of another key (400)
            logger.info("dataset key %r as decoded: %s", decoded.key, exc)
        try:
            self.ports.store.head(carried.bucket, carried.key, carried.version_id)
        except Exception:
            return decoded
        logger.info("dataset key %r not found; the key as the event carried it, %r, is", obj.key, carried.key)
        return carried

    def _reject_file(
        self, obj: DatasetObject, batch_id: str, error: str, *, reason: str = INVALID_METADATA_REASON
    ) -> IngestResult:
        message = f"file rejected: {error}"
        log = ErrorLog(file=obj.key, max_entries=1)
        log.add(None, reason, message)
        errors_key = ids.errors_key(obj.key)
        self.ports.store.put_bytes(obj.bucket, errors_key, log.render(final=True), content_type=NDJSON)
        item = self.ports.ledger.batches.create_rejected_batch(
            exp_id=self.exp_id,
            batch_id=batch_id,
            options=None,
            source=obj.source,
            error=message,
            errors_uri=f"s3://{obj.bucket}/{errors_key}",
            group_size=self.settings.experiment.group_size,
        )
        logger.warning("batch %s: %s", batch_id, message)
        return self._republish(item, "rejected")

    def _republish(self, item: BatchView, outcome: Outcome) -> IngestResult:
        """Publish `Batch Accepted` (and `Batch Completed` when complete) of a batch whose ingestion ended."""
        published = self.publish_batch_events(item)
        return IngestResult(
            outcome,
            item.batch_id,
            progress=IngestProgress.of(item),
            published=published,
            warnings=self.start_warnings(item),
        )

    def publish_batch_events(self, item: BatchView) -> list[str]:
        """Publish the end-of-ingestion events of a batch; return their detail types."""
        details: list[Any] = [batch_accepted_detail(item, self.start_warnings(item))]
        if batch_completion_detail(item) is not None:
            stamped = self.ports.ledger.batches.mark_completed(item.batch_id)
            details.append(batch_completion_detail(stamped))
        self.ports.publisher.publish(details)
        return [type(d).__name__ for d in details]

    def start_warnings(self, item: BatchView) -> list[str]:
        """Why rollouts of a batch whose ingestion ended may wait too long for a session
        (`feed.feed.start_warnings`)."""
        return list(start_warnings(self.settings.experiment, item.rollouts_total or 0))

    def _run(
        self, obj: DatasetObject, item: BatchView, *, owner: str, remaining_ms: Callable[[], int] | None
    ) -> IngestResult:
        store = self.ports.store
        progress = IngestProgress.of(item)
        errors_key = ids.errors_key(obj.key)
        log = ErrorLog(file=obj.key, max_entries=self.tuning.max_error_entries)
        if progress.errors_listed:
            body, _size = store.get_bytes(obj.bucket, errors_key, 16 * 1024 * 1024)
            log.restore(body, cursor=progress.cursor, total=progress.rows_rejected)
        else:
            log.total = progress.rows_rejected
        run = _Run(self, item, owner=owner, errors=log, errors_target=(obj.bucket, errors_key))
        errors_uri = f"s3://{obj.bucket}/{errors_key}"
        if item.cancelled:
            return run.finish(errors_uri=errors_uri)
        chunks = store.iter_bytes(obj.bucket, obj.key, obj.version_id, chunk_size=self.tuning.read_chunk_bytes)
        last_position = progress.cursor
        try:
            for record in read_records(chunks, dataset_kind(obj.key), blanks=True):
                last_position = record.position
                if record.position <= progress.cursor:
                    continue
                checkpointed = run.add_blank(record.position) if record.blank else run.add(_parse_record(record))
                if checkpointed:
                    if run.cancelled:
                        break
                    if self._time_is_short(remaining_ms):
                        return run.continue_later(obj)
        except DatasetFormatError as exc:
            run.flush()
            position = last_position + 1
            if position > run.progress.cursor:  # else a resumed run: this error was recorded already
                log.add(position, INVALID_FILE_REASON, f"file unreadable from here on: {exc}")
                run.note_file_error(position)
        if not run.cancelled and run.has_no_rows():
            return run.reject_empty(obj, errors_uri)
        return run.finish(errors_uri=errors_uri)

    def _time_is_short(self, remaining_ms: Callable[[], int] | None) -> bool:
        """True when the invocation should stop and continue in a new one (needs the ingest queue URL)."""
        if remaining_ms is None or not self.settings.ingest_queue_url:
            return False
        return remaining_ms() < self.tuning.min_remaining_ms


class _Run:
    """One ingestion pass over rows: buffers a chunk, writes it, checkpoints, finishes."""

    def __init__(
        self,
        ingestion: Ingestion,
        batch: BatchView,
        *,
        owner: str,
        errors: ErrorLog,
        errors_target: tuple[str, str] | None = None,
    ) -> None:
        self.ingestion = ingestion
        self.ports = ingestion.ports
        self.tuning = ingestion.tuning
        self.batch_id = batch.batch_id
        self.exp_id = batch.exp_id
        #: The batch as last written here (its status reveals a cancel; it carries no counters).
        self.view = batch
        options = batch.options
        assert options is not None, "an ingesting batch always has its options"
        self.options = options
        self.owner = owner
        self.errors = errors
        self.errors_target = errors_target
        self.progress = IngestProgress.of(batch)
        self.start = self.progress
        self.pending: list[DatasetRow | tuple[int, RowError]] = []
        #: Blank lines read since the last checkpoint, and the position of the last one.
        self.blanks = 0
        self.blank_cursor = 0
        self.cancelled = batch.cancelled
        #: The last chunk's submission left no pending group (`Feed.submit`).
        self.drained = False

    def add(self, parsed: DatasetRow | tuple[int, RowError]) -> bool:
        """Buffer one parsed row; write the chunk when full. True when a checkpoint was just taken."""
        self.pending.append(parsed)
        if len(self.pending) >= self.tuning.chunk_rows:
            self.flush()
            return True
        return False

    def add_blank(self, position: int) -> bool:
        """Count one blank line; checkpoint after many in a row (so a file of blank lines still makes progress
        that survives a redelivery, and the time budget is checked). True when a checkpoint was just taken."""
        self.blanks += 1
        self.blank_cursor = position
        if self.blanks >= BLANK_LINES_PER_CHECKPOINT:
            self.flush()
            return True
        return False

    def has_no_rows(self) -> bool:
        """True when the whole file (this run and earlier ones) held no record at all."""
        progress = self.progress
        return not self.pending and progress.rows_accepted == 0 and progress.rows_rejected == 0

    def flush(self) -> None:
        """Write the buffered rows (groups, claims, messages), then checkpoint."""
        if not self.pending and not self.blanks:
            return
        chunk, self.pending = self.pending, []
        accepted_rows, rejected_rows, enqueued = self._write_chunk(chunk) if chunk else (0, 0, 0)
        cursor = self.blank_cursor
        if chunk:
            last = chunk[-1]
            cursor = max(cursor, last.position if isinstance(last, DatasetRow) else last[0])
        self.blanks = 0
        self._checkpoint(
            IngestProgress(
                cursor=cursor,
                rows_accepted=self.progress.rows_accepted + accepted_rows,
                rows_rejected=self.progress.rows_rejected + rejected_rows,
                rollouts_enqueued=self.progress.rollouts_enqueued + enqueued,
                errors_listed=self.errors.listed,
            )
        )

    def note_file_error(self, position: int) -> None:
        """Account the entry of a file that broke off at `position` (one rejected record)."""
        self._checkpoint(
            IngestProgress(
                cursor=max(self.progress.cursor, position),
                rows_accepted=self.progress.rows_accepted,
                rows_rejected=self.progress.rows_rejected + 1,
                rollouts_enqueued=self.progress.rollouts_enqueued,
                errors_listed=self.errors.listed,
            )
        )

    def _groups_of(
        self, chunk: list[DatasetRow | tuple[int, RowError]]
    ) -> tuple[list[GroupSpec], dict[str, tuple[DatasetRow, bytes]], list[tuple[int, str, str]]]:
        """The chunk's rows as groups to write (payloads over the claim-check size by reference), each row's
        payload bytes by input id, and the rows rejected (line, reason, text)."""
        settings = self.ports.settings
        rejections: list[tuple[int, str, str]] = []
        groups: list[GroupSpec] = []
        payloads: dict[str, tuple[DatasetRow, bytes]] = {}
        target = self.options.group_size if self.options.oversample else None
        for parsed in chunk:
            if not isinstance(parsed, DatasetRow):
                position, error = parsed
                rejections.append((position, error.reason, str(error)))
                continue
            overrides_size = json_size(parsed.rollout_overrides)
            if overrides_size > CLAIM_CHECK_BYTES:
                rejections.append(
                    (
                        parsed.position,
                        OVERSIZED_REASON,
                        f"_rollout is {overrides_size} bytes; the limit is {CLAIM_CHECK_BYTES}",
                    )
                )
                continue
            payload_bytes = json.dumps(parsed.payload, ensure_ascii=False, separators=(",", ":")).encode()
            overrides_json = json.dumps(parsed.rollout_overrides, ensure_ascii=False, separators=(",", ":"))
            if len(payload_bytes) > CLAIM_CHECK_BYTES:
                ref = f"s3://{settings.input_bucket}/{ids.claim_key(self.batch_id, parsed.input_id)}"
                group = GroupSpec(
                    parsed.input_id, parsed.position, self.options.rollouts_per_group, None, ref, overrides_json, target
                )
            else:
                group = GroupSpec(
                    parsed.input_id,
                    parsed.position,
                    self.options.rollouts_per_group,
                    payload_bytes.decode(),
                    None,
                    overrides_json,
                    target,
                )
            groups.append(group)
            payloads.setdefault(parsed.input_id, (parsed, payload_bytes))
        return groups, payloads, rejections

    def _write_chunk(self, chunk: list[DatasetRow | tuple[int, RowError]]) -> tuple[int, int, int]:
        settings = self.ports.settings
        groups, payloads, rejections = self._groups_of(chunk)
        written = self.ports.ledger.groups.create_groups(exp_id=self.exp_id, batch_id=self.batch_id, groups=groups)
        for group, holder_line in written.duplicates:
            rejections.append(
                (group.line, DUPLICATE_ID_REASON, f"id {group.input_id!r} is already used by line {holder_line}")
            )
        for line, reason, text in sorted(rejections, key=lambda rejection: rejection[0]):
            self.errors.add(line, reason, text)
        submitted_at = self.view.created_at or utcnow()
        queued: list[QueuedGroup] = []
        for group in written.accepted:
            row, payload_bytes = payloads[group.input_id]
            if group.payload_ref is not None:
                self.ports.store.put_bytes(
                    settings.input_bucket, ids.claim_key(self.batch_id, group.input_id), payload_bytes
                )
            queued.append(
                QueuedGroup(
                    exp_id=self.exp_id,
                    batch_id=self.batch_id,
                    input_id=group.input_id,
                    line=group.line,
                    group_size=group.group_size,
                    submitted_at=submitted_at,
                    payload=row.payload if group.payload_ref is None else None,
                    payload_ref=group.payload_ref,
                    overrides=row.rollout_overrides,
                )
            )
        if not queued:
            return 0, len(rejections), 0
        submitted = self.ingestion.feed.submit(self.view, queued)
        self.drained = submitted.drained
        return len(queued), len(rejections), submitted.rollouts

    def _checkpoint(self, progress: IngestProgress, *, give_up_lease: bool = False) -> None:
        if self.errors_target is not None and self.errors.dirty:
            bucket, key = self.errors_target
            self.ports.store.put_bytes(bucket, key, self.errors.render(final=False), content_type=NDJSON)
            self.errors.dirty = False
        item = self.ports.ledger.batches.checkpoint(
            self.batch_id,
            owner=self.owner,
            previous_cursor=self.progress.cursor,
            progress=progress,
            lease_seconds=self.tuning.lease_seconds,
            give_up_lease=give_up_lease,
        )
        self.progress = progress
        self.view = item
        if item.cancelled and not self.cancelled:
            logger.info("batch %s was cancelled: stopping ingestion at line %s", self.batch_id, progress.cursor)
            self.cancelled = True

    def continue_later(self, obj: DatasetObject) -> IngestResult:
        """Give up the lease at the last checkpoint and enqueue a continuation on the ingest queue."""
        self._checkpoint(self.progress, give_up_lease=True)
        body = continuation_body(obj, self.batch_id, self.progress.cursor)
        self.ports.queue.send_all(self.ports.settings.ingest_queue_url, [body])
        logger.info("batch %s: time is short, continuing after line %s", self.batch_id, self.progress.cursor)
        return self._result("continued")

    def reject_empty(self, obj: DatasetObject, errors_uri: str) -> IngestResult:
        """Reject a file without any row as a whole: errors object, batch `rejected`, events published."""
        message = "file rejected: it holds no rows (it is empty or has only blank lines)"
        self.errors.add(None, EMPTY_FILE_REASON, message)
        if self.errors_target is not None:
            bucket, key = self.errors_target
            self.ports.store.put_bytes(bucket, key, self.errors.render(final=True), content_type=NDJSON)
        item = self.ports.ledger.batches.reject_ingesting(
            self.batch_id, owner=self.owner, previous_cursor=self.progress.cursor, error=message, errors_uri=errors_uri
        )
        logger.warning("batch %s (%s): %s", self.batch_id, obj.source, message)
        result = self._result("rejected")
        result.published = self.ingestion.publish_batch_events(item)
        return result

    def finish(self, *, errors_uri: str | None) -> IngestResult:
        """Flush, write the final errors object, mark the batch accepted (or keep it cancelled), publish.

        `errors_uri` is recorded only when the errors log has entries after the last flush."""
        if not self.cancelled:
            self.flush()
        if not self.errors.total:
            errors_uri = None
        if self.errors_target is not None and (self.errors.dirty or self.errors.total > self.errors.listed):
            bucket, key = self.errors_target
            self.ports.store.put_bytes(bucket, key, self.errors.render(final=True), content_type=NDJSON)
            self.errors.dirty = False
        item = self.ports.ledger.batches.finish_ingest(
            self.batch_id,
            owner=self.owner,
            previous_cursor=self.progress.cursor,
            progress=self.progress,
            errors_uri=errors_uri,
        )
        # The submission at the end gives the window the batch's total and releases what a chunk left pending; when
        # the chunks left nothing pending, the next release (a terminal rollout's, or the sweep's) learns the total.
        if not item.cancelled and not self.drained:
            self.ingestion.feed.submit(item)
        published = self.ingestion.publish_batch_events(item)
        outcome: Outcome = "cancelled" if item.cancelled else "accepted"
        logger.info(
            "batch %s %s: %d rows accepted, %d rejected, %d rollouts enqueued",
            self.batch_id,
            outcome,
            self.progress.rows_accepted,
            self.progress.rows_rejected,
            self.progress.rollouts_enqueued,
        )
        result = self._result(outcome)
        result.published = published
        result.warnings = self.ingestion.start_warnings(item)
        for warning in result.warnings:
            logger.warning("batch %s: %s", self.batch_id, warning)
        return result

    def _result(self, outcome: Outcome) -> IngestResult:
        return IngestResult(
            outcome,
            self.batch_id,
            rows_accepted=self.progress.rows_accepted - self.start.rows_accepted,
            rows_rejected=self.progress.rows_rejected - self.start.rows_rejected,
            rollouts_enqueued=self.progress.rollouts_enqueued - self.start.rollouts_enqueued,
            progress=self.progress,
        )


def _parse_record(record: RawRecord) -> DatasetRow | tuple[int, RowError]:
    if record.oversized:
        return record.position, RowError(
            OVERSIZED_REASON, f"row is {record.oversized_bytes} bytes; the limit is {MAX_ROW_BYTES}"
        )
    return _parse(record.text, record.position)


def _parse(raw: bytes | str | Mapping[str, Any] | DatasetRow, position: int) -> DatasetRow | tuple[int, RowError]:
    if isinstance(raw, DatasetRow):
        return raw
    try:
        return parse_row(raw, position)
    except RowError as exc:
        return position, exc
