"""`rollouts smoke` against local mode (`--endpoint-url`, a `LocalPipeline` with the fake agent runtime): the tiny
batch from upload to `Batch Completed` under a key with `+` and a space, every session stopped, no dead letter, the
S3 event's key recorded; the account-only checks say "skipped: local"; nothing the run created is left behind.

Under the faithful AWS profile the S3 event carries the key URL-encoded (as the S3-to-SQS format does); plain moto
carries it raw, which the smoke records, and an ingest stage that decodes a raw key once more is a `fail` naming
the key it read instead."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout_pipeline.adapters.s3 import S3ObjectStore
from rollout_pipeline.cli import EXIT_OK, main
from rollout_pipeline.fakes.acr import AgentBehaviour, FakeAgentRuntime
from rollout_pipeline.local.pipeline import REGION, LocalPipeline, LocalSettings
from rollout_pipeline.ops.smoke import SmokeCheck, run_smoke


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[LocalPipeline]:
    settings = LocalSettings(
        experiment="smoke",
        group_size=1,
        model_url="http://127.0.0.1:9/v1",
        max_sessions=4,
        sweep_interval_s=5.0,
        runtime_factory=lambda resources: FakeAgentRuntime(store=S3ObjectStore(), behaviour=AgentBehaviour()),
        work_dir=tmp_path / "work",
    )
    with LocalPipeline(settings) as running:
        yield running


def queue_and_rule_names(pipeline: LocalPipeline) -> tuple[list[str], list[str]]:
    sqs, events = pipeline.clients.client("sqs"), pipeline.clients.client("events")
    queues = sorted(u.rsplit("/", 1)[-1] for u in sqs.list_queues().get("QueueUrls", []))
    assert pipeline.resources is not None
    rules = sorted(
        r["Name"]
        for bus in ("default", pipeline.resources.bus_name)
        for r in events.list_rules(EventBusName=bus)["Rules"]
    )
    return queues, rules


def by_name(checks: list[SmokeCheck]) -> dict[str, SmokeCheck]:
    return {check.name: check for check in checks}


def test_smoke_passes_against_local_mode_and_cleans_up(pipeline: LocalPipeline, tmp_path: Path) -> None:
    assert pipeline.resources is not None
    before = queue_and_rule_names(pipeline)
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps(pipeline.resources.stack_outputs()))
    out = io.StringIO()
    argv = ["smoke", "--outputs-file", str(outputs), "--endpoint-url", pipeline.endpoint_url, "--region", REGION]
    code = main([*argv, "--timeout", "120", "--poll-wait", "1"], out=out)
    lines = out.getvalue().splitlines()
    assert code == EXIT_OK, lines
    names = [line.split(":", 1)[0].split(None, 1)[1] for line in lines]
    assert names == [
        "special key",
        "batch",
        "sessions stopped",
        "dead letters",
        "event key",
        "missing key",
        "alarm delivery",
        "agentcore metrics",
        "quota codes",
        "cleanup",
    ]
    status = {name: line.split(None, 1)[0] for name, line in zip(names, lines, strict=True)}
    passed = [n for n, s in status.items() if s == "pass"]
    assert passed == ["batch", "sessions stopped", "dead letters", "cleanup"]
    # The pipeline refuses dataset keys with `+`, `%` or a space (they may or may not reach it URL-encoded): the
    # refusal is recorded and the batch runs under a plain key.
    assert lines[0].startswith("skipped special key: the pipeline refused the key 'datasets/smoke-")
    for account_only in ("missing key", "alarm delivery", "agentcore metrics", "quota codes"):
        assert f"skipped {account_only}: local" in lines
    (key_line,) = [line for line in lines if " event key: " in line]
    assert key_line.startswith("skipped event key: local: the S3 event carried 'datasets/smoke-")
    assert "URL-encoded (+ for spaces)" in key_line  # the faithful profile's encoding
    assert "(3 rollouts, key 'datasets/smoke-" in lines[1]
    assert "rename the file" in lines[0]
    assert queue_and_rule_names(pipeline) == before  # every queue and rule the run made is gone
    assert pipeline.active_sessions() == []


def test_a_batch_that_never_completes_is_a_fail_with_what_to_do(pipeline: LocalPipeline) -> None:
    for consumer in pipeline.consumers:  # nothing ingests: no `Batch Completed` can come
        consumer.stop()
    checks = by_name(run_smoke(pipeline.experiment, rows=1, timeout_s=3, poll_wait_s=1))
    assert checks["batch"].status == "fail"
    assert "no `Batch Completed`" in checks["batch"].message
    assert "rollouts status -e smoke --batch " in checks["batch"].message
    assert checks["sessions stopped"].status == "skipped"
    assert checks["special key"].status == "skipped"
    assert checks["cleanup"].status == "pass"


@pytest.mark.plain_moto
def test_smoke_records_a_raw_key_and_names_a_misread_one(pipeline: LocalPipeline) -> None:
    """Plain moto carries the key raw: the `event key` line records it. A pipeline that decoded it once more would
    read `a b` for `a+b` (a `special key` fail naming it); this one refuses such keys clearly, whatever the encoding,
    and the batch runs under a plain key so the rest of the pipeline is still checked."""
    checks = by_name(run_smoke(pipeline.experiment, rows=1, timeout_s=60, poll_wait_s=1))
    assert checks["event key"].status == "skipped"
    assert "' raw: '" in checks["event key"].message
    special = checks["special key"]
    assert special.status == "skipped", special
    assert "refused the key" in special.message
    assert checks["batch"].status == "pass", checks["batch"]
    assert checks["sessions stopped"].status == "pass"
    assert checks["cleanup"].status == "pass"
