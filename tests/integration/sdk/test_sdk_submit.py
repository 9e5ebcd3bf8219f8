"""Submitting through the SDK (moto): files validated locally then uploaded with their options and the batch id
ingestion derives; in-memory payloads through ingestion's own code; status, cancel and export from the ledger;
attaching by stack name with helpful errors. One test runs submit -> ingestion -> lifecycle -> SDK groups."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest

from rollout_pipeline.adapters import clients
from rollout_pipeline.contracts import CLAIM_CHECK_BYTES, FileOptions, RolloutMessage
from rollout_pipeline.fakes.acr import AgentBehaviour, Behaviour, FakeAgentRuntime, FakeInvocation
from rollout_pipeline.ingest.core import parse_ingest_message
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.sdk import (
    BatchNotFound,
    DatasetInvalid,
    Experiment,
    ExperimentNotDeployed,
    NoCredentials,
    SdkError,
)
from tests.conftest import REGION, receive_all
from tests.integration.conftest import WAIT
from tests.integration.lifecycle_support import drive, make_deps, moto_lock  # noqa: F401 - fixture

pytestmark = pytest.mark.usefixtures("resources")


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def ingest_pending(exp: Experiment) -> None:
    """Run ingestion over the ingest queue (what the ingest Lambda does)."""
    from rollout_pipeline.adapters.eventbridge import EventBridgePublisher
    from rollout_pipeline.adapters.s3 import S3ObjectStore
    from rollout_pipeline.adapters.sqs import SqsQueue
    from rollout_pipeline.feed.feed import Feed
    from rollout_pipeline.ingest.core import Ingestion, IngestPorts

    ledger, queue, settings = exp.ledger(), SqsQueue(), exp.settings()
    ports = IngestPorts(
        store=S3ObjectStore(),
        queue=queue,
        publisher=EventBridgePublisher(exp.bus_name),
        ledger=ledger,
        settings=settings,
        feed=Feed(ledger, queue, settings),
    )
    for body in receive_all(exp.settings().ingest_queue_url):
        Ingestion(ports).handle_message(body, owner="test")


def _reward_from_payload(inv: FakeInvocation) -> AgentBehaviour:
    if inv.payload.get("fail"):
        return AgentBehaviour(kind="agent_error")
    return AgentBehaviour(rewards=float(inv.payload.get("k", 1)) * (inv.payload["_rollout"]["index"] + 1))


@pytest.fixture
def fake_behaviour() -> Behaviour:
    return _reward_from_payload


# ------------------------------------------------------------------------------------------------- files


def test_submit_file_uploads_with_options_and_returns_ingestions_batch_id(
    experiment: Experiment, resources: ExperimentResources, tmp_path: Path
) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", [{"id": "q1", "prompt": "a"}, {"prompt": "b"}])
    batch_id = experiment.submit_file(
        path, group_size=3, sampling_params={"temperature": 0.5}, timeout_s=60, max_attempts=1, policy_version="v2"
    )
    assert batch_id.startswith("train-")
    head = clients.client("s3").head_object(Bucket=resources.input_bucket, Key="datasets/train.jsonl")
    options = FileOptions.from_metadata(resources.config, head["Metadata"])
    assert options.group_size == 3
    assert options.rollout_timeout_s == 60
    assert options.max_attempts == 1
    assert options.policy_version == "v2"
    assert options.sampling_params.temperature == 0.5
    (event,) = receive_all(resources.ingest_queue_url)
    assert parse_ingest_message(event).batch_id == batch_id, "the SDK and ingestion agree on the batch id"


def test_resubmitting_the_same_file_is_a_new_batch(experiment: Experiment, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [{"prompt": "x"}])
    assert experiment.submit_file(path) != experiment.submit_file(path)


def test_gzip_and_json_array_files_are_validated_too(experiment: Experiment, tmp_path: Path) -> None:
    gz = tmp_path / "g.jsonl.gz"
    gz.write_bytes(gzip.compress(b'{"prompt": "a"}\n{"id": "bad/id"}\n'))
    with pytest.raises(DatasetInvalid, match=r"g\.jsonl\.gz:2: invalid_id"):
        experiment.submit_file(gz)
    arr = write_jsonl(tmp_path / "arr.json", ['[{"prompt": "a"}, {"prompt": "b"}]'])
    assert experiment.submit_file(arr)


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (['{"prompt": "a"}', "{not json"], r"bad\.jsonl:2: invalid_json: invalid JSON"),
        (
            ['{"id": "q", "p": 1}', '{"id": "q", "p": 2}'],
            r"bad\.jsonl:2: duplicate_id: id 'q' is already used on line 1",
        ),
        (["[1, 2]"], r"bad\.jsonl:1: not_an_object"),
        (['{"_rollout": {"exp_id": "x"}}'], r"bad\.jsonl:1: invalid_rollout: _rollout may not set exp_id"),
        (["", "  "], r"bad\.jsonl: the file has no rows"),
        (['{"id": "a+b"}'], r"bad\.jsonl:1: invalid_id: id 'a\+b' must not contain '\+'"),
    ],
)
def test_invalid_file_is_refused_before_upload(
    experiment: Experiment, resources: ExperimentResources, tmp_path: Path, rows: list[str], expected: str
) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DatasetInvalid, match=expected):
        experiment.submit_file(path)
    assert "Contents" not in clients.client("s3").list_objects_v2(Bucket=resources.input_bucket)


@pytest.mark.parametrize(
    ("file_name", "key", "named"),
    [("with space.jsonl", None, "a space"), ("ok.jsonl", "a+b.jsonl", "'+'"), ("ok.jsonl", "p%41.jsonl", "'%'")],
)
def test_a_dataset_key_with_plus_percent_or_space_is_refused_before_upload(
    experiment: Experiment,
    resources: ExperimentResources,
    tmp_path: Path,
    file_name: str,
    key: str | None,
    named: str,
) -> None:
    path = write_jsonl(tmp_path / file_name, ['{"prompt": "a"}'])
    with pytest.raises(DatasetInvalid, match=f"invalid_key: dataset key .* contains {re.escape(named)}") as info:
        experiment.submit_file(path, key=key)
    assert str(path) in str(info.value)
    assert "Contents" not in clients.client("s3").list_objects_v2(Bucket=resources.input_bucket)


def test_invalid_rows_are_counted_in_the_message(experiment: Experiment, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", ["{", '{"ok": 1}', "[", "{"])
    with pytest.raises(DatasetInvalid) as info:
        experiment.submit_file(path)
    assert "(and 2 more invalid row(s))" in str(info.value)
    assert [where for where, _ in info.value.problems] == ["1", "3", "4"]


def test_missing_file_unsupported_suffix_and_bad_options(experiment: Experiment, tmp_path: Path) -> None:
    with pytest.raises(DatasetInvalid, match="no such file"):
        experiment.submit_file(tmp_path / "nope.jsonl")
    csv = tmp_path / "d.csv"
    csv.write_text("a,b\n")
    with pytest.raises(DatasetInvalid, match="unsupported dataset file"):
        experiment.submit_file(csv)
    good = write_jsonl(tmp_path / "d.jsonl", [{"p": 1}])
    with pytest.raises(SdkError, match="group_size"):
        experiment.submit_file(good, group_size=0)
    with pytest.raises(SdkError, match="temperature"):
        experiment.submit_file(good, sampling_params={"temperature": -1})


# ---------------------------------------------------------------------------------------------- payloads


def test_submit_payloads_creates_batch_groups_messages_and_batch_accepted(
    experiment: Experiment, resources: ExperimentResources
) -> None:
    big = {"id": "big", "prompt": "x" * (CLAIM_CHECK_BYTES + 10)}
    batch_id = experiment.submit([{"id": "q1", "prompt": "a"}, big], group_size=2, name="mem")
    assert batch_id.startswith("mem-")
    status = experiment.status(batch_id)
    assert (status.status, status.rollouts_total, status.queued, status.running) == ("accepted", 4, 4, 0)
    messages = [RolloutMessage.model_validate(b) for b in receive_all(resources.rollout_queue_url)]
    assert sorted((m.input_id, m.index) for m in messages) == [("big", 0), ("big", 1), ("q1", 0), ("q1", 1)]
    big_refs = {m.payload_ref for m in messages if m.input_id == "big"}
    assert len(big_refs) == 1
    assert next(iter(big_refs)) == f"s3://{resources.input_bucket}/claims/{batch_id}/big.json", "claim check"
    assert all(m.payload == {"prompt": "a"} for m in messages if m.input_id == "q1")
    accepted = list(experiment.events(batch_id=batch_id, timeout=2, poll_wait_s=WAIT))
    assert [(e.detail_type, e.detail.rollouts_enqueued) for e in accepted] == [("Batch Accepted", 4)]  # type: ignore[union-attr]


def test_invalid_payloads_raise_before_anything_is_written(
    experiment: Experiment, resources: ExperimentResources
) -> None:
    with pytest.raises(DatasetInvalid, match=r"payloads:#1: invalid_id"):
        experiment.submit([{"prompt": "a"}, {"id": "../x"}])
    with pytest.raises(DatasetInvalid, match="no payloads"):
        experiment.submit([])
    assert receive_all(resources.rollout_queue_url) == []


# ------------------------------------------------------------------------------------ through the pipeline


@pytest.mark.usefixtures("moto_lock")
def test_submit_lifecycle_and_groups_through_the_sdk(
    experiment: Experiment, resources: ExperimentResources, deps: LifecycleDeps, tmp_path: Path
) -> None:
    path = write_jsonl(tmp_path / "e2e.jsonl", [{"id": "q1", "k": 1}, {"id": "q2", "k": 2}, {"id": "q3", "fail": 1}])
    batch_id = experiment.submit_file(path, group_size=2)
    ingest_pending(experiment)
    drive(resources, deps)
    groups = {g.input_id: g for g in experiment.groups(batch_id, timeout=15, poll_wait_s=WAIT, grace_s=1)}
    assert sorted(groups) == ["q1", "q2", "q3"]
    assert groups["q1"].rewards == [1.0, 2.0]
    assert groups["q1"].advantages(eps=0.0) == pytest.approx([-1.0, 1.0])
    assert groups["q2"].rewards == [2.0, 4.0]
    assert groups["q3"].rewards == [None, None]
    assert groups["q3"].advantages() == [None, None]
    assert all(not g.missing for g in groups.values())

    status = experiment.status(batch_id)
    assert status.done
    assert (status.succeeded, status.failed, status.failed_by_reason) == (4, 2, {"agent_error": 2})
    assert status.reward_mean == pytest.approx(9.0 / 4)
    assert (status.running, status.queued) == (0, 0)

    out = tmp_path / "out.jsonl"
    assert experiment.export(batch_id, out, include_payload=True) == 6
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    by_key = {(r["input_id"], r["index"]): r for r in lines}
    assert by_key[("q2", 1)]["state"] == "succeeded"
    assert by_key[("q2", 1)]["reward"] == 4.0
    assert by_key[("q2", 1)]["result"]["rewards"] == 4.0
    assert by_key[("q2", 1)]["payload"] == {"k": 2}
    assert by_key[("q3", 0)]["state"] == "failed"
    assert by_key[("q3", 0)]["reason"] == "agent_error"
    assert by_key[("q3", 0)]["result"]["status_code"] == 500


@pytest.mark.usefixtures("moto_lock")
def test_cancel_ends_every_rollout_as_cancelled(
    experiment: Experiment, resources: ExperimentResources, fake: FakeAgentRuntime
) -> None:
    batch_id = experiment.submit([{"id": "q1"}, {"id": "q2"}], group_size=2)
    report = experiment.cancel(batch_id, runtime=fake)
    assert report.cancelled == 4
    status = experiment.status(batch_id)
    assert status.status == "cancelled"
    assert status.failed_by_reason == {"cancelled": 4}
    assert status.done
    assert experiment.cancel(batch_id, runtime=fake).cancelled == 0, "idempotent"
    with pytest.raises(BatchNotFound):
        experiment.cancel("nope-000000000000", runtime=fake)


def test_a_rejected_file_cannot_be_cancelled(experiment: Experiment, fake: FakeAgentRuntime) -> None:
    experiment.ledger().batches.create_rejected_batch(  # what ingestion records for a file with bad metadata
        exp_id="test-exp",
        batch_id="r-000000000000",
        options=None,
        source="s3://in/datasets/r.jsonl",
        error="file rejected: metadata group-size: bad",
        errors_uri=None,
        group_size=2,
    )
    with pytest.raises(SdkError, match="cannot be cancelled: it was rejected as a whole"):
        experiment.cancel("r-000000000000", runtime=fake)
    assert experiment.status("r-000000000000").error == "file rejected: metadata group-size: bad"


def test_status_and_export_of_unknown_batch(experiment: Experiment, tmp_path: Path) -> None:
    with pytest.raises(BatchNotFound, match="no batch 'nope-1'"):
        experiment.status("nope-1")
    with pytest.raises(BatchNotFound):
        experiment.export("nope-1", tmp_path / "x.jsonl")


def test_export_before_dispatch_lists_queued_rollouts(experiment: Experiment, tmp_path: Path) -> None:
    batch_id = experiment.submit([{"id": "q1", "p": 1}], group_size=2)
    out = tmp_path / "q.jsonl"
    assert experiment.export(batch_id, out) == 2
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["rollout_id"], r["state"], r["result"]) for r in rows] == [
        ("q1#0", "queued", None),
        ("q1#1", "queued", None),
    ]


# ------------------------------------------------------------------------------------------------ attach


def _deploy_stack(outputs: dict[str, str], name: str = "Rollouts-test-exp") -> None:
    template = {
        "Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
        "Outputs": {key: {"Value": value} for key, value in outputs.items()},
    }
    clients.client("cloudformation").create_stack(StackName=name, TemplateBody=json.dumps(template))


def test_attach_reads_the_stack_outputs_once(resources: ExperimentResources) -> None:
    _deploy_stack(resources.stack_outputs())
    exp = Experiment.attach("test-exp", region=REGION)
    assert exp.outputs == resources.stack_outputs()
    assert exp.config == resources.config
    assert exp.trainer_queue_url == resources.trainer_queue_url
    # The warm pool's queue is the functions' own, not a stack output.
    assert exp.settings() == resources.settings().model_copy(update={"warm_queue_url": ""})


def test_attach_errors_are_helpful(resources: ExperimentResources) -> None:
    with pytest.raises(ExperimentNotDeployed, match=r"experiment 'other' is not deployed in us-east-1 \(no stack"):
        Experiment.attach("other", region=REGION)
    with pytest.raises(SdkError, match="invalid experiment name"):
        Experiment.attach("Bad_Name", region=REGION)
    outputs = resources.stack_outputs()
    del outputs["TrainerQueueUrl"]
    with pytest.raises(SdkError, match="stack outputs are missing TrainerQueueUrl"):
        Experiment.from_outputs(outputs)
    with pytest.raises(SdkError, match="ExperimentConfig output is not a valid"):
        Experiment.from_outputs({**resources.stack_outputs(), "ExperimentConfig": "{}"})


def test_no_credentials_is_reported_without_reaching_aws(no_aws_credentials: None) -> None:
    # An argument, not a usefixtures mark: it must run after the module's `resources` (which sets fake credentials).
    with pytest.raises(NoCredentials, match="no AWS credentials found"):
        # Signing fails before anything is sent, and `.invalid` never resolves: nothing can leave the machine.
        # (Not a loopback endpoint: those are local mode, which needs no credentials.)
        Experiment.attach("test-exp", region=REGION, endpoint_url="https://cloudformation.example.invalid")


def test_fetch_result_checks_the_uri(experiment: Experiment, resources: ExperimentResources) -> None:
    with pytest.raises(SdkError, match="not an s3:// URI"):
        experiment.fetch_result("https://x/y")
    clients.client("s3").put_object(Bucket=resources.results_bucket, Key="a/b/c.json", Body=b"[1]")
    with pytest.raises(SdkError, match="does not hold a JSON object"):
        experiment.fetch_result(f"s3://{resources.results_bucket}/a/b/c.json")
    clients.client("s3").put_object(
        Bucket=resources.results_bucket, Key="a/b/d.json", Body=b'{"x": "' + b"y" * 50 + b'"}'
    )
    with pytest.raises(SdkError, match="larger than 10 bytes"):
        experiment.fetch_result(f"s3://{resources.results_bucket}/a/b/d.json", max_bytes=10)


def test_fetch_result_reads_like_completion(experiment: Experiment, resources: ExperimentResources) -> None:
    """The SDK reads result objects with `contracts.read_result`: unreadable JSON and a missing object are
    `SdkError`s (not a JSONDecodeError or a raw botocore error), and an agent error's body is returned as written."""
    s3 = clients.client("s3")
    s3.put_object(Bucket=resources.results_bucket, Key="a/b/e.json", Body=b"{not json")
    with pytest.raises(SdkError, match="does not hold a JSON object"):
        experiment.fetch_result(f"s3://{resources.results_bucket}/a/b/e.json")
    with pytest.raises(SdkError, match="does not exist"):
        experiment.fetch_result(f"s3://{resources.results_bucket}/a/b/missing.json")
    s3.put_object(Bucket=resources.results_bucket, Key="a/b/f.json", Body=b'{"status_code": 500, "stop_reason": "x"}')
    assert experiment.fetch_result(f"s3://{resources.results_bucket}/a/b/f.json") == {
        "status_code": 500,
        "stop_reason": "x",
    }


