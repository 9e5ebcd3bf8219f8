"""Helpers for the lifecycle tests: seed batch/group items (as ingestion writes them), drive the queues."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from rollout_pipeline.adapters import clients
from rollout_pipeline.contracts import FileOptions, RolloutMessage
from rollout_pipeline.fakes.acr import FakeAgentRuntime
from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.items import BatchView
from rollout_pipeline.ledger.ledger import Ledger
from rollout_pipeline.lifecycle.completion import Completion, complete_records
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.lifecycle.dispatch import Dispatch, dispatch_records
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.sqs_batch import BatchOutcome
from tests.doubles import ShiftedClock

#: A dispatch wait budget for tests that expect the dispatch to go through: the session budget is paced (a call
#: whose thread wakes past its slot drops it), so a loaded 2-core machine needs more than a second or two.
PACED_WAIT_S = 15.0


def paced_until() -> float:
    """`wait_until` (monotonic) for a dispatch expected to go through: `PACED_WAIT_S` from now. A dispatch returns
    as soon as its calls are done, so the generous bound costs nothing when the machine is idle."""
    import time

    return time.monotonic() + PACED_WAIT_S


@pytest.fixture
def moto_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every moto request atomic, as real AWS requests are: moto's backends are not thread-safe (two
    concurrent ADDs to one DynamoDB counter can lose an update), and the lifecycle runs work in threads."""
    from moto.core.botocore_stubber import BotocoreStubber

    lock = threading.RLock()
    original = BotocoreStubber.process_request

    def locked(self: Any, *args: Any, **kwargs: Any) -> Any:
        with lock:
            return original(self, *args, **kwargs)

    monkeypatch.setattr(BotocoreStubber, "process_request", locked)


def _s(v: str) -> dict[str, str]:
    return {"S": v}


def _n(v: float) -> dict[str, str]:
    return {"N": str(v)}


def seed_batch(
    resources: ExperimentResources,
    *,
    batch_id: str = "batch-1",
    inputs: Mapping[str, Mapping[str, Any]] | None = None,
    group_size: int = 2,
    max_attempts: int | None = None,
    rollout_timeout_s: int | None = None,
    policy_version: str | None = "v7",
    status: str = "accepted",
    with_total: bool = True,
    payload_refs: Mapping[str, str] | None = None,
) -> list[RolloutMessage]:
    """Write the batch item and group items ingestion would write (ARCHITECTURE.md attribute names); return the
    rollout messages of attempt 1 (not sent)."""
    config = resources.config
    inputs = inputs if inputs is not None else {"q1": {"prompt": "one"}, "q2": {"prompt": "two"}}
    options = FileOptions(
        group_size=group_size,
        rollout_timeout_s=rollout_timeout_s or config.rollout_timeout_s,
        max_attempts=max_attempts or config.max_attempts,
        policy_version=policy_version,
    )
    ddb = clients.client("dynamodb")
    now = datetime.now(UTC)
    batch: dict[str, Any] = {
        **keys.batch_key(batch_id),
        "exp_id": _s(config.name),
        "batch_id": _s(batch_id),
        "status": _s(status),
        "options": _s(options.model_dump_json()),
        "source": _s("sdk"),
        "created_at": _s(now.isoformat()),
        "rows_accepted": _n(len(inputs)),
        "rows_rejected": _n(0),
        keys.DEADLINE_PK: _s(keys.BATCHES_INDEX_PK),  # listed among the experiment's batches
        keys.DEADLINE_SK: _n(round(now.timestamp() * 1000)),
    }
    if with_total:
        batch["rollouts_total"] = _n(len(inputs) * group_size)
    ddb.put_item(TableName=resources.table_name, Item=batch)
    messages: list[RolloutMessage] = []
    for line, (input_id, payload) in enumerate(inputs.items(), start=1):
        ref = (payload_refs or {}).get(input_id)
        group: dict[str, Any] = {
            **keys.group_key(batch_id, input_id),
            "exp_id": _s(config.name),
            "batch_id": _s(batch_id),
            "input_id": _s(input_id),
            "line": _n(line),
            "group_size": _n(group_size),
            "overrides": _s("{}"),
            "terminal": _n(0),
            "rewards": {"M": {}},
            "failures": {"M": {}},
            "created_at": _s(now.isoformat()),
        }
        if ref:
            group["payload_ref"] = _s(ref)
        else:
            group["payload"] = _s(json.dumps(payload))
        ddb.put_item(TableName=resources.table_name, Item=group)
        for index in range(group_size):
            messages.append(
                RolloutMessage(
                    exp_id=config.name,
                    batch_id=batch_id,
                    input_id=input_id,
                    index=index,
                    attempt=1,
                    group_size=group_size,
                    submitted_at=now,
                    line=line,
                    payload=None if ref else dict(payload),
                    payload_ref=ref,
                )
            )
    return messages


