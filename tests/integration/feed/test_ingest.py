"""Dataset ingestion against in-process moto: S3 upload -> ingest queue event -> ingestion -> ledger items,
rollout messages and pipeline events on the trainer queue. Datasets stay small (moto SQS slows with depth)."""

from __future__ import annotations

import dataclasses
import gzip
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from rollout_pipeline import ids
from rollout_pipeline.adapters import clients
from rollout_pipeline.adapters.eventbridge import EventBridgePublisher
from rollout_pipeline.adapters.s3 import S3ObjectStore
from rollout_pipeline.adapters.sqs import SqsQueue
from rollout_pipeline.contracts import (
    CLAIM_CHECK_BYTES,
    MAX_ROW_BYTES,
    BatchAccepted,
    BatchCompleted,
    FailureReason,
    FileOptions,
    utcnow,
)
from rollout_pipeline.details import batch_completion_detail, group_completion_detail
from rollout_pipeline.feed.feed import Feed
from rollout_pipeline.ingest import Ingestion, IngestPorts, IngestTuning
from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.attributes import item_values, to_attribute_value
from rollout_pipeline.ledger.batches import BatchLedger
from rollout_pipeline.ledger.groups import GroupSpec
from rollout_pipeline.ledger.items import BatchView, GroupItem
from rollout_pipeline.ledger.ledger import Ledger
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.ports import MessageQueue
from tests.conftest import receive_all
from tests.doubles import RecordingQueue, ShiftedClock

UPLOADED_BATCH_IDS: dict[str, str] = {}


class Interrupted(RuntimeError):
    """Stands for a crash or Lambda timeout in the middle of an ingestion."""


class CrashAfterCheckpointLedger(BatchLedger):
    """A ledger whose `crash_on`-th checkpoint is written and then the worker dies (reply lost)."""

    def __init__(self, table_name: str, crash_on: int) -> None:
        super().__init__(Ledger.open(table_name).table)
        self.crash_on, self.checkpoints = crash_on, 0

    def checkpoint(self, batch_id: str, **kwargs: Any) -> BatchView:
        self.checkpoints += 1
        item = super().checkpoint(batch_id, **kwargs)
        if self.checkpoints == self.crash_on:
            raise Interrupted(f"checkpoint #{self.checkpoints}")
        return item


def make_ingestion(
    resources: ExperimentResources,
    *,
    queue: MessageQueue | None = None,
    ledger: BatchLedger | None = None,
    release_window: int | None = None,
    experiment: Mapping[str, Any] | None = None,
    **tuning: Any,
) -> Ingestion:
    """Ingestion over moto; `ledger`: its batch part (the rest of the ledger is the table's own);
    `release_window=0`: ingestion itself sends every rollout message (no window); `experiment`: other settings."""
    settings = resources.settings()
    changes = dict(experiment or {}) | ({} if release_window is None else {"release_window": release_window})
    if changes:
        settings = settings.model_copy(update={"experiment": settings.experiment.model_copy(update=changes)})
    whole = Ledger.open(settings.table_name)
    parts = dataclasses.replace(whole, batches=ledger) if ledger is not None else whole
    queue = queue or SqsQueue()
    send_threads = tuning.pop("send_threads", 4)
    return Ingestion(
        IngestPorts(
            store=S3ObjectStore(),
            queue=queue,
            publisher=EventBridgePublisher(settings.bus_name),
            ledger=parts,
            settings=settings,
            feed=Feed(parts, queue, settings, send_threads=send_threads),
        ),
        IngestTuning(**tuning),
    )


