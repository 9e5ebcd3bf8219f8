"""Bad input a new user would try: rejected rows in the last partial chunk, empty and blank-only uploads, files of
blank lines that must still make checkpointed progress."""

from __future__ import annotations

import gzip

import pytest

from rollout_pipeline.ingest.core import BLANK_LINES_PER_CHECKPOINT
from rollout_pipeline.local.resources import ExperimentResources
from tests.conftest import receive_all
from tests.integration.feed.test_ingest import (
    batch_id_of,
    batch_item,
    errors_object,
    jsonl,
    make_ingestion,
    trainer_events,
    upload,
)

CHUNK = 3


@pytest.mark.parametrize(("rows", "bad"), [(5, 5), (6, 6), (7, 7), (7, 6), (4, 1), (3, 3), (1, 1), (6, 3)])
def test_the_errors_uri_is_reported_wherever_the_rejected_rows_fall(
    resources: ExperimentResources, rows: int, bad: int
) -> None:
    lines = [b'{"id": "r%d"}' % i if i != bad else b"not json" for i in range(1, rows + 1)]
    key = f"datasets/bad-{rows}-{bad}.jsonl"
    event = upload(resources, key, b"\n".join(lines) + b"\n")
    result = make_ingestion(resources, chunk_rows=CHUNK).handle_message(event, owner="m")

    uri = f"s3://{resources.input_bucket}/{key}.errors.ndjson"
    accepted = [e for e in trainer_events(resources) if e["detail-type"] == "Batch Accepted"]
    assert accepted[0]["detail"]["errors_uri"] == uri
    assert batch_item(resources, result.batch_id or "")["errors_uri"] == uri
    assert [e["line"] for e in errors_object(resources, key)] == [bad]


def test_a_file_without_errors_has_no_errors_uri(resources: ExperimentResources) -> None:
    event = upload(resources, "datasets/good.jsonl", jsonl([{"id": f"g{i}"} for i in range(4)]))
    make_ingestion(resources, chunk_rows=CHUNK).handle_message(event, owner="m")
    accepted = [e for e in trainer_events(resources) if e["detail-type"] == "Batch Accepted"]
    assert accepted[0]["detail"]["errors_uri"] is None


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("empty.jsonl", b""),
        ("blank.jsonl", b"\n  \n\r\n\t\n"),
        ("blank.jsonl.gz", gzip.compress(b"\n" * 50, mtime=0)),
        ("empty.json", b"[]"),
    ],
    ids=["empty.jsonl", "blank.jsonl", "blank.jsonl.gz", "empty.json"],  # the same on every xdist worker
)
def test_an_upload_without_rows_is_rejected_as_a_whole(resources: ExperimentResources, name: str, body: bytes) -> None:
    event = upload(resources, f"datasets/{name}", body)
    result = make_ingestion(resources).handle_message(event, owner="m")

    assert result.outcome == "rejected"
    batch = batch_item(resources, batch_id_of(event))
    assert batch["status"] == "rejected"
    assert "holds no rows" in batch["error"]
    assert [(e["line"], e["reason"]) for e in errors_object(resources, f"datasets/{name}")] == [(None, "empty_file")]
    events = trainer_events(resources)
    assert [e["detail-type"] for e in events] == ["Batch Accepted", "Batch Completed"]
    assert "holds no rows" in events[0]["detail"]["error"]
    assert events[0]["detail"]["errors_uri"]


def test_blank_lines_count_toward_checkpoints_and_the_time_budget(resources: ExperimentResources) -> None:
    blanks = BLANK_LINES_PER_CHECKPOINT * 2 + 5
    body = gzip.compress(b"\n" * blanks + jsonl([{"id": "last"}]))
    event = upload(resources, "datasets/blanks.jsonl.gz", body)
    ingestion = make_ingestion(resources, min_remaining_ms=60_000)

    first = ingestion.handle_message(event, owner="msg-1", remaining_ms=lambda: 30_000)
    assert (first.outcome, first.progress.cursor) == ("continued", BLANK_LINES_PER_CHECKPOINT)
    (continuation,) = receive_all(resources.ingest_queue_url)
    done = ingestion.handle_message(continuation, owner="msg-2", remaining_ms=lambda: 800_000)
    assert (done.outcome, done.progress.rows_accepted, done.progress.cursor) == ("accepted", 1, blanks + 1)