def test_submitted_rows_are_validated_once(
    experiment: Experiment, resources: ExperimentResources, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An SDK submission parses each row once (`submission.validate_payloads`); ingestion takes the parsed rows, and
    `RolloutClient.submit_many` does not validate again through `Experiment.submit`."""
    from rollout_pipeline.contracts import rows as rows_module
    from rollout_pipeline.ingest import core
    from rollout_pipeline.sdk import submission

    parsed: list[int] = []
    real = rows_module.parse_row

    def counting(raw: Any, position: int) -> Any:
        parsed.append(position)
        return real(raw, position)

    monkeypatch.setattr(submission, "parse_row", counting)
    monkeypatch.setattr(core, "parse_row", counting)
    experiment.submit([{"id": "q1", "prompt": "a"}, {"id": "q2", "prompt": "b"}], group_size=1, name="once")
    assert parsed == [1, 2]
    parsed.clear()
    client = experiment.rollout_client(poll_wait_s=WAIT)  # close() ends the client's long poll within WAIT
    try:
        futures = client.submit_many([{"id": "r1", "prompt": "a"}, {"prompt": "b"}], name="once")
    finally:
        client.close()
    assert [f.input_id for f in futures] == ["r1", "line-2"]
    assert parsed == [1, 2]
    receive_all(resources.rollout_queue_url)