def send(resources: ExperimentResources, messages: Sequence[RolloutMessage]) -> None:
    sqs = clients.client("sqs")
    for m in messages:
        sqs.send_message(QueueUrl=resources.rollout_queue_url, MessageBody=m.model_dump_json(exclude_none=True))


def receive_records(queue_url: str, max_messages: int = 10, visibility: int | None = None) -> list[dict[str, Any]]:
    """Receive up to `max_messages` as Lambda-style SQS records (messageId, body, receiptHandle, attributes)."""
    sqs = clients.client("sqs")
    kwargs: dict[str, Any] = {
        "QueueUrl": queue_url,
        "MaxNumberOfMessages": min(10, max_messages),
        "WaitTimeSeconds": 0,
        "AttributeNames": ["ApproximateReceiveCount"],
    }
    if visibility is not None:
        kwargs["VisibilityTimeout"] = visibility
    resp = sqs.receive_message(**kwargs)
    return [
        {
            "messageId": m["MessageId"],
            "body": m["Body"],
            "receiptHandle": m["ReceiptHandle"],
            "attributes": m.get("Attributes") or {},
        }
        for m in resp.get("Messages") or []
    ]


def ack(queue_url: str, records: Sequence[Mapping[str, Any]], failures: Mapping[str, str] | Sequence[str]) -> None:
    """Delete what the handler did not report as failed (Lambda's partial batch response semantics)."""
    sqs = clients.client("sqs")
    for record in records:
        if record["messageId"] not in failures:
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=record["receiptHandle"])


def release(queue_url: str, records: Sequence[Mapping[str, Any]]) -> None:
    """Make received messages visible again at once (simulates the visibility timeout running out)."""
    sqs = clients.client("sqs")
    for record in records:
        sqs.change_message_visibility(QueueUrl=queue_url, ReceiptHandle=record["receiptHandle"], VisibilityTimeout=0)


def dispatch_once(
    resources: ExperimentResources, deps: LifecycleDeps, wait_s: float = PACED_WAIT_S, max_messages: int = 10
) -> BatchOutcome[Dispatch]:
    import time

    records = receive_records(resources.rollout_queue_url, max_messages)
    result = dispatch_records(records, deps, wait_until=time.monotonic() + wait_s)
    ack(resources.rollout_queue_url, records, result.failures)
    return result


def complete_once(resources: ExperimentResources, deps: LifecycleDeps) -> BatchOutcome[Completion]:
    records = receive_records(resources.completion_queue_url)
    result = complete_records(records, deps)
    ack(resources.completion_queue_url, records, result.failures)
    return result


def drive(
    resources: ExperimentResources, deps: LifecycleDeps, *, rounds: int = 30, wait_s: float = PACED_WAIT_S
) -> None:
    """Run dispatcher and completion over the queues until both are empty."""
    for _ in range(rounds):
        d = dispatch_once(resources, deps, wait_s)
        c = complete_once(resources, deps)
        if not d.outcomes and not d.failures and not c.outcomes and not c.failures:
            return


def trainer_events(resources: ExperimentResources) -> list[dict[str, Any]]:
    """Every event that reached the trainer queue (deleted)."""
    from tests.conftest import receive_all

    return receive_all(resources.trainer_queue_url)


