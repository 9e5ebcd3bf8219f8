"""The cost model (`rollout_pipeline.costs`): hand computations from the price table, the bounds, the regions'
fallback, the settings' overrides, and the pipeline's own cost tied to the scale bench's all-in model."""

from __future__ import annotations

import importlib.util
import logging
import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from rollout_pipeline import costs, ids
from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.contracts import reported_usage
from rollout_pipeline.costs import PriceBook, SessionSpan, price_rollout, price_span

REPO = Path(__file__).resolve().parents[3]
T0 = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
#: us-east-1, by hand from the pricing page: $ per second of one 8 GB session, of one busy vCPU.
MEMORY_USD_PER_S = 8 * 0.00945 / 3600
CPU_USD_PER_S = 0.0895 / 3600
PIPELINE = 28.62e-6


def book(**settings: object) -> PriceBook:
    return PriceBook.of(ExperimentConfig(name="exp", **settings), "us-east-1")  # type: ignore[arg-type]


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_stopped_session_with_measured_cpu_is_priced_by_hand() -> None:
    span = SessionSpan(attempt=1, started_at=T0, ended_at=at(40), idle=True, cpu_s=10.0, stopped_at=at(60))
    priced = price_span(span, book(), at(3600))
    assert priced.end == "stopped"
    assert priced.session_s == 60
    assert priced.memory_usd == pytest.approx(60 * MEMORY_USD_PER_S, rel=1e-12)
    assert priced.cpu == "measured"
    assert priced.cpu_usd == pytest.approx(10 * CPU_USD_PER_S, rel=1e-12)
    assert priced.usd == pytest.approx(60 * MEMORY_USD_PER_S + 10 * CPU_USD_PER_S + PIPELINE, rel=1e-9)


def test_without_a_measurement_cpu_is_bounded_by_busy_time_times_vcpus() -> None:
    span = SessionSpan(attempt=1, started_at=T0, ended_at=at(40), idle=True, stopped_at=at(60))
    priced = price_span(span, book(), at(60))
    assert priced.cpu == "bounded"
    assert priced.cpu_s == 40 * 2  # busy until its result, 2 vCPUs
    assert priced.cpu_usd == pytest.approx(80 * CPU_USD_PER_S, rel=1e-12)


def test_a_pending_stop_is_estimated_at_the_moment_and_bounded_by_the_idle_timeout() -> None:
    span = SessionSpan(attempt=1, started_at=T0, ended_at=at(40), idle=True, cpu_s=5.0)
    priced = price_span(span, book(idle_timeout_s=300), at(45))
    assert (priced.end, priced.session_s) == ("estimated", 45)
    # never stopped: it idles out 300 s after its result
    assert priced.usd_max == pytest.approx(340 * MEMORY_USD_PER_S + 5 * CPU_USD_PER_S + PIPELINE, rel=1e-9)
    closed = price_span(SessionSpan(1, T0, at(40), True, 5.0, closed_at=at(400)), book(idle_timeout_s=300), at(999))
    assert (closed.end, closed.session_s) == ("bounded", 340)


def test_a_session_that_never_finished_is_bounded_by_its_maximum_lifetime() -> None:
    config = {"rollout_timeout_s": 100, "max_lifetime_s": 700, "idle_timeout_s": 300}
    span = SessionSpan(attempt=1, started_at=T0, ended_at=at(100), idle=False, closed_at=at(800))
    priced = price_span(span, book(**config), at(900))
    assert (priced.end, priced.session_s) == ("bounded", 700)
    assert priced.cpu_s == 700 * 2  # busy, as far as anyone knows, until AgentCore ended it


def test_a_measured_cpu_above_what_the_session_could_use_is_capped() -> None:
    span = SessionSpan(attempt=1, started_at=T0, ended_at=at(5), idle=True, cpu_s=1e6, stopped_at=at(10))
    assert price_span(span, book(), at(10)).cpu_s == 10 * 2


def test_a_rollout_sums_its_sessions_and_says_how_its_ends_are_known() -> None:
    first = SessionSpan(attempt=1, started_at=T0, ended_at=at(100), idle=False, stopped_at=at(101))
    second = SessionSpan(attempt=2, started_at=at(110), ended_at=at(130), idle=True, cpu_s=3.0)
    cost = price_rollout([first, second], book(), at(131))
    assert cost.sessions == 2
    assert cost.session_end == "estimated"
    assert cost.cpu == "bounded"  # the first attempt's CPU was not measured
    assert cost.session_s == pytest.approx(101 + 21)
    # the first never wrote a result: busy (as far as anyone knows) until its stop at 101 s
    expected = (101 + 21) * MEMORY_USD_PER_S + (101 * 2 + 3) * CPU_USD_PER_S + 2 * PIPELINE
    assert cost.usd == pytest.approx(expected, rel=1e-8)
    assert cost.usd == pytest.approx(cost.agentcore_memory_usd + cost.agentcore_cpu_usd + cost.pipeline_usd)
    assert cost.usd_max >= cost.usd