def upload(
    resources: ExperimentResources, key: str, body: bytes, metadata: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Put a dataset object and return the one S3 event the bucket routed to the ingest queue.

    Remembers the batch id the SDK derives from the PutObject response, which ingestion must agree with.
    """
    put = clients.client("s3").put_object(
        Bucket=resources.input_bucket, Key=key, Body=body, Metadata=dict(metadata or {})
    )
    events = receive_all(resources.ingest_queue_url)
    assert len(events) == 1, events
    etag = str(put["ETag"]).strip('"')
    UPLOADED_BATCH_IDS[events[0]["id"]] = ids.batch_id_for_upload(resources.input_bucket, key, put["VersionId"], etag)
    return events[0]


def jsonl(rows: Sequence[Any]) -> bytes:
    return b"".join(json.dumps(row).encode() + b"\n" for row in rows)


def rollout_messages(resources: ExperimentResources) -> list[dict[str, Any]]:
    return receive_all(resources.rollout_queue_url, max_rounds=500)


def trainer_events(resources: ExperimentResources) -> list[dict[str, Any]]:
    return receive_all(resources.trainer_queue_url)


def errors_object(resources: ExperimentResources, dataset_key: str) -> list[dict[str, Any]]:
    body = clients.client("s3").get_object(Bucket=resources.input_bucket, Key=ids.errors_key(dataset_key))
    return [json.loads(line) for line in body["Body"].read().splitlines()]


def has_errors_object(resources: ExperimentResources, dataset_key: str) -> bool:
    listed = clients.client("s3").list_objects_v2(Bucket=resources.input_bucket, Prefix=ids.errors_key(dataset_key))
    return bool(listed.get("KeyCount"))


def batch_item(resources: ExperimentResources, batch_id: str) -> dict[str, Any]:
    """The stored batch item as plain values (the attribute names ingestion writes), with its `terminal` counter
    summed over its shards."""
    view = Ledger.open(resources.table_name).batches.read_batch(batch_id)
    assert view is not None
    key = keys.batch_key(batch_id)
    stored = clients.client("dynamodb").get_item(TableName=resources.table_name, Key=key, ConsistentRead=True)
    return item_values(stored["Item"]) | {"terminal": view.terminal}


def group_items(resources: ExperimentResources, batch_id: str) -> dict[str, dict[str, Any]]:
    """The stored group items of a batch, as plain values, by input id."""
    found = clients.client("dynamodb").query(
        TableName=resources.table_name,
        KeyConditionExpression="pk = :pk AND begins_with(sk, :g)",
        ExpressionAttributeValues={":pk": {"S": keys.batch_pk(batch_id)}, ":g": {"S": keys.GROUP_PREFIX}},
        ConsistentRead=True,
    )["Items"]
    return {str(group["input_id"]): group for group in map(item_values, found)}


def typed(plain_item: Mapping[str, Any]) -> dict[str, Any]:
    """An item as the low-level client returns it, from plain values."""
    return {name: to_attribute_value(value) for name, value in plain_item.items()}


def pairs(messages: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return sorted((m["input_id"], m["index"]) for m in messages)


def expected_pairs(input_ids: Sequence[str], group_size: int) -> list[tuple[str, int]]:
    return sorted((i, index) for i in input_ids for index in range(group_size))


def batch_id_of(event: Mapping[str, Any]) -> str:
    """The batch id of an uploaded object, as the SDK computes it at upload time."""
    return UPLOADED_BATCH_IDS[event["id"]]


# ------------------------------------------------------------------------------------------------- happy path


def test_happy_path_records_batch_and_groups_sends_group_size_messages_and_publishes(
    resources: ExperimentResources,
) -> None:
    rows = [
        {"id": "q1", "question": "1+1?"},
        {"question": "2+2?", "_rollout": {"sampling_params": {"temperature": 0.5}}},
    ]
    rows += [{"id": f"n{i}", "question": f"{i}?"} for i in range(8)]
    event = upload(resources, "datasets/happy.jsonl", jsonl(rows))
    batch_id = batch_id_of(event)

    result = make_ingestion(resources, chunk_rows=4).handle_message(event, owner="msg-1")

    assert (result.outcome, result.batch_id) == ("accepted", batch_id)
    assert (result.rows_accepted, result.rows_rejected, result.rollouts_enqueued) == (10, 0, 20)
    input_ids = ["q1", "line-2"] + [f"n{i}" for i in range(8)]

    batch = batch_item(resources, batch_id)
    assert batch["status"] == "accepted"
    assert (batch["rows_accepted"], batch["rows_rejected"], batch["rollouts_total"]) == (10, 0, 20)
    assert batch["exp_id"] == "test-exp"
    assert batch["source"].startswith(f"s3://{resources.input_bucket}/datasets/happy.jsonl?versionId=")
    assert json.loads(batch["options"])["group_size"] == 2
    assert batch["accepted_at"]
    assert batch["created_at"]
    assert batch["terminal"] == 0
    assert "lease_owner" not in batch
    assert "errors_uri" not in batch
    assert batch["expires_at"] > utcnow().timestamp() + 29 * 86400

    groups = group_items(resources, batch_id)
    assert sorted(groups) == sorted(input_ids)
    q1, second = groups["q1"], groups["line-2"]
    assert json.loads(q1["payload"]) == {"question": "1+1?"}
    assert (q1["line"], q1["group_size"], q1["terminal"], q1["rewards"], q1["failures"]) == (1, 2, 0, {}, {})
    assert json.loads(second["overrides"]) == {"sampling_params": {"temperature": 0.5}}
    assert all(g["expires_at"] > utcnow().timestamp() for g in groups.values())
    assert all(g["exp_id"] == "test-exp" and g["batch_id"] == batch_id for g in groups.values())

    messages = rollout_messages(resources)
    assert pairs(messages) == expected_pairs(input_ids, 2)
    assert {(m["attempt"], m["group_size"], m["batch_id"], m["exp_id"]) for m in messages} == {
        (1, 2, batch_id, "test-exp")
    }
    by_input = {m["input_id"]: m for m in messages}
    assert by_input["q1"]["payload"] == {"question": "1+1?"}
    assert by_input["line-2"]["rollout_overrides"] == {"sampling_params": {"temperature": 0.5}}
    assert by_input["q1"]["payload_ref"] is None

    events = trainer_events(resources)
    assert [e["detail-type"] for e in events] == ["Batch Accepted"]
    accepted = BatchAccepted.model_validate(events[0]["detail"])
    assert accepted.event_id == ids.event_id("Batch Accepted", "test-exp", batch_id)
    assert (accepted.rows_accepted, accepted.rows_rejected, accepted.rollouts_enqueued) == (10, 0, 20)
    assert (accepted.group_size, accepted.errors_uri, accepted.error) == (2, None, None)


def test_metadata_overrides_group_size_and_policy_version(resources: ExperimentResources) -> None:
    event = upload(
        resources,
        "datasets/meta.jsonl",
        jsonl([{"id": "a"}, {"id": "b"}]),
        metadata={"group-size": "3", "policy-version": "v7", "sampling-params": '{"temperature": 0.2}'},
    )
    result = make_ingestion(resources).handle_message(event, owner="m")
    assert result.rollouts_enqueued == 6
    options = json.loads(batch_item(resources, result.batch_id or "")["options"])
    assert (options["group_size"], options["policy_version"]) == (3, "v7")
    assert options["sampling_params"]["temperature"] == 0.2
    assert pairs(rollout_messages(resources)) == expected_pairs(["a", "b"], 3)
    accepted = trainer_events(resources)[0]["detail"]
    assert (accepted["group_size"], accepted["policy_version"]) == (3, "v7")


def test_gzip_dataset(resources: ExperimentResources) -> None:
    rows = [{"id": f"g{i}", "x": i} for i in range(12)]
    event = upload(resources, "datasets/zipped.jsonl.gz", gzip.compress(jsonl(rows)))
    result = make_ingestion(resources, chunk_rows=5, release_window=0).handle_message(event, owner="m")
    assert (result.outcome, result.rows_accepted, result.rollouts_enqueued) == ("accepted", 12, 24)
    assert pairs(rollout_messages(resources)) == expected_pairs([f"g{i}" for i in range(12)], 2)


def test_json_array_dataset_positions_are_element_indexes(resources: ExperimentResources) -> None:
    body = json.dumps([{"q": "a"}, {"id": "named", "q": "b"}, 42, {"q": "c"}], indent=2).encode()
    event = upload(resources, "datasets/array.json", body)
    result = make_ingestion(resources).handle_message(event, owner="m")
    assert (result.rows_accepted, result.rows_rejected) == (3, 1)
    groups = group_items(resources, result.batch_id or "")
    assert {k: v["line"] for k, v in groups.items()} == {"line-1": 1, "named": 2, "line-4": 4}
    assert [(e["line"], e["reason"]) for e in errors_object(resources, "datasets/array.json")] == [(3, "not_an_object")]
    assert len(rollout_messages(resources)) == 6


def test_a_chunk_is_sent_over_several_threads_and_a_failed_slice_fails_the_chunk(
    resources: ExperimentResources,
) -> None:

    event = upload(resources, "datasets/threads.jsonl", jsonl([{"id": f"p{i}"} for i in range(30)]))
    failing = RecordingQueue(SqsQueue(), fail_on=2, error=Interrupted)
    with pytest.raises(Interrupted):
        make_ingestion(resources, queue=failing, send_threads=4, release_window=0).handle_message(event, owner="m")
    assert batch_item(resources, batch_id_of(event))["cursor"] == 0, "a chunk with a failed slice is not checkpointed"

    queue = RecordingQueue(SqsQueue())
    result = make_ingestion(resources, queue=queue, send_threads=4, release_window=0).handle_message(event, owner="m")
    assert result.rows_accepted == 30
    assert sorted(size for _thread, size in queue.calls) == [20, 20, 20], "60 bodies: 3 slices of whole SQS batches"
    assert all(thread.startswith("feed-send") for thread, _size in queue.calls)
    assert sorted(set(pairs(rollout_messages(resources)))) == expected_pairs([f"p{i}" for i in range(30)], 2)


def test_claim_check_for_a_big_payload(resources: ExperimentResources) -> None:
    big_text = "z" * (CLAIM_CHECK_BYTES + 100)
    event = upload(resources, "datasets/big.jsonl", jsonl([{"id": "big", "doc": big_text}, {"id": "small"}]))
    result = make_ingestion(resources).handle_message(event, owner="m")
    batch_id = result.batch_id or ""
    claim_uri = f"s3://{resources.input_bucket}/{ids.claim_key(batch_id, 'big')}"

    groups = group_items(resources, batch_id)
    assert groups["big"]["payload_ref"] == claim_uri
    assert "payload" not in groups["big"]
    assert "payload_ref" not in groups["small"]
    stored = clients.client("s3").get_object(Bucket=resources.input_bucket, Key=ids.claim_key(batch_id, "big"))
    assert json.loads(stored["Body"].read()) == {"doc": big_text}

    messages = [m for m in rollout_messages(resources) if m["input_id"] == "big"]
    assert len(messages) == 2
    assert all(m["payload"] is None and m["payload_ref"] == claim_uri for m in messages)


# ----------------------------------------------------------------------------------------------- bad input


def test_each_bad_row_kind_is_reported_with_line_and_reason_and_the_rest_proceeds(
    resources: ExperimentResources,
) -> None:
    lines = [
        b'{"id": "ok1"}',  # 1
        b'{"id": "broken"',  # 2 invalid_json
        b"[1, 2]",  # 3 not_an_object
        b'{"id": "../etc/passwd"}',  # 4 invalid_id
        b'{"id": "ok1", "again": true}',  # 5 duplicate_id (same chunk)
        b"",  # 6 blank: skipped, not an error
        b'{"id": "big", "pad": "' + b"p" * MAX_ROW_BYTES + b'"}',  # 7 oversized
        b'{"id": "r1", "_rollout": {"session_id": "mine"}}',  # 8 invalid_rollout
        b'{"id": "r2", "_rollout": {"sampling_params": {"temperature": -1}}}',  # 9 invalid_rollout
        b'{"id": "r3", "_rollout": "nope"}',  # 10 invalid_rollout
        b'{"id": "ok2"}',  # 11
        b'{"id": "ok2"}',  # 12 duplicate_id (next chunk)
        b'{"id": 7}',  # 13 integer ids are fine
    ]
    event = upload(resources, "datasets/bad.jsonl", b"\n".join(lines) + b"\n")
    result = make_ingestion(resources, chunk_rows=11).handle_message(event, owner="m")

    assert (result.rows_accepted, result.rows_rejected) == (3, 9)
    entries = errors_object(resources, "datasets/bad.jsonl")
    assert [(e["line"], e["reason"]) for e in entries] == [
        (2, "invalid_json"),
        (3, "not_an_object"),
        (4, "invalid_id"),
        (5, "duplicate_id"),
        (7, "oversized"),
        (8, "invalid_rollout"),
        (9, "invalid_rollout"),
        (10, "invalid_rollout"),
        (12, "duplicate_id"),
    ]
    assert all(e["file"] == "datasets/bad.jsonl" and e["error"] for e in entries)
    assert "line 1" in entries[3]["error"]
    assert "line 11" in entries[8]["error"]
    assert "session_id" in entries[5]["error"]

    assert pairs(rollout_messages(resources)) == expected_pairs(["ok1", "ok2", "7"], 2)
    batch = batch_item(resources, result.batch_id or "")
    errors_uri = f"s3://{resources.input_bucket}/{ids.errors_key('datasets/bad.jsonl')}"
    assert (batch["rows_accepted"], batch["rows_rejected"], batch["errors_uri"]) == (3, 9, errors_uri)
    accepted = trainer_events(resources)[0]["detail"]
    assert (accepted["rows_rejected"], accepted["errors_uri"]) == (9, errors_uri)


def test_error_entries_are_capped_and_the_rest_counted(resources: ExperimentResources) -> None:
    event = upload(resources, "datasets/many-bad.jsonl", b"x\n" * 7 + b'{"id": "fine"}\n')
    result = make_ingestion(resources, max_error_entries=3, chunk_rows=2).handle_message(event, owner="m")
    assert (result.rows_accepted, result.rows_rejected) == (1, 7)
    entries = errors_object(resources, "datasets/many-bad.jsonl")
    assert [(e["line"], e["reason"]) for e in entries] == [
        (1, "invalid_json"),
        (2, "invalid_json"),
        (3, "invalid_json"),
        (None, "truncated"),
    ]
    assert "4 more rejected row(s)" in entries[-1]["error"]


def test_bad_metadata_rejects_the_whole_file(resources: ExperimentResources) -> None:
    event = upload(resources, "datasets/badmeta.jsonl", jsonl([{"id": "a"}]), metadata={"group-size": "many"})
    ingestion = make_ingestion(resources)
    result = ingestion.handle_message(event, owner="m")

    assert result.outcome == "rejected"
    batch = batch_item(resources, result.batch_id or "")
    assert batch["status"] == "rejected"
    assert "group-size" in batch["error"]
    assert (batch["rows_accepted"], batch["rows_rejected"], batch["rollouts_total"]) == (0, 0, 0)
    entries = errors_object(resources, "datasets/badmeta.jsonl")
    assert [(e["line"], e["reason"]) for e in entries] == [(None, "invalid_metadata")]
    assert "group-size" in entries[0]["error"]
    assert rollout_messages(resources) == []
    assert group_items(resources, result.batch_id or "") == {}

    events = trainer_events(resources)
    assert [e["detail-type"] for e in events] == ["Batch Accepted", "Batch Completed"]
    accepted = BatchAccepted.model_validate(events[0]["detail"])
    assert "group-size" in (accepted.error or "")
    assert (accepted.rows_accepted, accepted.rollouts_enqueued) == (0, 0)
    assert accepted.errors_uri == f"s3://{resources.input_bucket}/{ids.errors_key('datasets/badmeta.jsonl')}"
    completed = BatchCompleted.model_validate(events[1]["detail"])
    assert (completed.rollouts_total, completed.succeeded, completed.failed) == (0, 0, 0)

    again = ingestion.handle_message(event, owner="m2")  # a duplicate delivery changes nothing
    assert again.outcome == "already_done"
    replayed = trainer_events(resources)
    assert [e["detail"]["event_id"] for e in replayed] == [e["detail"]["event_id"] for e in events]


def test_a_dataset_deleted_before_ingestion_is_rejected_with_a_clear_error(resources: ExperimentResources) -> None:
    event = upload(resources, "datasets/gone.jsonl", jsonl([{"id": "a"}]))
    version = event["detail"]["object"]["version-id"]
    clients.client("s3").delete_object(Bucket=resources.input_bucket, Key="datasets/gone.jsonl", VersionId=version)

    result = make_ingestion(resources).handle_message(event, owner="m")  # no exception: no retry into the DLQ

    assert result.outcome == "rejected"
    batch = batch_item(resources, result.batch_id or "")
    assert batch["status"] == "rejected"
    assert "datasets/gone.jsonl" in batch["error"]
    assert "deleted before it could be ingested" in batch["error"]
    entries = errors_object(resources, "datasets/gone.jsonl")
    assert [(e["line"], e["reason"]) for e in entries] == [(None, "missing_object")]
    assert rollout_messages(resources) == []
    assert [e["detail-type"] for e in trainer_events(resources)] == ["Batch Accepted", "Batch Completed"]


def test_all_rows_rejected_completes_the_batch_at_acceptance(resources: ExperimentResources) -> None:
    event = upload(resources, "datasets/allbad.jsonl", b"nope\n[]\n")
    result = make_ingestion(resources).handle_message(event, owner="m")
    assert (result.outcome, result.rows_accepted, result.rows_rejected) == ("accepted", 0, 2)
    events = trainer_events(resources)
    assert [e["detail-type"] for e in events] == ["Batch Accepted", "Batch Completed"]
    assert events[1]["detail"]["rollouts_total"] == 0
    assert batch_item(resources, result.batch_id or "")["completed_at"]


def test_truncated_gzip_keeps_the_rows_before_and_reports_the_file_error(resources: ExperimentResources) -> None:
    data = gzip.compress(jsonl([{"id": f"t{i}", "pad": "x" * 50} for i in range(40)]))
    event = upload(resources, "datasets/cut.jsonl.gz", data[: len(data) // 2])
    result = make_ingestion(resources, chunk_rows=5).handle_message(event, owner="m")
    assert result.outcome == "accepted"
    assert 0 < result.rows_accepted < 40
    entries = errors_object(resources, "datasets/cut.jsonl.gz")
    assert [(e["line"], e["reason"]) for e in entries] == [(result.rows_accepted + 1, "invalid_file")]
    assert "gzip stream is truncated" in entries[0]["error"]
    assert result.rows_rejected == 1
    assert len(rollout_messages(resources)) == 2 * result.rows_accepted


def test_a_resumed_truncated_file_reports_its_file_error_once(resources: ExperimentResources) -> None:
    data = gzip.compress(jsonl([{"id": f"t{i}", "pad": "x" * 50} for i in range(40)]))
    event = upload(resources, "datasets/cut-twice.jsonl.gz", data[: len(data) // 2])
    crashing = CrashAfterCheckpointLedger(resources.table_name, crash_on=2)  # 1: the rows, 2: the file error
    with pytest.raises(Interrupted):
        make_ingestion(resources, ledger=crashing).handle_message(event, owner="m")
    result = make_ingestion(resources).handle_message(event, owner="m")
    assert result.outcome == "accepted"
    entries = errors_object(resources, "datasets/cut-twice.jsonl.gz")
    assert [e["reason"] for e in entries] == ["invalid_file"]
    assert batch_item(resources, batch_id_of(event))["rows_rejected"] == 1


# ---------------------------------------------------------------------------------------- idempotency, resume


def test_the_same_s3_event_twice_enqueues_nothing_twice(resources: ExperimentResources) -> None:
    event = upload(resources, "datasets/twice.jsonl", jsonl([{"id": f"t{i}"} for i in range(6)]))
    ingestion = make_ingestion(resources)
    first = ingestion.handle_message(event, owner="message-a")
    second = ingestion.handle_message(event, owner="message-b")

    assert (first.outcome, second.outcome) == ("accepted", "already_done")
    assert second.rollouts_enqueued == 0
    assert first.batch_id == second.batch_id
    assert pairs(rollout_messages(resources)) == expected_pairs([f"t{i}" for i in range(6)], 2)
    events = trainer_events(resources)
    assert [e["detail-type"] for e in events] == ["Batch Accepted", "Batch Accepted"]
    assert events[0]["detail"]["event_id"] == events[1]["detail"]["event_id"]
    assert events[0]["detail"]["rollouts_enqueued"] == events[1]["detail"]["rollouts_enqueued"] == 12


def test_a_new_upload_of_the_same_key_is_a_new_batch(resources: ExperimentResources) -> None:
    ingestion = make_ingestion(resources)
    first = ingestion.handle_message(upload(resources, "datasets/same.jsonl", jsonl([{"id": "a"}])), owner="m1")
    second = ingestion.handle_message(upload(resources, "datasets/same.jsonl", jsonl([{"id": "a"}])), owner="m2")
    assert first.batch_id != second.batch_id
    assert (first.outcome, second.outcome) == ("accepted", "accepted")


def test_another_worker_holding_the_lease_means_ack_without_enqueuing(resources: ExperimentResources) -> None:
    event = upload(resources, "datasets/busy.jsonl", jsonl([{"id": "a"}, {"id": "b"}]))
    batch_id = batch_id_of(event)
    ledger = Ledger.open(resources.table_name).batches
    ledger.create_batch(
        exp_id="test-exp",
        batch_id=batch_id,
        options=FileOptions.defaults(resources.config),
        source="s3://x",
        lease_owner="other-message",
        lease_seconds=600,
    )
    result = make_ingestion(resources).handle_message(event, owner="this-message")
    assert result.outcome == "in_progress"
    assert rollout_messages(resources) == []
    assert trainer_events(resources) == []


def test_resume_after_a_crash_before_sending_loses_and_duplicates_nothing(resources: ExperimentResources) -> None:
    rows = [{"id": f"r{i}"} for i in range(23)] + [{"id": "r3"}]  # + a duplicate id in the last chunk
    event = upload(resources, "datasets/resume.jsonl", b"oops\n" + jsonl(rows))
    flaky = RecordingQueue(SqsQueue(), fail_on=3, error=Interrupted)
    with pytest.raises(Interrupted):
        make_ingestion(resources, queue=flaky, chunk_rows=5, release_window=0).handle_message(event, owner="msg-1")
    batch = batch_item(resources, batch_id_of(event))
    assert (batch["status"], batch["cursor"], batch["rows_accepted"], batch["rows_rejected"]) == ("ingesting", 10, 9, 1)

    # The same SQS message is redelivered after the visibility timeout: its own lease is taken back at once.
    result = make_ingestion(resources, chunk_rows=5, release_window=0).handle_message(event, owner="msg-1")

    assert result.outcome == "accepted"
    batch = batch_item(resources, batch_id_of(event))
    assert (batch["rows_accepted"], batch["rows_rejected"], batch["rollouts_total"]) == (23, 2, 46)
    assert pairs(rollout_messages(resources)) == expected_pairs([f"r{i}" for i in range(23)], 2)
    assert [(e["line"], e["reason"]) for e in errors_object(resources, "datasets/resume.jsonl")] == [
        (1, "invalid_json"),
        (25, "duplicate_id"),
    ]
    assert [e["detail"]["rows_accepted"] for e in trainer_events(resources)] == [23]


def test_resume_after_a_crash_after_sending_resends_only_the_unfinished_chunk(resources: ExperimentResources) -> None:
    rows = [{"id": f"c{i}"} for i in range(17)]
    event = upload(resources, "datasets/crash.jsonl", jsonl(rows) + b"bad\n")
    crashing = CrashAfterCheckpointLedger(resources.table_name, crash_on=2)
    with pytest.raises(Interrupted):
        make_ingestion(resources, ledger=crashing, chunk_rows=5, release_window=0).handle_message(event, owner="msg-1")
    # Chunk 2 was checkpointed but the worker died; its lease (another owner) expires after the lease time.
    later = Ledger.open(resources.table_name, clock=ShiftedClock(1000)).batches  # a worker after the lease ran out
    result = make_ingestion(resources, ledger=later, chunk_rows=5, release_window=0).handle_message(
        event, owner="msg-2"
    )

    assert result.outcome == "accepted"
    messages = rollout_messages(resources)
    assert sorted(set(pairs(messages))) == expected_pairs([f"c{i}" for i in range(17)], 2)
    assert len(messages) == 34, "nothing was re-sent: the checkpoint had been written"
    batch = batch_item(resources, batch_id_of(event))
    assert (batch["rows_accepted"], batch["rows_rejected"], batch["rollouts_total"]) == (17, 1, 34)


def test_resume_of_a_chunk_whose_groups_were_written_resends_its_messages(resources: ExperimentResources) -> None:
    event = upload(resources, "datasets/groups-written.jsonl", jsonl([{"id": f"w{i}"} for i in range(8)]))
    flaky = RecordingQueue(
        SqsQueue(), fail_on=2, error=Interrupted
    )  # chunk 2's groups are in the ledger, its messages are not sent
    with pytest.raises(Interrupted):
        make_ingestion(resources, queue=flaky, chunk_rows=4, release_window=0).handle_message(event, owner="m")
    assert len(group_items(resources, batch_id_of(event))) == 8
    result = make_ingestion(resources, chunk_rows=4, release_window=0).handle_message(event, owner="m")
    assert (result.rows_accepted, result.rows_rejected) == (4, 0), "groups of the same line are resumed, not dupes"
    assert pairs(rollout_messages(resources)) == expected_pairs([f"w{i}" for i in range(8)], 2)
    assert not has_errors_object(resources, "datasets/groups-written.jsonl")


def test_low_remaining_time_checkpoints_and_enqueues_a_continuation(resources: ExperimentResources) -> None:
    rows = [{"id": f"k{i}"} for i in range(9)]
    event = upload(resources, "datasets/slow.jsonl", b"[]\n" + jsonl(rows))
    ingestion = make_ingestion(resources, chunk_rows=4, min_remaining_ms=60_000)
    result = ingestion.handle_message(event, owner="msg-1", remaining_ms=lambda: 30_000)

    assert (result.outcome, result.progress.cursor) == ("continued", 4)
    batch = batch_item(resources, batch_id_of(event))
    assert (batch["status"], batch["lease_expires"]) == ("ingesting", 0)
    # The errors object next to the dataset reaches the queue too (the rule matches `datasets/` by prefix, ingestion
    # skips keys of other suffixes): only the continuation resumes the file.
    continuations = [m for m in receive_all(resources.ingest_queue_url) if "continue" in m]
    assert len(continuations) == 1
    assert continuations[0]["continue"]["detail"]["object"]["key"] == "datasets/slow.jsonl"
    assert trainer_events(resources) == []

    plenty = ingestion.handle_message(continuations[0], owner="msg-2", remaining_ms=lambda: 800_000)
    assert (plenty.outcome, plenty.rows_accepted) == ("accepted", 6)
    assert pairs(rollout_messages(resources)) == expected_pairs([f"k{i}" for i in range(9)], 2)
    batch = batch_item(resources, batch_id_of(event))
    assert (batch["rows_accepted"], batch["rows_rejected"], batch["rollouts_total"]) == (9, 1, 18)
    assert [(e["line"], e["reason"]) for e in errors_object(resources, "datasets/slow.jsonl")] == [(1, "not_an_object")]


def test_cancelled_batch_stops_enqueuing_and_keeps_its_status(resources: ExperimentResources) -> None:
    event = upload(resources, "datasets/cancel.jsonl", jsonl([{"id": f"x{i}"} for i in range(12)]))
    batch_id = batch_id_of(event)

    class CancelAfterFirstSend:
        def __init__(self) -> None:
            self.inner = SqsQueue()

        def send_all(self, queue_url: str, bodies: Sequence[str], delay_seconds: int = 0) -> None:
            self.inner.send_all(queue_url, bodies, delay_seconds)
            clients.client("dynamodb").update_item(
                TableName=resources.table_name,
                Key=keys.batch_key(batch_id),
                UpdateExpression="SET #s = :c",
                ExpressionAttributeNames={"#s": "status"},
                ExpressionAttributeValues={":c": {"S": "cancelled"}},
            )

    result = make_ingestion(resources, queue=CancelAfterFirstSend(), chunk_rows=4).handle_message(event, owner="m")

    assert (result.outcome, result.rollouts_enqueued) == ("cancelled", 8)
    batch = batch_item(resources, batch_id)
    assert (batch["status"], batch["rollouts_total"], batch["rows_accepted"]) == ("cancelled", 8, 4)
    assert len(rollout_messages(resources)) == 8
    accepted = trainer_events(resources)[0]
    assert (accepted["detail-type"], accepted["detail"]["rollouts_enqueued"]) == ("Batch Accepted", 8)


def test_object_outside_datasets_is_ignored(resources: ExperimentResources) -> None:
    event = {
        "source": "aws.s3",
        "detail-type": "Object Created",
        "detail": {"bucket": {"name": resources.input_bucket}, "object": {"key": "other/x.jsonl"}},
    }
    assert make_ingestion(resources).handle_message(event, owner="m").outcome == "ignored"


# ------------------------------------------------------------------------------------------ SDK submission


def test_submit_rows_uses_the_same_validation_ledger_and_events(resources: ExperimentResources) -> None:
    ingestion = make_ingestion(resources)
    result = ingestion.submit_rows([{"id": "s1", "q": 1}, {"q": 2}, {"id": "s1"}, {"id": "a/b"}], name="My Run")
    assert result.outcome == "accepted"
    assert (result.batch_id or "").startswith("my-run-")
    assert (result.rows_accepted, result.rows_rejected, result.rollouts_enqueued) == (2, 2, 4)
    assert [(e["line"], e["reason"]) for e in result.errors] == [(3, "duplicate_id"), (4, "invalid_id")]
    batch = batch_item(resources, result.batch_id or "")
    assert (batch["source"], batch["status"], batch["rollouts_total"]) == ("sdk", "accepted", 4)
    assert sorted(group_items(resources, result.batch_id or "")) == ["line-2", "s1"]
    assert pairs(rollout_messages(resources)) == expected_pairs(["s1", "line-2"], 2)
    assert trainer_events(resources)[0]["detail"]["source"] == "sdk"


# ------------------------------------------------------------------------------------------------- handler


@pytest.fixture
def handler_env(resources: ExperimentResources, monkeypatch: pytest.MonkeyPatch) -> Any:
    import importlib

    import lambdas.ingest

    for name, value in resources.settings().to_environ().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "RolloutPipelineTest")
    # Powertools reads its settings at import, and the stage is built from the environment once, as in Lambda.
    return importlib.reload(lambdas.ingest)


class FakeContext:
    function_name = "ingest"
    memory_limit_in_mb = 1024
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:ingest"
    aws_request_id = "request-1"

    def get_remaining_time_in_millis(self) -> int:
        return 600_000


def test_handler_reports_partial_batch_failures_and_emits_metrics(
    resources: ExperimentResources, handler_env: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    event = upload(resources, "datasets/handler.jsonl", jsonl([{"id": "h1"}, {"id": "h2"}, "bad"]))
    sqs_event = {
        "Records": [
            {"messageId": "good", "body": json.dumps(event)},
            {"messageId": "junk", "body": "{not json"},
            {"messageId": "other", "body": json.dumps({"hello": "world"})},
        ]
    }
    response = handler_env.handler(sqs_event, FakeContext())
    assert response == {"batchItemFailures": [{"itemIdentifier": "junk"}, {"itemIdentifier": "other"}]}
    assert pairs(rollout_messages(resources)) == expected_pairs(["h1", "h2"], 2)
    emitted = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line]
    assert len(emitted) == 1
    metrics = emitted[0]
    assert metrics["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "RolloutPipelineTest"
    assert (metrics["RowsAccepted"], metrics["RowsRejected"], metrics["RolloutsEnqueued"]) == ([2.0], [1.0], [4.0])
    # What the dashboard reads: Submitted, with the same dimensions as the lifecycle functions' metrics.
    assert metrics["Submitted"] == [4.0]
    assert metrics["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["Experiment", "service"]]
    assert (metrics["Experiment"], metrics["service"]) == (resources.settings().experiment.name, "rollout-ingest")
    batch = batch_item(resources, batch_id_of(event))
    assert batch["rows_accepted"] == 2


# ------------------------------------------------------------------------------------------- ledger API


class ReasonsWithoutItems:
    """A DynamoDB client whose TransactionCanceledException lacks the old items (as some emulators answer),
    and whose first transaction is cancelled by a transient TransactionConflict."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.exceptions = inner.exceptions
        self.transactions = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def transact_write_items(self, **kwargs: Any) -> Any:
        self.transactions += 1
        if self.transactions == 1:
            reasons = [{"Code": "TransactionConflict"} for _ in kwargs["TransactItems"]]
            raise self.exceptions.TransactionCanceledException(
                {
                    "Error": {"Code": "TransactionCanceledException", "Message": "conflict"},
                    "CancellationReasons": reasons,
                },
                "TransactWriteItems",
            )
        try:
            return self.inner.transact_write_items(**kwargs)
        except self.exceptions.TransactionCanceledException as exc:
            for reason in exc.response.get("CancellationReasons") or []:
                reason.pop("Item", None)
            raise


def test_create_groups_classifies_conflicts_by_line_even_without_returned_items(
    resources: ExperimentResources,
) -> None:
    client = ReasonsWithoutItems(clients.client("dynamodb"))
    ledger = Ledger.open(resources.table_name, client, sleep=lambda _s: None).groups
    first = ledger.create_groups(
        exp_id="test-exp", batch_id="b-1", groups=[GroupSpec("a", 1, 2, "{}"), GroupSpec("b", 2, 2, "{}")]
    )
    assert [g.input_id for g in first.created] == ["a", "b"]
    assert client.transactions == 2, "the transient conflict was retried"
    again = ledger.create_groups(
        exp_id="test-exp",
        batch_id="b-1",
        groups=[GroupSpec("a", 1, 2, "{}"), GroupSpec("c", 3, 2, "{}"), GroupSpec("b", 4, 2, "{}")],
    )
    assert [g.input_id for g in again.resumed] == ["a"]
    assert [g.input_id for g in again.created] == ["c"]
    assert [(g.input_id, line) for g, line in again.duplicates] == [("b", 2)]
    assert [g.input_id for g in again.accepted] == ["a", "c"]


def test_create_groups_splits_transactions_at_one_hundred_items(resources: ExperimentResources) -> None:
    client = ReasonsWithoutItems(clients.client("dynamodb"))
    client.transactions = 1  # no injected conflict
    ledger = Ledger.open(resources.table_name, client).groups
    result = ledger.create_groups(
        exp_id="test-exp", batch_id="b-2", groups=[GroupSpec(f"g{i}", i + 1, 1, "{}") for i in range(205)]
    )
    assert len(result.created) == 205
    assert client.transactions == 1 + 3
    assert len(list(ledger.batch_groups("b-2"))) == 205


def test_group_completion_detail() -> None:
    group: dict[str, Any] = {
        "exp_id": {"S": "test-exp"},
        "batch_id": {"S": "b-1"},
        "input_id": {"S": "q1"},
        "group_size": {"N": "3"},
        "terminal": {"N": "2"},
        "rewards": {"M": {"0": {"N": "1"}, "2": {"N": "0"}}},
        "failures": {"M": {"1": {"S": "timeout"}}},
    }
    assert group_completion_detail(GroupItem.of(group)) is None
    group["terminal"] = {"N": "3"}
    detail = group_completion_detail(GroupItem.of(group), policy_version="v1")
    assert detail is not None
    assert detail.rewards == [1.0, None, 0.0]
    assert detail.failures == {"1": FailureReason.TIMEOUT}
    assert (detail.succeeded, detail.failed, detail.reward_mean, detail.reward_std) == (2, 1, 0.5, 0.5)
    assert detail.event_id == ids.event_id("Group Completed", "test-exp", "b-1", "q1")
    assert detail.policy_version == "v1"


def test_batch_completion_detail() -> None:
    batch: dict[str, Any] = {
        "exp_id": "test-exp",
        "batch_id": "b-1",
        "status": "ingesting",
        "terminal": 4,
        "created_at": "2026-01-01T00:00:00+00:00",
    }
    assert batch_completion_detail(BatchView.of(typed(batch))) is None, "still ingesting: the total is not known"
    batch.update({"status": "accepted", "rollouts_total": 5})
    assert batch_completion_detail(BatchView.of(typed(batch))) is None, "one rollout is not terminal yet"
    batch.update(
        {
            "terminal": 5,
            "succeeded": 3,
            "failed": 2,
            "failed_timeout": 1,
            "failed_agent_error": 1,
            "reward_sum": 3.0,
            "reward_sumsq": 5.0,
            "reward_count": 3,
            "completed_at": "2026-01-01T00:01:40+00:00",
        }
    )
    detail = batch_completion_detail(BatchView.of(typed(batch)))
    assert detail is not None
    assert (detail.rollouts_total, detail.succeeded, detail.failed) == (5, 3, 2)
    assert detail.failed_by_reason == {"timeout": 1, "agent_error": 1}
    assert detail.reward_mean == 1.0
    assert detail.reward_std == pytest.approx((5 / 3 - 1) ** 0.5)
    assert (detail.reward_count, detail.duration_s) == (3, 100.0)
    assert detail.event_id == ids.event_id("Batch Completed", "test-exp", "b-1")
    batch["status"] = "cancelled"
    assert batch_completion_detail(BatchView.of(typed(batch))) is not None, "a cancelled batch still completes"


def test_a_batch_whose_rollouts_may_wait_past_the_limit_is_accepted_with_a_warning(
    resources: ExperimentResources,
) -> None:
    """Without the window, 30 groups x 2 for 20 sessions queue 40 behind the running ones: with rollouts of up to
    900 s, two rounds (1800 s) exceed a max_limit_wait_s of 1200 s. `Batch Accepted` and the result say so."""
    event = upload(resources, "datasets/long.jsonl", jsonl([{"id": f"w{i}"} for i in range(30)]))
    ingestion = make_ingestion(resources, release_window=0, experiment={"max_limit_wait_s": 1200})
    result = ingestion.handle_message(event, owner="m")
    (warning,) = result.warnings
    assert "all 60 rollouts are queued at once for max_sessions (20)" in warning
    (accepted,) = trainer_events(resources)
    assert accepted["detail"]["warnings"] == [warning]
    again = ingestion.handle_message(event, owner="m")
    assert (again.outcome, again.warnings) == ("already_done", [warning]), "a duplicate event says it again"


def test_an_object_under_datasets_that_is_not_a_dataset_file_is_ignored(resources: ExperimentResources) -> None:
    """The S3 rule matches by prefix only (no wildcard on the default bus): ingestion skips the other keys."""
    for key in ("datasets/notes.txt", "datasets/run.errors.jsonl", "datasets/x.jsonl.bak"):
        event = {
            "source": "aws.s3",
            "detail-type": "Object Created",
            "detail": {"bucket": {"name": resources.input_bucket}, "object": {"key": key}},
        }
        assert make_ingestion(resources).handle_message(event, owner="m").outcome == "ignored", key
