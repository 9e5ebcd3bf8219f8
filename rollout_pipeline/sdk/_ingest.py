"""In-memory submissions through the ingestion stage (`ingest.core.Ingestion.submit_rows`): the same validation,
ledger accounting (batch + group items), claim checks, rollout messages and `Batch Accepted` as a dataset file.
The SDK only wires the experiment's own boto3 clients (its session, region and endpoint) into the ports."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rollout_pipeline.contracts import DatasetRow, FileOptions

if TYPE_CHECKING:
    from rollout_pipeline.ingest.core import IngestResult
    from rollout_pipeline.sdk.experiment import Experiment


def submit_rows(
    experiment: Experiment,
    *,
    rows: Sequence[Mapping[str, Any] | DatasetRow],
    options: FileOptions,
    name: str,
    owner: str,
) -> IngestResult:
    """Submit rows as a new batch; return ingestion's result (its `batch_id`, counts and row errors)."""
    from rollout_pipeline.adapters.eventbridge import EventBridgePublisher
    from rollout_pipeline.adapters.s3 import S3ObjectStore
    from rollout_pipeline.adapters.sqs import SqsQueue
    from rollout_pipeline.ingest.core import Ingestion, IngestPorts

    ports = IngestPorts(
        store=S3ObjectStore(experiment.client("s3")),
        queue=SqsQueue(experiment.client("sqs")),
        publisher=EventBridgePublisher(experiment.bus_name, experiment.client("events")),
        ledger=experiment._ledger(),
        settings=experiment.settings(),
    )
    return Ingestion(ports).submit_rows(rows, name=name, options=options, owner=owner)
