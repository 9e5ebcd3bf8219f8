"""Least privilege: each role may do what its component does, on the resources it does it to, and nothing else."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rollout_pipeline import access
from tests.infra.conftest import EXPERIMENT, Synthesized

Statement = dict[str, Any]


def statements(synth: Synthesized, role: Any) -> list[Statement]:
    """Every Allow statement of the policies attached to `role` (actions normalised to lists)."""
    role_id = synth.logical_id(role)
    found: list[Statement] = []
    for policy in synth.of_type("AWS::IAM::Policy").values():
        if {"Ref": role_id} not in policy["Properties"]["Roles"]:
            continue
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"]
            resources = statement["Resource"]
            found.append(
                {
                    **statement,
                    "Action": actions if isinstance(actions, list) else [actions],
                    "Resource": resources if isinstance(resources, list) else [resources],
                }
            )
    return found


def actions_of(synth: Synthesized, role: Any) -> set[str]:
    return {action for s in statements(synth, role) for action in s["Action"]}


def resources_for(synth: Synthesized, role: Any, action: str) -> list[Any]:
    return [r for s in statements(synth, role) if action in s["Action"] for r in s["Resource"]]


def unordered(values: list[Any]) -> set[str]:
    return {json.dumps(value, sort_keys=True) for value in values}


def getatt(logical_id: str, attribute: str = "Arn") -> dict[str, list[str]]:
    return {"Fn::GetAtt": [logical_id, attribute]}


def join(*parts: Any) -> dict[str, list[Any]]:
    return {"Fn::Join": ["", list(parts)]}


FUNCTIONS = ("ingest", "dispatch", "completion", "sweeper")


@pytest.mark.parametrize("name", FUNCTIONS)
def test_lambda_roles_have_no_managed_policies_and_no_star(synth: Synthesized, name: str) -> None:
    fn = synth.stack.functions[name]
    role = synth.resources[synth.logical_id(fn.role)]["Properties"]
    assert "ManagedPolicyArns" not in role
    assert role["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {"Service": "lambda.amazonaws.com"}
    for statement in statements(synth, fn.role):
        assert statement["Effect"] == "Allow"
        if "*" in statement["Resource"]:  # the one action without resource-level permissions it needs
            assert (name, statement["Action"], statement["Resource"]) == ("sweeper", ["events:ListRules"], ["*"])
        assert not [a for a in statement["Action"] if "*" in a], statement
    assert resources_for(synth, fn.role, "logs:PutLogEvents") == [getatt(synth.logical_id(fn.log_group))]


def test_the_sweeper_removes_private_subscriptions_and_nothing_else_of_the_bus(synth: Synthesized) -> None:
    """The reaper of subscriptions left by killed processes (`lifecycle.subscriptions`): their rules and queues only
    (`{bus}-{tap|sdk|art}-*`), never the stack's own rules and queues."""
    role = synth.stack.functions["sweeper"].role
    bus = f"rollouts-{EXPERIMENT}"
    for action in ("events:RemoveTargets", "events:DeleteRule", "sqs:DeleteQueue", "sqs:GetQueueUrl"):
        found = json.dumps(resources_for(synth, role, action))
        for kind in ("tap", "sdk", "art"):
            assert f"{bus}-{kind}-*" in found, (action, found)
        assert f"{bus}-trainer" not in found
    for name in ("ingest", "dispatch", "completion"):
        assert "events:DeleteRule" not in actions_of(synth, synth.stack.functions[name].role)


@pytest.mark.parametrize("name", FUNCTIONS)
def test_no_function_scans_or_deletes_the_table(synth: Synthesized, name: str) -> None:
    actions = actions_of(synth, synth.stack.functions[name].role)
    assert "dynamodb:Scan" not in actions
    assert "dynamodb:DeleteTable" not in actions
    assert {"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:Query"} <= actions


def test_only_the_sweeper_and_the_dispatcher_query_indexes_and_by_name(synth: Synthesized) -> None:
    """The sweeper queries both indexes; the dispatcher only `deadline` (its batch listing: a `Budget Exhausted` it
    announces says which batches wait, `lifecycle.budget`); no other function queries an index."""
    table = synth.logical_id(synth.stack.ledger.table)
    for name in FUNCTIONS:
        resources = resources_for(synth, synth.stack.functions[name].role, "dynamodb:Query")
        index_resources = [r for r in resources if r != getatt(table)]
        if name == "sweeper":
            assert unordered(index_resources) == unordered(
                [join(getatt(table), "/index/deadline"), join(getatt(table), "/index/outbox")]
            )
        elif name == "dispatch":
            assert index_resources == [join(getatt(table), "/index/deadline")]
        else:
            assert index_resources == []


