"""Dataset ingestion: streaming reader (`reader`), errors object (`errors`) and the ingestion logic (`core`).

Entry points: `Ingestion(ports).handle_message(body, owner=..., remaining_ms=...)` for an ingest-queue message,
`Ingestion(ports).submit_rows(rows)` for an in-memory (SDK) submission.
"""

from rollout_pipeline.ingest.core import (
    DatasetObject,
    Ingestion,
    IngestPorts,
    IngestResult,
    IngestTuning,
    continuation_body,
    parse_ingest_message,
)

__all__ = [
    "DatasetObject",
    "IngestPorts",
    "IngestResult",
    "IngestTuning",
    "Ingestion",
    "continuation_body",
    "parse_ingest_message",
]
