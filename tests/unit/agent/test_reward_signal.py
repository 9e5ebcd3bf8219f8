"""A batch whose rewards are all equal (every rollout scored 0, typically: rows the agent does not read as it expects)
gives a trainer nothing to learn from: `Batch Completed` says so, and the SDK logs it once per batch."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

import pytest

from rollout_pipeline.contracts import EVENT_SOURCE, BatchCompleted
from rollout_pipeline.sdk.transport import NO_REWARD_SIGNAL, parse_envelope

AT = datetime(2026, 11, 1, tzinfo=UTC)


def _completed(batch_id: str, mean: float | None, std: float | None, count: int) -> BatchCompleted:
    return BatchCompleted(
        event_id=f"e-{batch_id}",
        exp_id="exp",
        batch_id=batch_id,
        rollouts_total=count,
        succeeded=count,
        failed=0,
        failed_by_reason={},
        reward_mean=mean,
        reward_std=std,
        reward_count=count,
        started_at=AT,
        completed_at=AT,
        duration_s=0.0,
    )


def test_a_batch_of_equal_rewards_has_no_signal() -> None:
    assert _completed("b", 0.0, 0.0, 24).reward_signal_warning == (
        "no reward signal in batch b: all 24 rewards are 0 (every GRPO advantage is 0); check that the rows carry "
        "what the agent reads and that its reward can be earned"
    )
    assert _completed("b", 1.0, 0.0, 2).reward_signal_warning is not None
    assert _completed("b", 0.25, 0.43, 24).reward_signal_warning is None
    assert _completed("b", 0.0, 0.0, 1).reward_signal_warning is None  # one reward tells nothing
    assert _completed("b", None, None, 0).reward_signal_warning is None  # nothing succeeded: failures say why


def _envelope(detail: BatchCompleted) -> str:
    return json.dumps(
        {"source": EVENT_SOURCE, "detail-type": "Batch Completed", "detail": json.loads(detail.model_dump_json())}
    )


def test_the_sdk_logs_it_once_per_batch(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="rollout_pipeline.sdk.transport")
    flat = _envelope(_completed("flat-batch", 0.0, 0.0, 8))
    for _ in range(3):  # redeliveries, or several readers in one process
        _envelope_detail = parse_envelope(flat)[1]
        assert _envelope_detail is not None
    parse_envelope(_envelope(_completed("good-batch", 0.5, 0.5, 8)))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == [_completed("flat-batch", 0.0, 0.0, 8).reward_signal_warning]
    assert getattr(warnings[0], NO_REWARD_SIGNAL)  # `rollouts local demo` filters it out: its summary says it
