"""The scale benches' harness arithmetic (`bench/harness.py`): the dilated clock, the request classification and
the window counts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.doubles import ManualClock

BENCH = Path(__file__).resolve().parents[3] / "bench" / "harness.py"  # the scale benches' shared harness


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_harness_under_test", BENCH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_dilated_clock_runs_k_times_slower(bench: ModuleType) -> None:
    real = ManualClock(1000.0)
    clock = bench.DilatedClock(5, real_time=real.time, real_monotonic=real.time, real_sleep=real.sleep)
    start_wall, start_mono = clock.time(), clock.monotonic()
    clock.sleep(2.0)  # two virtual seconds last ten wall seconds
    assert real.slept == [10.0]
    assert clock.time() - start_wall == pytest.approx(2.0)
    assert clock.monotonic() - start_mono == pytest.approx(2.0)
    real.advance(5.0)
    assert clock.time() - start_wall == pytest.approx(3.0)
    assert clock.wall_s(0.015) == pytest.approx(0.075)
    clock.sleep(-1.0)
    assert real.slept == [10.0]


def test_dilated_clock_refuses_to_run_faster(bench: ModuleType) -> None:
    with pytest.raises(ValueError):
        bench.DilatedClock(0.5)


def test_ledger_items_are_classified_by_kind(bench: ModuleType) -> None:
    cat = bench.item_category
    assert cat("LIMIT", "SESSIONS") == "LIMIT/SESSIONS"
    assert cat("LIMIT", "PACE#session#3") == "LIMIT/PACE#session#3"
    assert cat("LIMIT", "WAIT#abc") == "LIMIT/WAIT#*"
    assert cat("B#b1", "BATCH") == "BATCH"
    assert cat("B#b1", "BATCH#COUNT#07") == "BATCH#COUNT#*"
    assert cat("B#b1", "G#row-1") == "group G#*"
    assert cat("B#b1", "R#row-1#0") == "rollout R#*"


def test_a_transaction_counts_every_item_it_touches(bench: ModuleType) -> None:
    def key(pk: str, sk: str) -> dict[str, dict[str, str]]:
        return {"pk": {"S": pk}, "sk": {"S": sk}}

    params = {
        "TransactItems": [
            {"Update": {"TableName": "t", "Key": key("LIMIT", "SESSIONS")}},
            {"Put": {"TableName": "t", "Item": {**key("B#b", "R#row-0#1"), "x": {"N": "1"}}}},
            {"ConditionCheck": {"TableName": "t", "Key": key("B#b", "BATCH#CONTROL")}},
        ]
    }
    assert bench.request_items("TransactWriteItems", params) == ["LIMIT/SESSIONS", "rollout R#*", "BATCH#CONTROL"]
    assert bench.request_items("GetItem", {"Key": key("LIMIT", "PACE#tps")}) == ["LIMIT/PACE#tps"]
    assert bench.request_items("Query", {"IndexName": "outbox"}) == ["index outbox"]


def test_sliding_window_and_steady_rate(bench: ModuleType) -> None:
    times = [0.0, 0.5, 0.99, 1.0, 1.2, 3.0]
    assert bench.sliding_max(times) == 4  # [0.5, 1.5) holds 0.5, 0.99, 1.0, 1.2
    assert bench.sliding_max([]) == 0
    evenly = [i * 0.25 for i in range(100)]
    assert bench.steady_rate(evenly) == pytest.approx(4.0)


def test_threads_map_to_stages(bench: ModuleType) -> None:
    assert bench.stage_of("lc-dispatcher-0") == "dispatch"
    assert bench.stage_of("dispatch_3") == "dispatch"
    assert bench.stage_of("stop_0") == "completion"
    assert bench.stage_of("lc-sweeper") == "sweeper"
    assert bench.stage_of("Thread-7") == "other"


def test_request_units_follow_the_cost_method(bench: ModuleType) -> None:
    assert bench.request_units("UpdateItem", ["rollout R#*"]) == (1.0, 0.0)
    assert bench.request_units("TransactWriteItems", ["rollout R#*", "LIMIT/SESSIONS#*"]) == (4.0, 0.0)
    assert bench.request_units("GetItem", ["rollout R#*"]) == (0.0, 1.0)
    assert bench.request_units("Query", ["query B"]) == (0.0, 1.0)
    assert bench.request_units("BatchGetItem", ["group G#*", "group G#*"]) == (0.0, 2.0)


def test_all_in_cost_prices_what_the_pipeline_does_not_call_itself(bench: ModuleType) -> None:
    counters = bench.Counters()
    counters.other["s3.PutObject"] = 10  # the agents' result objects
    counters.poller_sqs = 4
    counters.delivered["completion"] = 10
    counters.delivered["trainer"] = 12
    counters.invoked("dispatch", bench.time.monotonic() - 2.0)  # 2 s at 512 MB: 1 GB-s
    extras = bench.all_in_extras(counters, 10)
    assert extras["s3_result_puts"] == pytest.approx(5.0)  # $0.005 per 1,000 PUTs
    assert extras["sqs_pollers_and_trainer"] == pytest.approx(0.16)
    assert extras["sqs_eventbridge_deliveries"] == pytest.approx(22 * 0.4 / 10)
    assert extras["lambda_requests"] == pytest.approx(0.02)
    assert extras["lambda_compute_arm64"] == pytest.approx(1.33334, rel=0.01)