def test_unknown_regions_fall_back_visibly(caplog: pytest.LogCaptureFixture) -> None:
    config = ExperimentConfig(name="exp")
    with caplog.at_level(logging.WARNING):
        found = PriceBook.of(config, "eu-central-1")
    assert found.fallback
    assert (found.vcpu_hour_usd, found.gb_hour_usd) == (0.0895, 0.00945)
    assert "eu-central-1" in found.label
    assert "no row in the price table" in found.label
    assert "eu-central-1" in caplog.text
    assert not PriceBook.of(config, "us-east-1").fallback


def test_settings_override_the_table_and_the_session_size() -> None:
    found = PriceBook.of(
        ExperimentConfig(
            name="exp",
            acr_vcpu_hour_usd=0.1,
            acr_gb_hour_usd=0.01,
            session_memory_gb=2,
            session_vcpus=1,
            pipeline_usd_per_rollout=0,
        ),
        "eu-central-1",
    )
    assert not found.fallback
    span = SessionSpan(attempt=1, started_at=T0, ended_at=at(30), idle=True, stopped_at=at(36))
    priced = price_span(span, found, at(36))
    assert priced.usd == pytest.approx(36 * 2 * 0.01 / 3600 + 30 * 1 * 0.1 / 3600, rel=1e-12)


def test_local_runs_are_labelled_as_what_they_would_cost_on_agentcore() -> None:
    arn = f"arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/rollouts_x{ids.LOCAL_RUNTIME_SUFFIX}"
    assert ids.is_local_runtime(arn)
    assert ids.runtime_region(arn) == "us-east-1"
    local = PriceBook.of(ExperimentConfig(name="x"), ids.runtime_region(arn), local=ids.is_local_runtime(arn))
    assert local.label.startswith("local run priced as on AgentCore us-east-1")
    cost = price_rollout([SessionSpan(1, T0, at(1), True, 0.1, at(2))], local, at(2))
    assert cost.local
    assert cost.priced_as == local.label


def test_the_host_usage_report_is_read_only_when_it_is_the_sessions() -> None:
    assert reported_usage({"_rollout_usage": {"cpu_s": 1.5, "rollouts": 1}}).session_cpu_s == 1.5  # type: ignore[union-attr]
    assert reported_usage({"_rollout_usage": {"cpu_s": 1.5, "rollouts": 3}}).session_cpu_s is None  # type: ignore[union-attr]
    for bad in ({"cpu_s": -1}, {"cpu_s": "x"}, {"cpu_s": float("nan")}, "junk"):
        assert reported_usage({"_rollout_usage": bad}) is None
    assert reported_usage({"rewards": 1}) is None


# ------------------------------------------------------------------------------ the pipeline's own AWS cost


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    path = REPO / "bench" / "bench_scale.py"
    spec = importlib.util.spec_from_file_location("bench_scale_for_costs", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_pipeline_cost_has_the_parts_the_scale_bench_prices(bench: ModuleType) -> None:
    counters = SimpleNamespace(other={}, poller_sqs=0, delivered={}, lambda_calls={}, lambda_s={})
    parts = set(bench.all_in_extras(counters, 1)) | {
        "dynamodb",
        "sqs_sends_by_pipeline",
        "s3_reads",
        "eventbridge_events",
    }
    assert parts == set(costs.PIPELINE_USD_PER_MILLION)
    source = (REPO / "bench" / "bench_scale.py").read_text()
    for name in ("dynamodb", "sqs_sends_by_pipeline", "s3_reads", "eventbridge_events"):
        assert f'"{name}":' in source, f"the bench no longer prices {name}"


def test_the_pipeline_cost_is_the_benchs_measurement_at_its_prices(bench: ModuleType) -> None:
    per_million = bench.PRICE_PER_MILLION
    # what the all-in run counted per rollout (docs/benchmarks.md, "Scale"), at the bench's prices
    assert 22.4 * per_million["WRU"] + 3.95 * per_million["RRU"] == pytest.approx(
        costs.PIPELINE_USD_PER_MILLION["dynamodb"], abs=0.01
    )
    assert 1 * per_million["s3_put"] == pytest.approx(costs.PIPELINE_USD_PER_MILLION["s3_result_puts"])
    assert 1 * per_million["s3_get"] == pytest.approx(costs.PIPELINE_USD_PER_MILLION["s3_reads"])
    documented = re.search(
        r"\*\*total AWS-side\*\* \| \*\*([0-9.]+)\*\*", (REPO / "docs" / "benchmarks.md").read_text()
    )
    assert documented is not None
    assert pytest.approx(float(documented.group(1)), abs=0.005) == costs.PIPELINE_USD_PER_ROLLOUT * 1e6
