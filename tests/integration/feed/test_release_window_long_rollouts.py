"""The release window with rollouts longer than it takes to start one release: the dispatchers drain the queue, and
the next release must not wait for the first terminal rollout (or the sweep, once a minute), or the sessions would
start at one release per rollout duration instead of the configured rate."""

from __future__ import annotations

import pytest

from rollout_pipeline.adapters.eventbridge import EventBridgePublisher
from rollout_pipeline.adapters.s3 import S3ObjectStore
from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.fakes.acr import AgentBehaviour, Behaviour, FakeAgentRuntime
from rollout_pipeline.feed.feed import Feed
from rollout_pipeline.feed.window import max_release
from rollout_pipeline.ingest.core import Ingestion, IngestPorts
from rollout_pipeline.ledger.ledger import Ledger
from rollout_pipeline.local.resources import ExperimentResources
from tests.integration.feed.test_release_window import lifecycle, recording_queue
from tests.integration.lifecycle_support import batch_view, dispatch_once, moto_lock

pytestmark = pytest.mark.usefixtures(moto_lock.__name__)

GROUP_SIZE = 2
ROWS = 60
WINDOW = 120


@pytest.fixture
def experiment_config() -> ExperimentConfig:
    return ExperimentConfig(
        name="test-exp",
        group_size=GROUP_SIZE,
        tps_limit=1000,
        session_rate_limit=1000,
        max_sessions=WINDOW,
        release_window=WINDOW,
        dispatch_concurrency=2,
    )


@pytest.fixture
def fake_behaviour() -> Behaviour:
    """Every agent runs for longer than the test: no rollout ever ends."""
    return AgentBehaviour(kind="hang")


def test_the_dispatchers_release_once_they_drained_the_queue_before_any_rollout_ended(
    resources: ExperimentResources, fake: FakeAgentRuntime, experiment_config: ExperimentConfig
) -> None:
    queue = recording_queue(resources)
    settings = resources.settings()
    ledger = Ledger.open(settings.table_name)
    ingestion = Ingestion(
        IngestPorts(
            store=S3ObjectStore(),
            queue=queue,
            publisher=EventBridgePublisher(settings.bus_name, sleep=lambda _s: None),
            ledger=ledger,
            settings=settings,
            feed=Feed(ledger, queue, settings),
        )
    )
    result = ingestion.submit_rows([{"id": f"row-{i}"} for i in range(ROWS)], name="long")
    assert result.batch_id is not None
    total = ROWS * GROUP_SIZE
    at_ingestion = len(queue.released())
    assert at_ingestion <= 2 * max_release(experiment_config) < total <= WINDOW, "a release: what dispatchers hold"

    deps = lifecycle(resources, fake, queue)
    for _ in range(total):  # bounded: each round starts at least one session or ends the loop
        if not dispatch_once(resources, deps).outcomes:
            break
    assert batch_view(resources, result.batch_id).terminal == 0, "no rollout has ended"
    assert len(fake.running_sessions()) == total, "every rollout started: released as the queue drained"
    lines = [line for line, _index in queue.released()]
    assert len(lines) == total
    assert lines == sorted(lines), "still in line order"
