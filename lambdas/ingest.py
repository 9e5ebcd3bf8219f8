"""Ingest Lambda: S3 dataset "Object Created" events (via the ingest SQS queue) -> rollout messages + ledger."""

from __future__ import annotations

import json
from typing import Any

from lambdas.glue import PipelineFunction, RunResult, records
from rollout_pipeline.ingest.core import Ingestion, IngestResult
from rollout_pipeline.metric_names import SUBMITTED
from rollout_pipeline.sqs_batch import BatchOutcome, SqsRecord, run_partial_batch
from rollout_pipeline.wiring import Wiring


def run(ingestion: Ingestion, event: dict[str, Any], context: Any) -> RunResult:
    def one(record: SqsRecord) -> IngestResult:
        # The lease owner is the message: a redelivery of this same message (after a crash or timeout) takes its
        # own lease back at once; duplicates of the S3 event are other messages and ack.
        owner = str(record.get("messageId") or getattr(context, "aws_request_id", ""))
        remaining_ms = getattr(context, "get_remaining_time_in_millis", None)
        return ingestion.handle_message(json.loads(record["body"]), owner=owner, remaining_ms=remaining_ms)

    batch = records(event)
    result: BatchOutcome[IngestResult] = BatchOutcome()
    run_partial_batch(batch, one, result, what="ingest message")
    done = list(result.outcomes.values())
    enqueued = sum(r.rollouts_enqueued for r in done)
    counts = {
        "RowsAccepted": sum(r.rows_accepted for r in done),
        "RowsRejected": sum(r.rows_rejected for r in done),
        "RolloutsEnqueued": enqueued,
        SUBMITTED: enqueued,
    }
    described = BatchOutcome({mid: f"{r.batch_id}: {r.outcome}" for mid, r in result.outcomes.items()}, result.failures)
    return RunResult.of_batch("ingested batch", len(batch), described, **counts)


function = PipelineFunction("ingest", Wiring.ingestion, run, experiment=lambda ingestion: ingestion.exp_id)
handler = function.handler
