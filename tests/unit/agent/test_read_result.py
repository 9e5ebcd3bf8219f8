"""`contracts.read_result`: the one reader of result objects (completion, inline results, the SDK)."""

from __future__ import annotations

import json

import pytest

from rollout_pipeline.contracts import MAX_ABS_REWARD, FailureReason, parse_result, read_result
from rollout_pipeline.ports import ObjectNotFound
from tests.doubles import MemoryStore


def test_a_success_is_parsed_with_its_body() -> None:
    store = MemoryStore({("b", "ok"): json.dumps({"status_code": 200, "rewards": [0.5, 1.0]}).encode()})
    read = read_result(store, "b", "ok", max_bytes=1024)
    assert not read.too_large
    assert read.outcome.success
    assert read.outcome.reward == 1.0
    assert read.outcome.body == {"status_code": 200, "rewards": [0.5, 1.0]}


def test_an_oversized_result_is_invalid_and_names_its_size() -> None:
    store = MemoryStore({("b", "big"): b'{"x": "' + b"y" * 100 + b'"}'})
    read = read_result(store, "b", "big", max_bytes=10)
    assert read.too_large
    assert read.size == 109
    assert read.limit == 10
    assert read.outcome.reason is FailureReason.INVALID_RESULT
    assert read.outcome.error == "result is 109 bytes; larger than the limit of 10 bytes"
    assert read.outcome.body is None


@pytest.mark.parametrize(("body", "error"), [(b"not json", "not valid JSON"), (b"[1]", "must be a JSON object")])
def test_unreadable_results_have_no_body(body: bytes, error: str) -> None:
    read = read_result(MemoryStore({("b", "k"): body}), "b", "k", max_bytes=1024)
    assert read.outcome.reason is FailureReason.INVALID_RESULT
    assert error in str(read.outcome.error)
    assert read.outcome.body is None


def test_a_missing_result_raises_object_not_found() -> None:
    with pytest.raises(ObjectNotFound):
        read_result(MemoryStore(), "b", "gone", max_bytes=1024)


@pytest.mark.parametrize("rewards", [1e61, -2e60, [0.5, 1e61]])
def test_rewards_beyond_the_ledgers_range_are_invalid_wherever_a_result_is_read(rewards: object) -> None:
    outcome = parse_result(json.dumps({"rewards": rewards}).encode())
    assert (outcome.success, outcome.reason) == (False, FailureReason.INVALID_RESULT)
    assert outcome.error == f"rewards beyond +-{MAX_ABS_REWARD:g} are not supported"
    assert parse_result(json.dumps({"rewards": MAX_ABS_REWARD}).encode()).success