def test_ingest_s3_access_is_limited_to_datasets_and_claims(synth: Synthesized) -> None:
    role = synth.stack.functions["ingest"].role
    bucket = synth.logical_id(synth.stack.storage.input_bucket)
    s3_actions = {a for a in actions_of(synth, role) if a.startswith("s3:")}
    assert s3_actions == {"s3:GetObject", "s3:GetObjectVersion", "s3:PutObject", "s3:ListBucket"}
    assert resources_for(synth, role, "s3:GetObject") == [join(getatt(bucket), "/datasets/*")]
    assert unordered(resources_for(synth, role, "s3:PutObject")) == unordered(
        [join(getatt(bucket), "/datasets/*"), join(getatt(bucket), "/claims/*")]
    )


def test_dispatch_reads_claims_and_own_results_only(synth: Synthesized) -> None:
    role = synth.stack.functions["dispatch"].role
    input_bucket = synth.logical_id(synth.stack.storage.input_bucket)
    results_bucket = synth.logical_id(synth.stack.storage.results_bucket)
    assert {a for a in actions_of(synth, role) if a.startswith("s3:")} == {"s3:GetObject", "s3:ListBucket"}
    assert unordered(resources_for(synth, role, "s3:GetObject")) == unordered(
        [join(getatt(input_bucket), "/claims/*"), join(getatt(results_bucket), f"/{EXPERIMENT}/*")]
    )


@pytest.mark.parametrize("name", ["completion", "sweeper"])
def test_completion_and_sweeper_read_this_experiments_results_only(synth: Synthesized, name: str) -> None:
    role = synth.stack.functions[name].role
    bucket = synth.logical_id(synth.stack.storage.results_bucket)
    assert {a for a in actions_of(synth, role) if a.startswith("s3:")} == {"s3:GetObject", "s3:ListBucket"}
    assert resources_for(synth, role, "s3:GetObject") == [join(getatt(bucket), f"/{EXPERIMENT}/*")]


@pytest.mark.parametrize("name", FUNCTIONS)
def test_list_bucket_only_where_a_true_404_is_needed_and_only_under_its_prefix(synth: Synthesized, name: str) -> None:
    """The faithful profile answers 403 for a missing key to any role without these grants
    (rollout_pipeline/access.py), so a test fails if the stack stops granting them."""
    buckets = {"input": synth.stack.storage.input_bucket, "results": synth.stack.storage.results_bucket}
    listing = [s for s in statements(synth, synth.stack.functions[name].role) if "s3:ListBucket" in s["Action"]]
    expected = access.LIST_GRANTS[name]
    assert len(listing) == len(expected)
    for statement, grant in zip(listing, expected, strict=True):
        assert statement["Action"] == ["s3:ListBucket"]
        assert statement["Resource"] == [getatt(synth.logical_id(buckets[grant.bucket]))]
        assert statement["Condition"] == {"StringLike": {"s3:prefix": [f"{grant.resolve(EXPERIMENT)}*"]}}


def test_list_grants_match_the_prefixes_the_handlers_read() -> None:
    assert {
        "ingest": (access.ListGrant("input", "datasets/"),),
        "dispatch": (access.ListGrant("input", "claims/"),),
        "completion": (access.ListGrant("results", "{exp}/"),),
        "sweeper": (access.ListGrant("results", "{exp}/"),),
    } == access.LIST_GRANTS


def test_only_dispatch_invokes_the_runtime(synth: Synthesized) -> None:
    runtime = getatt(synth.logical_id(synth.stack.agent.runtime), "AgentRuntimeArn")
    for name in FUNCTIONS:
        resources = resources_for(synth, synth.stack.functions[name].role, "bedrock-agentcore:InvokeAgentRuntime")
        if name == "dispatch":
            assert unordered(resources) == unordered([runtime, join(runtime, "/*")])
        else:
            assert resources == []


