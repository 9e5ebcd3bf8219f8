"""Group-ordered admission ACROSS dispatchers: with a backlog and `max_sessions` binding, several dispatcher
processes (each its own `LifecycleDeps`, so its own `SlotGate`) hand free session slots to the waiting rollouts
first in submission order (batch, then the group's line), not to whichever process polls first, so groups are
admitted, and complete, in submission order (docs/lifecycle.md, "Limits")."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import pytest

from rollout_pipeline import ids
from rollout_pipeline.fakes.acr import AgentBehaviour, FakeAgentRuntime, FakeInvocation
from rollout_pipeline.lifecycle.completion import complete_records
from rollout_pipeline.lifecycle.dispatch import dispatch_records
from rollout_pipeline.lifecycle.limits.admission import ADMIT_AHEAD_S
from rollout_pipeline.lifecycle.limits.pacing import LATENESS_S
from rollout_pipeline.local.resources import ExperimentResources
from tests.conftest import receive_all
from tests.integration.lifecycle_support import (
    ack,
    batch_view,
    by_type,
    make_deps,
    moto_lock,
    receive_records,
    seed_batch,
    send,
    slots_in_flight,
    trainer_events,
)

pytestmark = [pytest.mark.usefixtures(moto_lock.__name__), pytest.mark.timing]

BATCH = ids.batch_id_for_upload("in", "datasets/groups.jsonl", "v1")
GROUPS = 12
GROUP_SIZE = 4
MAX_SESSIONS = 4
DISPATCHERS = 3


#: The two limits that can bind: the session slots (`max_sessions`), or the new-session RATE with free slots (then
#: the ordered gate admits only what the session budget can start within `limits.ADMIT_AHEAD_S`).
BINDING = {
    "slots": {"max_sessions": MAX_SESSIONS, "tps_limit": 25, "session_rate_limit": 20},
    "session_rate": {"max_sessions": 100, "tps_limit": 25, "session_rate_limit": 4},
}


@pytest.mark.parametrize("binding", list(BINDING))
def test_groups_are_admitted_in_submission_order_across_dispatchers(
    resources: ExperimentResources, fake: FakeAgentRuntime, binding: str
) -> None:
    # Ids whose text order is NOT the submission order ("g10" < "g2"): the line decides.
    inputs = {f"g{i}": {"i": i} for i in range(GROUPS)}
    lines = {f"g{i}": i for i in range(GROUPS)}
    started: dict[tuple[str, int], float] = {}
    lock = threading.Lock()

    def behaviour(inv: FakeInvocation) -> AgentBehaviour:
        rollout: dict[str, Any] = dict(inv.payload.get("_rollout") or {})
        with lock:
            started.setdefault((str(rollout.get("input_id")), int(rollout.get("index") or 0)), time.monotonic())
        return AgentBehaviour(rewards=1.0, delay_s=0.6)

    fake.behaviour = behaviour
    # As ingestion sends them: a group's rollouts are consecutive messages, groups in line order.
    send(resources, seed_batch(resources, batch_id=BATCH, inputs=inputs, group_size=GROUP_SIZE))
    total = GROUPS * GROUP_SIZE
    limits = BINDING[binding]
    stop = threading.Event()
    errors: list[BaseException] = []

    def dispatcher() -> None:  # one Lambda "process": its own deps, so its own SlotGate; no start-up barrier
        deps = make_deps(resources, fake, limits=limits, dispatch_threads=10)
        try:
            while not stop.is_set():
                records = receive_records(resources.rollout_queue_url, visibility=300)
                if not records:
                    time.sleep(0.05)
                    continue
                result = dispatch_records(records, deps, wait_until=time.monotonic() + 60)
                ack(resources.rollout_queue_url, records, result.failures)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    def completer() -> None:
        deps = make_deps(resources, fake, limits=limits)
        try:
            while not stop.is_set():
                records = receive_records(resources.completion_queue_url)
                if records:
                    ack(resources.completion_queue_url, records, complete_records(records, deps).failures)
                else:
                    time.sleep(0.05)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=dispatcher) for _ in range(DISPATCHERS)]
    threads += [threading.Thread(target=completer) for _ in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 300  # bounded; about 15 s on an idle machine
    while time.monotonic() < deadline:
        if batch_view(resources, BATCH).terminal >= total:
            break
        time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    events = trainer_events(resources)
    assert len({e["rollout_id"] for e in by_type(events, "Rollout Completed")}) == total
    assert fake.max_running <= limits["max_sessions"]
    assert slots_in_flight(resources) == 0
    for name in ("rollout", "completion"):
        assert receive_all(resources.dlq_urls[name]) == []

    # From the first message on (no barrier: dispatchers receive whenever they get to it): a burst's first decision
    # waits `BOARD_SETTLE_S` for every dispatcher's received rollouts to be on the board, so start-up is ordered too.
    # The gate lets through a poll's free slots, or the session budget's room within `ADMIT_AHEAD_S`, whose
    # rollouts then race: `reach` is how many lines later a rollout may start before a group is fully admitted.
    if binding == "slots":
        reach = 2
    else:
        room = math.floor(ADMIT_AHEAD_S * limits["session_rate_limit"] / (1 + LATENESS_S))
        reach = 1 + math.ceil(room / GROUP_SIZE)
    # A group is admitted when its last rollout starts: rank the groups by that and compare with the file.
    admitted = {g: max(started[(g, i)] for i in range(GROUP_SIZE)) for g in inputs}
    order = sorted(inputs, key=lambda g: admitted[g])
    in_file = sorted(inputs, key=lambda g: lines[g])
    displacement = [abs(rank - in_file.index(g)) for rank, g in enumerate(order)]
    # Tolerance: a group may swap with a neighbour (two rollouts admitted in the same poll), no more.
    assert max(displacement) <= 1, order
    overtaken = [
        (g, h, i) for g in inputs for (h, i), at in started.items() if lines[h] >= lines[g] + reach and at < admitted[g]
    ]
    assert overtaken == [], (order, overtaken)
