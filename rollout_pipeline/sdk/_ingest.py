"""In-memory submissions through the ingestion stage's ledger API (`ledger.batches.BatchLedger`).

The same steps as ingesting a file, minus the file: create the batch (status `ingesting`, with the ingest lease),
create the group items, send the rollout messages, end the ingestion (`rollouts_total`, status `accepted`) and
publish `Batch Accepted`. Payloads bigger than `CLAIM_CHECK_BYTES` travel by reference (claim check in the input
bucket), as ingestion does. A crash before the end leaves the batch `ingesting`, so it never completes half-sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rollout_pipeline import ids
from rollout_pipeline.adapters.eventbridge import EventBridgePublisher
from rollout_pipeline.adapters.s3 import S3ObjectStore
from rollout_pipeline.adapters.sqs import SqsQueue
from rollout_pipeline.contracts import DatasetRow, FileOptions
from rollout_pipeline.ledger.batches import GroupSpec, IngestProgress, batch_accepted_detail
from rollout_pipeline.sdk.submission import new_lease_owner, payload_json, rollout_messages

if TYPE_CHECKING:
    from rollout_pipeline.sdk.experiment import Experiment

SDK_SOURCE = "sdk"
LEASE_SECONDS = 900


def store_claim(store: S3ObjectStore, bucket: str, batch_id: str, input_id: str, text: str) -> str:
    """Store a big payload in the input bucket; return its `s3://` reference."""
    key = ids.claim_key(batch_id, input_id)
    store.put_bytes(bucket, key, text.encode())
    return f"s3://{bucket}/{key}"


def submit_rows(experiment: Experiment, *, batch_id: str, rows: Sequence[DatasetRow], options: FileOptions) -> Any:
    """Create the batch and its groups, enqueue every rollout, accept the batch; return the batch item."""
    from rollout_pipeline.contracts import CLAIM_CHECK_BYTES

    ledger = experiment._ledger()
    owner = new_lease_owner()
    if (
        ledger.create_batch(
            exp_id=experiment.name,
            batch_id=batch_id,
            options=options,
            source=SDK_SOURCE,
            lease_owner=owner,
            lease_seconds=LEASE_SECONDS,
        )
        is None
    ):
        raise RuntimeError(f"batch {batch_id} already exists")
    store = S3ObjectStore(experiment.client("s3"))
    specs: list[GroupSpec] = []
    for row in rows:
        text = payload_json(row.payload)
        big = len(text.encode()) > CLAIM_CHECK_BYTES
        specs.append(
            GroupSpec(
                input_id=row.input_id,
                line=row.position,
                group_size=options.group_size,
                payload_json=None if big else text,
                payload_ref=store_claim(store, experiment.input_bucket, batch_id, row.input_id, text) if big else None,
                overrides_json=payload_json(row.rollout_overrides),
            )
        )
    written = ledger.create_groups(exp_id=experiment.name, batch_id=batch_id, groups=specs)
    if written.duplicates:  # validate_payloads rejects duplicates first; this is a safety net
        group, line = written.duplicates[0]
        raise RuntimeError(f"duplicate id {group.input_id!r} (also on #{line - 1})")
    by_id = {row.input_id: row for row in rows}
    bodies: list[str] = []
    for spec in written.accepted:
        row = by_id[spec.input_id]
        bodies.extend(
            rollout_messages(
                exp_id=experiment.name,
                batch_id=batch_id,
                input_id=spec.input_id,
                group_size=spec.group_size,
                payload=None if spec.payload_ref else row.payload,
                payload_ref=spec.payload_ref,
                overrides=row.rollout_overrides,
            )
        )
    SqsQueue(experiment.client("sqs")).send_all(experiment.rollout_queue_url, bodies)
    progress = IngestProgress(
        cursor=len(rows),
        rows_accepted=len(written.accepted),
        rows_rejected=0,
        rollouts_enqueued=len(bodies),
    )
    item = ledger.finish_ingest(batch_id, owner=owner, previous_cursor=0, progress=progress, errors_uri=None)
    EventBridgePublisher(experiment.bus_name, experiment.client("events")).publish([batch_accepted_detail(item)])
    return item