def by_type(events: Sequence[Mapping[str, Any]], detail_type: str) -> list[dict[str, Any]]:
    return [dict(e["detail"]) for e in events if e["detail-type"] == detail_type]


def rollout_item(resources: ExperimentResources, batch_id: str, input_id: str, index: int) -> dict[str, Any] | None:
    from rollout_pipeline.ledger.attributes import item_values

    item = (
        clients.client("dynamodb")
        .get_item(TableName=resources.table_name, Key=keys.rollout_key(batch_id, input_id, index), ConsistentRead=True)
        .get("Item")
    )
    return item_values(item) if item else None


def slots_in_flight(resources: ExperimentResources) -> int:
    """The sessions holding a slot: the sum of the session-slot counters (`LimitLedger.in_flight`)."""

    return Ledger.open(resources.table_name, clients.client("dynamodb")).limits.in_flight()


def ledger_item(resources: ExperimentResources, key: Mapping[str, Any]) -> dict[str, Any]:
    from rollout_pipeline.ledger.attributes import item_values

    item = clients.client("dynamodb").get_item(TableName=resources.table_name, Key=dict(key), ConsistentRead=True)
    return item_values(item.get("Item") or {})


def batch_view(resources: ExperimentResources, batch_id: str) -> BatchView:
    """The batch as readers see it: its item with the counters summed over its `COUNT#` shards."""
    from rollout_pipeline.ledger.ledger import Ledger

    view = Ledger.open(resources.table_name).batches.read_batch(batch_id)
    assert view is not None
    return view


def make_deps(
    resources: ExperimentResources,
    fake: FakeAgentRuntime,
    *,
    clock: ShiftedClock | None = None,
    limits: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> LifecycleDeps:
    """Deps over moto and the fake ACR; `limits` overrides experiment settings (tps_limit, max_sessions...);
    `overrides`: fields of `LifecycleDeps` (the feed is built over the ledger and queue given)."""
    from rollout_pipeline.adapters.eventbridge import EventBridgePublisher
    from rollout_pipeline.adapters.s3 import S3ObjectStore
    from rollout_pipeline.adapters.sqs import SqsQueue
    from rollout_pipeline.feed.feed import Feed
    from rollout_pipeline.ledger.ledger import Ledger
    from rollout_pipeline.ledger.pool import PoolLedger
    from rollout_pipeline.limits.facade import Limits
    from rollout_pipeline.limits.pacing import Clocks
    from rollout_pipeline.metric_names import MetricsRecorder

    settings = resources.settings()
    if limits:
        settings = settings.model_copy(update={"experiment": settings.experiment.model_copy(update=dict(limits))})
    clock = clock or ShiftedClock()
    pool = overrides.pop("pool", "default")
    if pool == "default":  # the account pool, as a deployed stack has
        pool = (
            PoolLedger.open(settings.pool_table_name, clock=clock, region=resources.region)
            if settings.pool_table_name
            else None
        )
    ledger = overrides.pop("ledger", None) or Ledger.open(settings.table_name, clock=clock)
    queue = overrides.pop("queue", None) or SqsQueue()
    metrics = overrides.pop("metrics", None) or MetricsRecorder()
    if "limits" not in overrides:
        clocks = Clocks(wall=lambda: clock.now().timestamp(), monotonic=clock.monotonic, sleep=clock.sleep)
        overrides["limits"] = Limits(
            ledger.limits,
            settings.experiment,
            fake,
            pool=pool,
            clocks=clocks,
            metrics=metrics,
            group_admission=overrides.pop("group_admission", True),
        )
    return LifecycleDeps(
        settings=settings,
        ledger=ledger,
        runtime=fake,
        store=S3ObjectStore(),
        queue=queue,
        publisher=EventBridgePublisher(settings.bus_name, sleep=lambda _s: None),
        feed=overrides.pop("feed", None) or Feed(ledger, queue, settings),
        clock=clock,
        metrics=metrics,
        **overrides,
    )


Wrapper = Callable[..., Any]
