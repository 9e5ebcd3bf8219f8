"""Ingest Lambda: S3 dataset "Object Created" events (via the ingest SQS queue) -> rollout messages + ledger."""

from __future__ import annotations

from typing import Any

from lambdas.glue import PipelineFunction, RunResult, records
from rollout_pipeline.ingest.core import Ingestion
from rollout_pipeline.wiring import Wiring


def run(ingestion: Ingestion, event: dict[str, Any], context: Any) -> RunResult:
    batch = records(event)
    remaining_ms = getattr(context, "get_remaining_time_in_millis", None)
    result = ingestion.handle_records(
        batch, request_id=getattr(context, "aws_request_id", ""), remaining_ms=remaining_ms
    )
    return RunResult.of_batch("ingested batch", len(batch), result.summaries(), **result.counts())


function = PipelineFunction("ingest", Wiring.ingestion, run, experiment=lambda ingestion: ingestion.exp_id)
handler = function.handler
