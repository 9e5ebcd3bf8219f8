"""Every pipeline log line about a rollout carries exp_id, batch_id, rollout_id and session_id (Lambda JSON logs)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from aws_lambda_powertools import Logger

from rollout_pipeline import observability
from rollout_pipeline.lifecycle import completion, dispatch, sweeper


@pytest.fixture
def lambda_logger(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Logger, io.StringIO]]:
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "fn")
    stream = io.StringIO()
    logger = Logger(service="rollout-test-logs", logger_handler=logging.StreamHandler(stream))
    saved = {
        mod.log.name: (list(mod.log.handlers), mod.log.level, mod.log.propagate)
        for mod in (dispatch, completion, sweeper)
    }
    yield logger, stream
    observability.clear_log_ids()
    observability._installed.discard(logger.name)
    for mod in (dispatch, completion, sweeper):
        handlers, level, propagate = saved[mod.log.name]
        mod.log.handlers[:] = handlers
        mod.log.setLevel(level)
        mod.log.propagate = propagate


def lines(stream: io.StringIO) -> list[dict[str, str]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_library_and_handler_lines_carry_the_ids(lambda_logger: tuple[Logger, io.StringIO]) -> None:
    logger, stream = lambda_logger
    observability.install_log_ids(logger, "exp-a")
    observability.bind_log_ids(batch_id="b1", rollout_id="in1-0", session_id="b1-0000-1-abcdef" * 3)
    dispatch.log.info("library line")
    completion.log.warning("another module")
    logger.info("handler line")
    observability.clear_log_ids()
    sweeper.log.info("sweep done")
    first, second, third, last = lines(stream)
    for line in (first, second, third):
        assert {k: line[k] for k in observability.LOG_KEYS} == {
            "exp_id": "exp-a",
            "batch_id": "b1",
            "rollout_id": "in1-0",
            "session_id": "b1-0000-1-abcdef" * 3,
        }
    assert last["exp_id"] == "exp-a"
    assert "rollout_id" not in last


def test_outside_lambda_the_library_loggers_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_LAMBDA_FUNCTION_NAME", raising=False)
    before = list(dispatch.log.handlers)
    observability.install_log_ids(Logger(service="rollout-local"), "exp-b")
    assert dispatch.log.handlers == before
