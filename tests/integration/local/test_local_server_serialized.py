"""Local mode's moto server runs each racy service's requests one at a time (`local.moto_server.SerializedServices`).

moto's DynamoDB transactions and its EventBridge rule table are not thread-safe; real AWS's are. A consumer
subscribing (PutRule, PutTargets) while the pipeline publishes (PutEvents) failed local mode's newcomer walk once
with "OrderedDict mutated during iteration" inside moto's PutEvents.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from rollout_pipeline.local.moto_server import (
    LOCAL_CREDENTIALS,
    SERIALIZED_TARGETS,
    SerializedServices,
    moto_server,
)

REGION = "us-east-1"
QUEUE_ARN = f"arn:aws:sqs:{REGION}:123456789012:consumer"


def _call(middleware: SerializedServices, target: str | None) -> list[bytes]:
    environ = {"HTTP_X_AMZ_TARGET": target} if target is not None else {}
    return list(middleware(environ, lambda *args: None))


def test_each_racy_service_runs_under_its_own_lock_and_the_others_under_none() -> None:
    held: dict[str | None, list[str]] = {}
    middleware: SerializedServices

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        target = environ.get("HTTP_X_AMZ_TARGET")
        held[target] = [prefix for prefix, lock in middleware.locks.items() if lock.locked()]
        return [b"ok"]

    middleware = SerializedServices(app)
    targets = (
        "DynamoDB_20120810.TransactWriteItems",
        "AWSEvents.PutEvents",
        "AWSEvents.PutRule",
        "AmazonSQS.SendMessage",
    )
    for target in (*targets, None):
        assert _call(middleware, target) == [b"ok"]

    assert set(SERIALIZED_TARGETS) == {"DynamoDB", "AWSEvents"}
    assert held == {
        "DynamoDB_20120810.TransactWriteItems": ["DynamoDB"],
        "AWSEvents.PutEvents": ["AWSEvents"],
        "AWSEvents.PutRule": ["AWSEvents"],
        "AmazonSQS.SendMessage": [],
        None: [],
    }
    assert not any(lock.locked() for lock in middleware.locks.values())


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for key, value in LOCAL_CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    with moto_server() as endpoint:
        sqs = boto3.client("sqs", region_name=REGION, endpoint_url=endpoint)
        sqs.create_queue(QueueName="consumer")
        yield boto3.client("events", region_name=REGION, endpoint_url=endpoint)


def test_publishing_while_consumers_subscribe_and_unsubscribe_never_fails(events: Any) -> None:
    """The race the newcomer walk hit, many times over: every call succeeds (bounded loops, no timing asserted)."""
    failures: list[BaseException] = []
    pattern = '{"source": ["rollouts.test"]}'

    def churn_rules(worker: int) -> None:
        try:
            for round_ in range(40):
                name = f"sdk-{worker}-{round_}"
                events.put_rule(Name=name, EventPattern=pattern)
                events.put_targets(Rule=name, Targets=[{"Id": "t", "Arn": QUEUE_ARN}])
                events.remove_targets(Rule=name, Ids=["t"])
                events.delete_rule(Name=name)
        except BaseException as error:
            failures.append(error)

    def publish() -> None:
        try:
            for _ in range(160):
                entry = {"Source": "rollouts.test", "DetailType": "Probe", "Detail": "{}"}
                answer = events.put_events(Entries=[entry])
                assert answer["FailedEntryCount"] == 0, answer
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=churn_rules, args=(n,)) for n in range(3)] + [
        threading.Thread(target=publish) for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads)
    assert failures == []
