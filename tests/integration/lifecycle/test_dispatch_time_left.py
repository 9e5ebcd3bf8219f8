"""An invoke is started only if it can end inside the dispatcher's invocation: with the ACR client's read timeout
(`adapters.acr.MAX_CALL_S`) and the handler's safety margin, a message met too late is re-sent, never dropped and
never invoked into a Lambda that may be killed while it waits for the answer."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from lambdas import dispatch as dispatch_lambda
from lambdas.glue import SAFETY_S
from rollout_pipeline import ids, topology
from rollout_pipeline.adapters import acr
from rollout_pipeline.fakes.acr import FakeAgentRuntime
from rollout_pipeline.local.resources import ExperimentResources
from tests.conftest import receive_all
from tests.integration.lifecycle_support import (
    ack,
    make_deps,
    moto_lock,
    receive_records,
    rollout_item,
    seed_batch,
    send,
    slots_in_flight,
)

pytestmark = pytest.mark.usefixtures(moto_lock.__name__)

BATCH = ids.batch_id_for_upload("in", "datasets/time-left.jsonl", "v1")


@dataclass
class LambdaContext:
    """The part of the Lambda context the handler reads: a fixed remaining time."""

    remaining_ms: int

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


class SlowAcr(FakeAgentRuntime):
    """The fake runtime, declaring the real ACR client's longest invoke (connect + read timeouts)."""

    max_invoke_s = acr.MAX_CALL_S


def run_with_remaining(resources: ExperimentResources, fake: FakeAgentRuntime, remaining_ms: int) -> list[str]:
    deps = make_deps(resources, fake)
    assert deps.invoke_time_s == acr.MAX_CALL_S
    records = receive_records(resources.rollout_queue_url)
    outcome = dispatch_lambda.run(deps, {"Records": records}, LambdaContext(remaining_ms))
    failures = {f["itemIdentifier"]: "failed" for f in outcome.response.get("batchItemFailures", [])}
    ack(resources.rollout_queue_url, records, failures)
    return [str(v) for v in outcome.extra["outcomes"].values()]


def test_an_invoke_that_could_not_end_in_the_remaining_time_is_not_started(resources: ExperimentResources) -> None:
    fake = SlowAcr()
    send(resources, seed_batch(resources, batch_id=BATCH, inputs={"a": {}}, group_size=1))
    short = int((SAFETY_S + acr.MAX_CALL_S - 5) * 1000)  # the read timeout would outlive the invocation
    assert run_with_remaining(resources, fake, short) == ["requeued_no_time"]
    assert fake.invocations() == []
    item = rollout_item(resources, BATCH, "a", 0)
    assert item is None or item["state"] == "queued"  # never dispatched
    assert slots_in_flight(resources) == 0  # no slot taken
    assert receive_all(resources.dlq_urls["rollout"]) == []
    # the re-sent message dispatches once an invocation has the time
    enough = int((SAFETY_S + acr.MAX_CALL_S + 10) * 1000)
    assert run_with_remaining(resources, fake, enough) == ["invoked"]
    assert [c.session_id for c in fake.invocations()] == [ids.session_id("test-exp", BATCH, "a", 0, 1)]
    fake.close()


def test_the_dispatcher_timeout_leaves_time_to_wait_for_limits() -> None:
    """The dispatcher's timeout leaves a wait budget of at least 90 s after reserving the longest invoke."""
    waits_s = topology.FUNCTIONS["dispatch"].timeout_s - SAFETY_S - acr.MAX_CALL_S
    assert waits_s >= 90
