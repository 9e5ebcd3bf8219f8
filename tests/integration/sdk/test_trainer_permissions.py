"""Every AWS call the trainer SDK (and so the ART backend, which calls AWS only through it) makes is allowed by the
trainer policy (`rollout_pipeline.ops.permissions`, output by the stack as `TrainerPolicyArn`), on the resource it
acts on. The calls are recorded under moto from a run of the SDK's trainer flows: submit (rows and a file, a big
payload), ART-style futures (the client's own subscription) with a result fetched from S3, status, a stream of one
batch (its own subscription, and the ledger's account of what it published), policy version, cancel, a tap and an
ART private subscription.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import botocore.client
import pytest

from rollout_pipeline.cli import EXIT_OK, main
from rollout_pipeline.contracts import CLAIM_CHECK_BYTES, INLINE_RESULT_BYTES
from rollout_pipeline.fakes.acr import AgentBehaviour, Behaviour, FakeAgentRuntime, FakeInvocation
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.ops.permissions import SUBSCRIPTION_PREFIXES, TRAINER_ACTIONS, ResourceKind, iam_actions
from rollout_pipeline.routing import DATASET_PREFIX
from rollout_pipeline.sdk import Experiment
from tests.conftest import REGION
from tests.integration.lifecycle_support import drive, moto_lock  # noqa: F401 - fixture

pytestmark = pytest.mark.usefixtures("moto_lock")
SDK_USER_AGENT = "rollout-pipeline-sdk"

Call = tuple[str, str, dict[str, Any]]


@pytest.fixture
def fake_behaviour() -> Behaviour:
    """The agent answers `k` as its reward and returns `extra` in its result (a big one goes through S3)."""

    def behaviour(inv: FakeInvocation) -> AgentBehaviour:
        return AgentBehaviour(rewards=float(inv.payload.get("k", 1)), extra=dict(inv.payload.get("extra") or {}))

    return behaviour


@contextmanager
def sdk_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Call]]:
    """Every API call made by a client of the SDK's factory (its user agent), with its parameters."""
    calls: list[Call] = []
    original = botocore.client.BaseClient._make_api_call

    def record(client: Any, operation: str, params: dict[str, Any]) -> Any:
        if SDK_USER_AGENT in (client.meta.config.user_agent_extra or ""):
            calls.append((client.meta.service_model.service_name, operation, dict(params)))
        return original(client, operation, params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", record)
    yield calls


def resource_kind(outputs: Mapping[str, str], service: str, operation: str, params: Mapping[str, Any]) -> ResourceKind:
    """Which of the experiment's resources a call acts on (as `stacks/trainer_policy.py` names them)."""
    bus = outputs["EventBusName"]
    private = tuple(f"{bus}-{prefix}" for prefix in SUBSCRIPTION_PREFIXES)
    if operation in ("ListRules", "ListQueues"):  # by this experiment's name prefix; no resource-level permission
        prefix = str(params.get("NamePrefix", params.get("QueueNamePrefix", "")))
        assert prefix.startswith(bus), prefix
        return "listing"
    if service == "sqs":
        url = str(params.get("QueueUrl", ""))
        if url == outputs["RolloutQueueUrl"]:
            return "rollout_queue"
        if url == outputs["TrainerQueueUrl"]:
            return "trainer_queue"
        name = str(params.get("QueueName", url.rsplit("/", 1)[-1]))
        assert name.startswith(private), f"{operation} on an unexpected queue {name}"
        return "subscription_queues"
    if service == "s3":
        bucket, key = params["Bucket"], str(params.get("Key", ""))
        if bucket == outputs["InputBucketName"]:
            assert key.startswith((DATASET_PREFIX, "claims/")), key
            return "datasets" if key.startswith(DATASET_PREFIX) else "claims"
        assert bucket == outputs["ResultsBucketName"]
        return "results_listing" if operation == "ListObjectsV2" else "results"
    if service == "dynamodb":
        tables = {params.get("TableName")} | {
            body["TableName"] for item in params.get("TransactItems", []) for body in item.values()
        }
        assert tables - {None} == {outputs["LedgerTableName"]}, tables
        if "IndexName" in params:  # the policy grants one index: the batch listing of Experiment.cost
            assert (operation, params["IndexName"]) == ("Query", "deadline"), params
            return "ledger_batches"
        return "ledger"
    if service == "events":
        if operation == "PutEvents":
            assert {entry["EventBusName"] for entry in params["Entries"]} == {bus}
            return "bus"
        if "ResourceARN" in params:  # tags of a rule: arn:...:rule/{bus}/{name}
            assert str(params["ResourceARN"]).rsplit("/", 1)[-1].startswith(private), params
            return "subscription_rules"
        assert params["EventBusName"] == bus
        assert str(params.get("Name", params.get("Rule"))).startswith(private)
        return "subscription_rules"
    if service == "cloudformation":
        return "stack"
    assert service == "bedrock-agentcore", service
    return "runtime"


def test_every_sdk_call_is_allowed_by_the_trainer_policy(
    resources: ExperimentResources,
    fake: FakeAgentRuntime,
    deps: LifecycleDeps,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    outputs = resources.stack_outputs()
    experiment = Experiment.from_outputs(outputs, region=REGION)
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text('{"id": "a", "prompt": "1+1?"}\n')
    with sdk_calls(monkeypatch) as calls:
        with experiment.rollout_client(poll_wait_s=0, linger_s=1, runtime=fake) as client:
            big = client.invoke({"k": 2, "extra": {"blob": "x" * (INLINE_RESULT_BYTES + 100)}})
            small = client.invoke({"k": 1})
            drive(resources, deps)
            assert big.result(timeout=15)["rewards"] == 2.0  # fetched from S3
            assert small.result(timeout=15)["rewards"] == 1.0
            assert client.invoke({"k": 1}).cancel()
        art_queue = experiment.open_subscription({"source": ["rollout.pipeline"]}, suffix="art-0123abcd")
        experiment.close_subscription(*art_queue)
        experiment.submit_file(dataset)
        batch = experiment.submit([{"prompt": "p" * (CLAIM_CHECK_BYTES + 1)}, {"prompt": "q"}])
        experiment.status(batch)
        # A stream of one batch: its own subscription (sdk-*), and the ledger's account of what it published.
        with experiment.events(batch_id=batch, timeout=0.5, poll_wait_s=0) as stream:
            assert [event.detail_type for event in stream] == ["Batch Accepted"]
        experiment.set_policy_version("7")
        experiment.set_budget(100.0)
        assert experiment.budget() == 100.0
        experiment.set_budget(50.0, batch=batch)
        assert experiment.cost().batches
        experiment.cancel(batch, runtime=fake)
        with experiment.tap(timeout=0.1):
            pass
        orphan = experiment.open_subscription({"source": ["rollout.pipeline"]}, suffix="art-4567cdef")
        assert experiment.list_subscriptions()
        assert experiment.prune_subscriptions(0.0)  # removes the orphan (targets, rule, queue)
        assert orphan

    recorded = {(service, operation) for service, operation, _ in calls}
    assert {("sqs", "CreateQueue"), ("s3", "GetObject"), ("dynamodb", "TransactWriteItems")} <= recorded
    outside = sorted(
        {
            (kind, action)
            for service, operation, params in calls
            for kind in [resource_kind(outputs, service, operation, params)]
            for action in iam_actions(service, operation, params)
            if action not in TRAINER_ACTIONS[kind]
        }
    )
    assert outside == [], "add these to rollout_pipeline/ops/permissions.py (the trainer policy)"


def reward_of_the_row(row: Mapping[str, Any], result: Mapping[str, Any]) -> float:
    """A rescoring function that needs the row's payload (claim-checked when the row is big)."""
    return float(len(row["payload"]["prompt"]) > CLAIM_CHECK_BYTES)


def test_export_of_every_batch_and_a_rescore_of_a_big_row_are_allowed(
    resources: ExperimentResources,
    deps: LifecycleDeps,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """`rollouts export --all-batches` lists the batches (a Query of the index, not a Scan of the table) and a
    rescore reads the claim check of a 40 KiB row back (s3:GetObject on claims/): both under the trainer policy."""
    outputs = resources.stack_outputs()
    experiment = Experiment.from_outputs(outputs, region=REGION)
    outputs_path = tmp_path / "outputs.json"
    outputs_path.write_text(json.dumps({f"Rollouts-{resources.config.name}": outputs}))
    big_prompt = "p" * (40 * 1024)
    assert len(big_prompt) > CLAIM_CHECK_BYTES  # its payload travels as a claim check
    batch = experiment.submit([{"id": "big", "prompt": big_prompt}, {"id": "small", "prompt": "q"}], group_size=1)
    drive(resources, deps)
    assert experiment.status(batch).done
    with sdk_calls(monkeypatch) as calls:
        args = ["-e", resources.config.name, "--region", REGION, "--outputs-file", str(outputs_path)]
        assert main(["export", *args, "--all-batches", "-o", str(tmp_path / "all.jsonl")]) == EXIT_OK
        rescored = experiment.rescore(None, reward_of_the_row, tmp_path / "rescored")

    assert [json.loads(line)["batch_id"] for line in (tmp_path / "all.jsonl").read_text().splitlines()] == [batch] * 2
    assert rescored.failed == 0, rescored.errors
    recorded = {(service, operation, params.get("IndexName")) for service, operation, params in calls}
    assert ("dynamodb", "Query", "deadline") in recorded  # the batch listing
    assert not any(operation == "Scan" for _service, operation, _params in calls)
    claims = [p for service, operation, p in calls if operation == "GetObject" and p["Key"].startswith("claims/")]
    assert claims, "the rescore read the big row's claim check"
    outside = sorted(
        {
            (kind, action)
            for service, operation, params in calls
            for kind in [resource_kind(outputs, service, operation, params)]
            for action in iam_actions(service, operation, params)
            if action not in TRAINER_ACTIONS[kind]
        }
    )
    assert outside == [], "add these to rollout_pipeline/ops/permissions.py (the trainer policy)"


def test_transactions_are_authorized_per_contained_action() -> None:
    items = [{"Put": {"TableName": "t"}}, {"Update": {"TableName": "t"}}, {"ConditionCheck": {"TableName": "t"}}]
    actions = iam_actions("dynamodb", "TransactWriteItems", {"TransactItems": items})
    assert actions == ("dynamodb:ConditionCheckItem", "dynamodb:PutItem", "dynamodb:UpdateItem")
    assert iam_actions("sqs", "SendMessageBatch", {}) == ("sqs:SendMessage",)
