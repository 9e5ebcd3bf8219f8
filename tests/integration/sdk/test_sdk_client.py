"""ART-style client over the pipeline (moto + the lifecycle stage + fake ACR): futures resolved by pushed events,
timeouts and cancellation like ART, run_batch items with ART's fields in completion order."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError
from typing import Any

import pytest

from rollout_pipeline.contracts import INLINE_RESULT_BYTES, RolloutCompleted, RolloutFailed
from rollout_pipeline.fakes.acr import AgentBehaviour, Behaviour, FakeAgentRuntime, FakeInvocation
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.sdk import BatchItem, Experiment, RolloutClient, RolloutFailedError, SdkError
from tests.conftest import REGION
from tests.integration.lifecycle_support import drive, make_deps, moto_lock  # noqa: F401 - fixture

pytestmark = pytest.mark.usefixtures("moto_lock")
#: Short polling: the moto lock serialises requests, and a long poll would hold it for its whole wait.
WAIT = 0
#: run_batch's timeout where one rollout hangs (the test waits it out; the other rollout must finish within it).
TIMEOUT_S = 8


def behaviour(inv: FakeInvocation) -> AgentBehaviour:
    payload = inv.payload
    if payload.get("fail"):
        return AgentBehaviour(kind="agent_error", error="agent raised ValueError: bad tool")
    if payload.get("hang"):
        return AgentBehaviour(kind="hang")
    if payload.get("manual"):
        return AgentBehaviour(kind="manual", rewards=float(payload.get("k", 0)))
    return AgentBehaviour(rewards=float(payload.get("k", 1)), extra=dict(payload.get("extra") or {}))


@pytest.fixture
def fake_behaviour() -> Behaviour:
    return behaviour


@pytest.fixture
def client(resources: ExperimentResources, fake: FakeAgentRuntime) -> Iterator[RolloutClient]:
    experiment = Experiment.from_outputs(resources.stack_outputs(), region=REGION)
    with experiment.rollout_client(poll_wait_s=WAIT, linger_s=1, runtime=fake) as rollout_client:
        yield rollout_client


class Pipeline:
    """Runs the dispatcher and completion stages in a background thread until stopped."""

    def __init__(self, resources: ExperimentResources, deps: LifecycleDeps, between: Callable[[], None] | None = None):
        self._resources, self._deps, self._between = resources, deps, between
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.errors: list[BaseException] = []

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                drive(self._resources, self._deps, rounds=1, wait_s=0.5)
                if self._between:
                    self._between()
            except BaseException as exc:  # surfaced by the test
                self.errors.append(exc)
                return
            self._stop.wait(0.1)

    def __enter__(self) -> Pipeline:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        assert not self.errors, self.errors


# ---------------------------------------------------------------------------------------------------- futures


def test_invoke_returns_a_future_resolved_by_the_pushed_event(
    client: RolloutClient, resources: ExperimentResources, deps: LifecycleDeps, fake: FakeAgentRuntime
) -> None:
    future = client.invoke({"prompt": "2+2?", "k": 0.75}, input_id="q1", temperature=0.3)
    assert not future.done()
    assert future.input_id == "q1"
    drive(resources, deps)
    result = future.result(timeout=15)
    assert result["rewards"] == 0.75
    assert result["status_code"] == 200
    assert future.done()
    assert not future.cancelled
    assert future.reward == 0.75
    assert isinstance(future.event, RolloutCompleted)
    assert future.session_id == future.event.session_id
    assert future.result_key == f"test-exp/q1/{future.session_id}.json"
    assert future.elapsed() > 0
    (payload,) = fake.payloads.values()
    assert payload["prompt"] == "2+2?"
    assert payload["_rollout"]["temperature"] == 0.3, "per-call overrides reach `_rollout`"
    assert payload["_rollout"]["input_id"] == "q1"
    assert client.pending == 0
    assert (client.exp_id, client.s3_bucket, client.region) == ("test-exp", resources.results_bucket, REGION)
    assert client.base_url == resources.config.model_base_url


def test_failed_rollout_raises_with_reason(
    client: RolloutClient, resources: ExperimentResources, deps: LifecycleDeps
) -> None:
    future = client.invoke({"fail": True})
    drive(resources, deps)
    with pytest.raises(RolloutFailedError, match="agent_error: status_code 500: agent raised ValueError") as info:
        future.result(timeout=15)
    assert info.value.reason == "agent_error"
    assert isinstance(info.value.event, RolloutFailed)
    assert isinstance(future.exception(), RolloutFailedError)


def test_result_timeout_leaves_the_future_pending(
    client: RolloutClient, resources: ExperimentResources, deps: LifecycleDeps
) -> None:
    future = client.invoke({"k": 1})
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        future.result(timeout=0.3)
    assert time.monotonic() - start < 2
    assert not future.done()
    assert not future.cancelled
    drive(resources, deps)
    assert future.result(timeout=15)["rewards"] == 1.0


def test_cancel_raises_cancelled_error_and_cancels_the_rollout(client: RolloutClient) -> None:
    future = client.invoke({"k": 1})
    assert future.cancel() is True
    assert future.cancelled
    assert future.done()
    with pytest.raises(CancelledError):
        future.result(timeout=1)
    assert future.cancel() is False
    status = client.experiment.status(future.batch_id)
    assert status.status == "cancelled"
    assert status.failed_by_reason == {"cancelled": 1}


def test_big_result_is_fetched_from_s3_on_demand(
    client: RolloutClient, resources: ExperimentResources, deps: LifecycleDeps
) -> None:
    blob = "x" * (INLINE_RESULT_BYTES + 100)
    future = client.invoke({"k": 2, "extra": {"blob": blob}})
    drive(resources, deps)
    event_seen = threading.Event()
    future.add_done_callback(lambda _f: event_seen.set())
    assert event_seen.wait(15)
    assert isinstance(future.event, RolloutCompleted)
    assert future.event.result is None, "too big to travel in the event"
    result = future.result(timeout=1)
    assert result["blob"] == blob
    assert result["rewards"] == 2.0


def test_async_invoke_and_await(client: RolloutClient, resources: ExperimentResources, deps: LifecycleDeps) -> None:
    async def run() -> tuple[dict[str, Any], dict[str, Any]]:
        first = await client.invoke_async({"k": 3})
        second = await client.invoke_async({"k": 4})
        with pytest.raises(TimeoutError):
            await first.result_async(timeout=0.2)
        await asyncio.to_thread(drive, resources, deps)
        return await first, await second.result_async(timeout=15)

    first, second = asyncio.run(run())
    assert (first["rewards"], second["rewards"]) == (3.0, 4.0)


def test_close_cancels_pending_futures(resources: ExperimentResources) -> None:
    experiment = Experiment.from_outputs(resources.stack_outputs(), region=REGION)
    rollout_client = experiment.rollout_client(poll_wait_s=WAIT)
    future = rollout_client.invoke({"k": 1})
    rollout_client.close()
    with pytest.raises(CancelledError):
        future.result(timeout=1)
    with pytest.raises(SdkError, match="closed"):
        rollout_client.invoke({"k": 1})


def test_dispatcher_leaves_other_consumers_events_alone(
    client: RolloutClient, resources: ExperimentResources, deps: LifecycleDeps
) -> None:
    from tests.conftest import receive_all
    from tests.integration.conftest import publish
    from tests.sdk_events import B2, completed

    publish(resources, completed(B2, "other", 0, 0.0))
    future = client.invoke({"k": 1})
    drive(resources, deps)
    assert future.result(timeout=15)["rewards"] == 1.0
    # The client reads its own subscription: the trainer queue is left whole to its one consumer (the other
    # batch's event and ours, never received by the client), nothing is dead-lettered.
    left = receive_all(resources.trainer_queue_url)
    assert B2 in {b["detail"]["batch_id"] for b in left}
    assert future.batch_id in {b["detail"]["batch_id"] for b in left}
    assert receive_all(resources.dlq_urls["trainer"]) == []


def test_dispatcher_errors_fail_pending_futures(
    client: RolloutClient, resources: ExperimentResources, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rollout_pipeline.sdk import AwsError
    from rollout_pipeline.sdk import client as client_module
    from rollout_pipeline.sdk.events import QueueReader

    def broken(self: QueueReader, wait_s: float, max_messages: int = 10) -> list[Any]:
        raise AwsError("receive from the trainer queue: AccessDenied: not allowed")

    monkeypatch.setattr(QueueReader, "receive", broken)
    monkeypatch.setattr(client_module, "_MAX_DISPATCH_ERRORS", 2)
    future = client.invoke({"k": 1})
    with pytest.raises(AwsError, match="AccessDenied"):
        future.result(timeout=15)


# -------------------------------------------------------------------------------------------------- run_batch


def test_run_batch_yields_art_items_in_completion_order(
    client: RolloutClient, resources: ExperimentResources, deps: LifecycleDeps, fake: FakeAgentRuntime
) -> None:
    payloads = [{"manual": True, "k": float(i)} for i in range(3)] + [{"fail": True}]
    yielded: list[int] = []
    finish_order = [2, 0, 1]

    def finish_next() -> None:
        # Finish the sessions one by one, each only after the previous item was yielded.
        manual = {sid: int(p["k"]) for sid, p in fake.payloads.items() if p.get("manual")}
        if len(manual) < 3 or len([i for i in yielded if i < 3]) >= 3:
            return
        target = finish_order[len([i for i in yielded if i < 3])]
        sid = next(s for s, k in manual.items() if k == target)
        if sid in fake.running:
            fake.finish(sid)

    items: list[BatchItem] = []
    with Pipeline(resources, deps, between=finish_next):
        for item in client.run_batch(payloads, timeout=30):
            items.append(item)
            assert item.index is not None
            yielded.append(item.index)
    assert sorted(yielded) == [0, 1, 2, 3]
    assert [i for i in yielded if i < 3] == finish_order, "completion order, not input order"
    by_index = {item.index: item for item in items}
    for index in range(3):
        item = by_index[index]
        assert item.success is True
        assert item.error is None
        assert item.result is not None
        assert item.result["rewards"] == float(index)
        assert item.elapsed is not None
        assert item.elapsed > 0
        assert isinstance(item.event, RolloutCompleted)
    failed = by_index[3]
    assert failed.success is False
    assert failed.result is None
    assert failed.error is not None
    assert "agent_error" in failed.error
    assert isinstance(failed.event, RolloutFailed)


def test_run_batch_timeout_yields_a_failed_item(
    client: RolloutClient, resources: ExperimentResources, deps: LifecycleDeps, fake: FakeAgentRuntime
) -> None:
    with Pipeline(resources, deps):
        # the timeout bounds the hung rollout; the other must finish within it on a loaded machine too
        items = list(client.run_batch([{"hang": True}, {"k": 5}], timeout=TIMEOUT_S))
    by_index = {item.index: item for item in items}
    assert by_index[1].success
    assert by_index[1].result is not None
    assert by_index[1].result["rewards"] == 5.0
    assert by_index[0].success is False
    assert by_index[0].error == f"Timeout after {TIMEOUT_S}s"
    (hung,) = [sid for sid, p in fake.payloads.items() if p.get("hang")]
    assert hung in fake.stopped, "a timed-out rollout is cancelled in the pipeline: its session is stopped"
    batch_id = fake.payloads[hung]["_rollout"]["batch_id"]
    assert client.experiment.status(batch_id).failed_by_reason == {"cancelled": 1}
    assert by_index[0].elapsed is not None
    assert by_index[0].elapsed >= TIMEOUT_S


def test_run_batch_respects_max_concurrent_sessions(
    client: RolloutClient, resources: ExperimentResources, deps: LifecycleDeps, fake: FakeAgentRuntime
) -> None:
    with Pipeline(resources, deps):
        items = list(client.run_batch([{"k": i} for i in range(3)], max_concurrent_sessions=1, timeout=30))
    assert sorted(item.index for item in items if item.success) == [0, 1, 2]  # type: ignore[type-var]
    batches = {p["_rollout"]["batch_id"] for p in fake.payloads.values()}
    assert len(batches) == 3, "one wave (batch) per free slot"
    assert fake.max_running <= 1


def test_run_batch_reports_invalid_payloads_as_failed_items(client: RolloutClient) -> None:
    items = list(client.run_batch([{"id": "../bad"}], timeout=5))
    assert len(items) == 1
    assert items[0].success is False
    assert items[0].index == 0
    assert items[0].error is not None
    assert "invalid_id" in items[0].error


def test_run_batch_async(client: RolloutClient, resources: ExperimentResources, deps: LifecycleDeps) -> None:
    async def run() -> list[BatchItem]:
        return [item async for item in client.run_batch_async([{"k": 1}, {"k": 2}], timeout=30)]

    with Pipeline(resources, deps):
        items = asyncio.run(run())
    assert sorted((item.index, item.success) for item in items) == [(0, True), (1, True)]
