"""Warm sessions' idle memory is priced at the experiment's own prices and session size (`costs.PriceBook`), by
`exp.capacity.warm_pool()`'s status and by the local demo alike: one home for the prices."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.costs import PriceBook
from rollout_pipeline.ledger.warm_items import WarmPoolState, WarmSession, WarmState
from rollout_pipeline.local.demo import DemoResult, _count_warm
from rollout_pipeline.sdk.warm import WarmPoolStatus

#: An experiment whose prices and session size are not the table's defaults (us-east-1, 8 GB).
CONFIG = ExperimentConfig(name="exp", session_memory_gb=2.0, acr_gb_hour_usd=0.02, acr_vcpu_hour_usd=0.1)


def prices() -> PriceBook:
    return PriceBook.of(CONFIG, "eu-west-1")


def test_idle_memory_is_priced_at_the_experiments_price_book() -> None:
    book = prices()
    assert book.memory_gb_s(1800.0) == 3600.0  # 2 GB a session
    assert book.memory_usd(1800.0) == pytest.approx(0.5 * 2.0 * 0.02)
    small = PriceBook.of(CONFIG.model_copy(update={"session_memory_gb": 0.125}), "eu-west-1")
    assert small.memory_gb_s(10.0) == 1.25  # AgentCore's minimum billed size


def test_the_warm_pool_status_prices_its_idle_memory_at_the_experiments_prices() -> None:
    now = 1_900_000_000.0
    waiting = WarmSession("s-1", WarmState.IDLE, warmed_at=now - 1800.0, kept_at=now - 10.0)
    status = WarmPoolStatus.of(CONFIG, WarmPoolState(unused_idle_s=3600.0), [waiting], now, prices())
    assert status.idle_gb_s == 2.0 * 5400.0
    assert status.idle_usd == pytest.approx(1.5 * 2.0 * 0.02)
    shown = status.as_dict()
    assert (shown["memory_gb"], shown["gb_hour_usd"]) == (2.0, 0.02)
    assert "2 GB sessions" in shown["priced_as"]
    assert "prices" not in shown


def test_the_local_demo_prices_a_warm_sessions_wait_at_the_experiments_prices() -> None:
    report = DemoResult()
    dispatched = datetime(2026, 11, 26, tzinfo=UTC)
    timings = SimpleNamespace(session_warmed_at=dispatched - timedelta(seconds=900), dispatched_at=dispatched)
    _count_warm(report, SimpleNamespace(timings=timings), prices())  # type: ignore[arg-type]
    assert report.warm_started == 1
    assert report.warm_idle_gb_s == 1800.0
    assert report.warm_idle_usd == pytest.approx(0.25 * 2.0 * 0.02)