def test_with_a_warm_pool_the_sweeper_also_invokes_the_runtime(synth_local_image: Synthesized) -> None:
    """The warm pool's warm-ups and keep-alives come from the sweeper: it may invoke this runtime, only with the
    pool on (`synth_local_image` keeps one)."""
    synth = synth_local_image
    runtime = getatt(synth.logical_id(synth.stack.agent.runtime), "AgentRuntimeArn")
    for name in FUNCTIONS:
        resources = resources_for(synth, synth.stack.functions[name].role, "bedrock-agentcore:InvokeAgentRuntime")
        if name in ("dispatch", "sweeper"):
            assert unordered(resources) == unordered([runtime, join(runtime, "/*")])
        else:
            assert resources == []


def test_the_warm_queue_is_sent_to_by_the_sweeper_and_taken_from_by_dispatchers_only(
    synth: Synthesized, synth_local_image: Synthesized
) -> None:
    """The warm pool's offers (`lifecycle.warm`): the sweeper sends them, dispatchers receive, delete and give them
    back, no one else touches the queue; it is encrypted and TLS-only, and exists only with the pool on."""
    assert synth.stack.warm_queue is None  # no pool: no queue
    synth = synth_local_image
    assert synth.stack.warm_queue is not None
    queue = getatt(synth.logical_id(synth.stack.warm_queue))
    expected = {
        "sweeper": {"sqs:SendMessage"},
        "dispatch": {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility"},
        "ingest": set(),
        "completion": set(),
    }
    for name, actions in expected.items():
        on_queue = [s for s in statements(synth, synth.stack.functions[name].role) if queue in s["Resource"]]
        assert {a for s in on_queue for a in s["Action"]} == actions, name
        assert all(s["Resource"] == [queue] for s in on_queue), name
    warm_id = synth.logical_id(synth.stack.warm_queue)
    properties = synth.of_type("AWS::SQS::Queue")[warm_id]["Properties"]
    assert properties["SqsManagedSseEnabled"] is True
    assert properties["MessageRetentionPeriod"] == synth.stack.config.max_lifetime_s  # no offer outlives a session
    assert "RedrivePolicy" not in properties  # an offer is given back many times: no dead-letter queue
    (policy,) = [
        p for p in synth.of_type("AWS::SQS::QueuePolicy").values() if {"Ref": warm_id} in p["Properties"]["Queues"]
    ]
    (deny,) = policy["Properties"]["PolicyDocument"]["Statement"]
    for fn in synth.stack.functions.values():  # where the functions find it
        variables = synth.resources[synth.logical_id(fn.function)]["Properties"]["Environment"]["Variables"]
        assert variables["WARM_QUEUE_URL"] == {"Ref": warm_id}
    assert (deny["Effect"], deny["Condition"]) == ("Deny", {"Bool": {"aws:SecureTransport": "false"}})


@pytest.mark.parametrize("name", ["dispatch", "completion", "sweeper"])
def test_stop_session_scoped_to_this_runtime(synth: Synthesized, name: str) -> None:
    runtime = getatt(synth.logical_id(synth.stack.agent.runtime), "AgentRuntimeArn")
    role = synth.stack.functions[name].role
    stop = [s for s in statements(synth, role) if "bedrock-agentcore:StopRuntimeSession" in s["Action"]]
    assert len(stop) == 1
    assert stop[0]["Action"] == ["bedrock-agentcore:StopRuntimeSession"]
    assert unordered(stop[0]["Resource"]) == unordered([runtime, join(runtime, "/runtime-endpoint/DEFAULT")])
    allowed = {"bedrock-agentcore:StopRuntimeSession", "bedrock-agentcore:InvokeAgentRuntime"}
    assert {a for a in actions_of(synth, role) if a.startswith("bedrock-agentcore:")} <= allowed


def test_ingest_cannot_touch_the_runtime(synth: Synthesized) -> None:
    assert not [a for a in actions_of(synth, synth.stack.functions["ingest"].role) if a.startswith("bedrock")]


@pytest.mark.parametrize("name", FUNCTIONS)
def test_queue_sends_and_event_puts_are_scoped(synth: Synthesized, name: str) -> None:
    stack = synth.stack
    role = stack.functions[name].role
    rollout = getatt(synth.logical_id(stack.dispatch.queue))
    ingest = getatt(synth.logical_id(stack.ingest.queue))
    sends = resources_for(synth, role, "sqs:SendMessage")
    assert rollout in sends
    assert (ingest in sends) == (name == "ingest")
    assert unordered(sends) <= unordered([rollout, ingest])
    assert resources_for(synth, role, "events:PutEvents") == [getatt(synth.logical_id(stack.events.bus))]


def test_agent_role_writes_only_its_experiment_prefix(synth: Synthesized) -> None:
    role = synth.stack.agent.runtime.role
    bucket = synth.logical_id(synth.stack.storage.results_bucket)
    s3_statements = [s for s in statements(synth, role) if any(a.startswith("s3:") for a in s["Action"])]
    assert len(s3_statements) == 1
    assert s3_statements[0]["Action"] == ["s3:PutObject"]
    assert s3_statements[0]["Resource"] == [join(getatt(bucket), f"/{EXPERIMENT}/*")]
    assert not [a for a in actions_of(synth, role) if a.startswith(("dynamodb:", "sqs:", "events:"))]


def test_agent_role_trusts_only_agentcore_for_this_runtime(synth: Synthesized) -> None:
    role = synth.resources[synth.logical_id(synth.stack.agent.runtime.role)]["Properties"]
    (statement,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert statement["Principal"] == {"Service": "bedrock-agentcore.amazonaws.com"}
    assert "aws:SourceAccount" in statement["Condition"]["StringEquals"]
    # runtime/{name}-*: a runtime whose name only starts with ours (rollouts_a vs rollouts_ab) cannot assume it.
    source_arn = json.dumps(statement["Condition"]["ArnLike"]["aws:SourceArn"])
    assert f":runtime/{synth.stack.config.runtime_name}-*" in source_arn


def test_no_bucket_or_queue_is_shared_with_another_account(synth: Synthesized) -> None:
    for kind in ("AWS::S3::BucketPolicy", "AWS::SQS::QueuePolicy"):
        for policy in synth.of_type(kind).values():
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
                if statement["Effect"] == "Allow" and "AWS" in statement["Principal"]:
                    # Only a role of this stack (CDK's auto-delete handler on the buckets it empties).
                    principal = statement["Principal"]["AWS"]
                    assert isinstance(principal, dict), statement
                    assert principal["Fn::GetAtt"][0] in synth.resources, statement


def test_the_agent_may_read_only_its_model_secret(tmp_path: Any) -> None:
    from tests.infra.conftest import synthesize

    synth = synthesize(tmp_path, model_secret_name="rollouts/model-key")
    role = synth.stack.agent.runtime.role
    reads = [s for s in statements(synth, role) if "secretsmanager:GetSecretValue" in s["Action"]]
    assert len(reads) == 1
    assert reads[0]["Action"] == ["secretsmanager:GetSecretValue"]
    assert "secret:rollouts/model-key-??????" in json.dumps(reads[0]["Resource"])
    runtime = synth.resources[synth.logical_id(synth.stack.agent.runtime)]["Properties"]
    assert runtime["EnvironmentVariables"]["ROLLOUTS_MODEL_SECRET"] == "rollouts/model-key"
    model_secret = "secret:rollouts/model-key"
    for name in FUNCTIONS:  # the functions read the attempt key only (its own test), never the model's secret
        assert model_secret not in json.dumps(statements(synth, synth.stack.functions[name].role))


def test_no_secret_is_readable_without_model_secret_name(synth: Synthesized) -> None:
    assert not [a for a in actions_of(synth, synth.stack.agent.runtime.role) if a.startswith("secretsmanager")]


def test_only_the_functions_that_issue_or_check_attempt_tokens_read_the_attempt_key(synth: Synthesized) -> None:
    from rollout_pipeline.topology import ATTEMPT_KEY_ENV

    secret_id = synth.logical_id(synth.stack.attempt_key.secret)
    (secret,) = synth.of_type("AWS::SecretsManager::Secret").values()
    assert "Name" not in secret["Properties"]  # CloudFormation names it: a redeploy never collides
    assert secret["Properties"]["GenerateSecretString"]["PasswordLength"] >= 32
    for name in FUNCTIONS:
        fn = synth.stack.functions[name]
        readable = resources_for(synth, fn.role, "secretsmanager:GetSecretValue")
        env = synth.resources[synth.logical_id(fn.function)]["Properties"]["Environment"]["Variables"]
        if name == "ingest":
            assert readable == []
            assert ATTEMPT_KEY_ENV not in env
        else:
            assert readable == [{"Ref": secret_id}]  # this one secret, no wildcard
            assert env[ATTEMPT_KEY_ENV] == {"Ref": secret_id}
    agent_reads = resources_for(synth, synth.stack.agent.runtime.role, "secretsmanager:GetSecretValue")
    assert {"Ref": secret_id} not in agent_reads  # never the agent's: a compromised agent cannot mint tokens
