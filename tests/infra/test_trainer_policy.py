"""The stack's ready-made trainer policy: every action the SDK needs, each on this experiment's resources only."""

from __future__ import annotations

import json
from typing import Any

from rollout_pipeline.ops.permissions import SUBSCRIPTION_PREFIXES, TRAINER_ACTIONS
from tests.infra.conftest import EXPERIMENT, Synthesized


def policy(synth: Synthesized) -> tuple[str, dict[str, Any]]:
    ((policy_id, resource),) = synth.of_type("AWS::IAM::ManagedPolicy").items()
    return policy_id, resource["Properties"]


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def test_the_stack_outputs_the_trainer_policy(synth: Synthesized) -> None:
    policy_id, props = policy(synth)
    assert synth.outputs["TrainerPolicyArn"]["Value"] == {"Ref": policy_id}
    assert "ManagedPolicyName" not in props  # CloudFormation names it: experiments never collide
    assert EXPERIMENT in props["Description"]


def test_every_sdk_action_is_allowed_on_its_resources_and_nothing_on_star(synth: Synthesized) -> None:
    _, props = policy(synth)
    statements = props["PolicyDocument"]["Statement"]
    assert all(s["Effect"] == "Allow" for s in statements)
    # "*" only for the two List actions that have no resource-level permissions (by name prefix, to prune).
    starred = [s for s in statements if "*" in as_list(s["Resource"])]
    assert [sorted(as_list(s["Action"])) for s in starred] == [sorted(TRAINER_ACTIONS["listing"])]
    resources = synth.stack.trainer_policy.resources
    for kind, actions in TRAINER_ACTIONS.items():
        wanted = [synth.stack.resolve(arn) for arn in resources[kind]]
        for action in actions:
            for arn in wanted:
                assert any(action in as_list(s["Action"]) and arn in as_list(s["Resource"]) for s in statements), (
                    f"{action} on {kind} ({json.dumps(arn)})"
                )


def test_subscriptions_use_the_real_queue_and_rule_names(synth: Synthesized) -> None:
    """The SDK names them `{bus}-{suffix}`: `rollouts-NAME-art-*` (ART backend) and `rollouts-NAME-tap-*`."""
    body = json.dumps(policy(synth)[1]["PolicyDocument"])
    bus = f"rollouts-{EXPERIMENT}"
    for prefix in SUBSCRIPTION_PREFIXES:
        assert f":{bus}-{prefix}*" in body  # queues
        assert f":rule/{bus}/{bus}-{prefix}*" in body  # rules on the experiment's bus
    assert "-bus-art-" not in body


def test_results_listing_is_limited_to_the_experiment_prefix(synth: Synthesized) -> None:
    statements = policy(synth)[1]["PolicyDocument"]["Statement"]
    (listing,) = [s for s in statements if "s3:ListBucket" in as_list(s["Action"])]
    assert listing["Condition"] == {"StringLike": {"s3:prefix": [f"{EXPERIMENT}/*"]}}


def test_subscription_rules_may_only_target_subscription_queues(synth: Synthesized) -> None:
    statements = policy(synth)[1]["PolicyDocument"]["Statement"]
    (put_targets,) = [s for s in statements if "events:PutTargets" in as_list(s["Action"])]
    assert as_list(put_targets["Action"]) == ["events:PutTargets"]
    targets = json.dumps(put_targets["Condition"]["ArnLike"]["events:TargetArn"])
    for prefix in SUBSCRIPTION_PREFIXES:
        assert f":rollouts-{EXPERIMENT}-{prefix}*" in targets
