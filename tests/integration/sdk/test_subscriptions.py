"""Private subscriptions on the experiment bus (moto): tagged with kind, owner and time at creation; listed and pruned
when stale (rule targets, then rule, then queue), never touching the stack's own rules and queues; the ART backend
prunes stale ART subscriptions when it attaches; `rollouts subscriptions prune` on top."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from rollout_pipeline.cli import EXIT_OK, main
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.ops import subscriptions as pruning
from rollout_pipeline.sdk import Experiment
from rollout_pipeline.sdk import subscription as subs
from rollout_pipeline.trainers import art
from tests.conftest import REGION
from tests.integration.sdk.test_sdk_submit import _deploy_stack

PATTERN = {"source": ["rollout.pipeline"]}
DAY = 86_400.0


def rule_names(experiment: Experiment) -> list[str]:
    rules = experiment.client("events").list_rules(EventBusName=experiment.bus_name)["Rules"]
    return sorted(r["Name"] for r in rules)


def queue_names(experiment: Experiment) -> list[str]:
    urls = experiment.client("sqs").list_queues(QueueNamePrefix=experiment.bus_name).get("QueueUrls", [])
    return sorted(u.rsplit("/", 1)[-1] for u in urls)


def age(experiment: Experiment, name: str, queue_url: str, seconds: float) -> None:
    """Make a subscription look `seconds` old: its creation and seen-at tags moved back."""
    then = subs.iso_now(time.time() - seconds)
    experiment.client("sqs").tag_queue(QueueUrl=queue_url, Tags={subs.TAG_CREATED: then, subs.TAG_SEEN: then})
    events = experiment.client("events")
    rule = events.describe_rule(Name=name, EventBusName=experiment.bus_name)
    events.tag_resource(ResourceARN=rule["Arn"], Tags=[{"Key": subs.TAG_CREATED, "Value": then}])
    description = rule["Description"].rsplit(" created ", 1)[0] + f" created {then}"
    events.put_rule(
        Name=name, EventBusName=experiment.bus_name, EventPattern=rule["EventPattern"], Description=description
    )


def test_rule_and_queue_are_tagged_with_kind_owner_and_time(experiment: Experiment) -> None:
    before = time.time() - 1
    name, queue_url = experiment.open_subscription(PATTERN, suffix="art-0badcafe")
    events, sqs = experiment.client("events"), experiment.client("sqs")
    arn = events.describe_rule(Name=name, EventBusName=experiment.bus_name)["Arn"]
    rule_tags = {t["Key"]: t["Value"] for t in events.list_tags_for_resource(ResourceARN=arn)["Tags"]}
    queue_tags = sqs.list_queue_tags(QueueUrl=queue_url)["Tags"]
    assert rule_tags[subs.TAG_KIND] == queue_tags[subs.TAG_KIND] == "art"
    assert rule_tags[subs.TAG_OWNER] == queue_tags[subs.TAG_OWNER] == subs.default_owner()
    assert rule_tags[subs.TAG_CREATED] == queue_tags[subs.TAG_CREATED] == queue_tags[subs.TAG_SEEN]
    (found,) = experiment.list_subscriptions()
    assert (found.name, found.kind, found.rule_arn, found.queue_url) == (name, "art", arn, queue_url)
    assert found.last_seen is not None
    assert found.last_seen >= int(before)
    experiment.close_subscription(name, queue_url)


def test_a_tap_is_tagged_as_a_tap(experiment: Experiment) -> None:
    with experiment.tap(timeout=0, poll_wait_s=0):
        (found,) = experiment.list_subscriptions()
        assert found.kind == "tap"
        assert found.name.startswith(f"{experiment.bus_name}-tap-")
    assert experiment.list_subscriptions() == []


def test_prune_removes_the_stale_and_keeps_the_fresh_and_the_stack(experiment: Experiment) -> None:
    stack_rules, stack_queues = rule_names(experiment), queue_names(experiment)
    assert stack_rules  # the stack's trainer rule lives on the bus, under the same name prefix
    fresh = experiment.open_subscription(PATTERN, suffix="tap-11111111")
    stale = experiment.open_subscription(PATTERN, suffix="art-22222222")
    age(experiment, *stale, 2 * DAY)
    # Left by a process killed between deleting its rule and its queue.
    half = experiment.open_subscription(PATTERN, suffix="art-33333333")
    events = experiment.client("events")
    events.remove_targets(Rule=half[0], EventBusName=experiment.bus_name, Ids=["tap"])
    events.delete_rule(Name=half[0], EventBusName=experiment.bus_name)
    then = subs.iso_now(time.time() - 2 * DAY)
    experiment.client("sqs").tag_queue(QueueUrl=half[1], Tags={subs.TAG_CREATED: then, subs.TAG_SEEN: then})
    alone = experiment.open_subscription(PATTERN, suffix="smoke-alarm-1")  # a run in progress owning a queue alone
    events.remove_targets(Rule=alone[0], EventBusName=experiment.bus_name, Ids=["tap"])
    events.delete_rule(Name=alone[0], EventBusName=experiment.bus_name)

    dry = {r.subscription.name: r.action for r in experiment.prune_subscriptions(DAY, dry_run=True)}
    assert dry == {fresh[0]: "kept", stale[0]: "would remove", half[0]: "would remove", alone[0]: "kept"}
    assert len(experiment.list_subscriptions()) == 4

    done = {r.subscription.name: r.action for r in experiment.prune_subscriptions(DAY)}
    assert done == {fresh[0]: "kept", stale[0]: "removed", half[0]: "removed", alone[0]: "kept"}
    assert rule_names(experiment) == sorted([*stack_rules, fresh[0]])
    assert queue_names(experiment) == sorted([*stack_queues, fresh[0], alone[0]])

    experiment.touch_subscription(fresh[1])
    assert [r.action for r in experiment.prune_subscriptions(0)] == ["removed", "removed"]
    assert (rule_names(experiment), queue_names(experiment)) == (stack_rules, stack_queues)


def test_untagged_subscriptions_of_earlier_versions_are_found_by_name(experiment: Experiment) -> None:
    """Made before tagging: `{bus}-{tap|art}-{8 hex}`, aged by the queue's creation time."""
    events, sqs = experiment.client("events"), experiment.client("sqs")
    name = f"{experiment.bus_name}-art-0123abcd"
    queue_url = sqs.create_queue(QueueName=name)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    events.put_rule(Name=name, EventBusName=experiment.bus_name, EventPattern=json.dumps(PATTERN))
    events.put_targets(Rule=name, EventBusName=experiment.bus_name, Targets=[{"Id": "tap", "Arn": arn}])
    user_rule = f"{experiment.bus_name}-my-own-subscriber"  # a rule the user added: never touched
    events.put_rule(Name=user_rule, EventBusName=experiment.bus_name, EventPattern=json.dumps(PATTERN))

    (found,) = experiment.list_subscriptions()
    assert (found.name, found.kind, found.owner, found.target_ids) == (name, "art", "unknown", ("tap",))
    assert [r.action for r in experiment.prune_subscriptions(DAY)] == ["kept"]  # just created
    later = time.time() + 2 * DAY
    results = pruning.prune_subscriptions(experiment.aws, experiment.bus_name, DAY, now=later)
    assert [r.action for r in results] == ["removed"]
    assert user_rule in rule_names(experiment)
    assert name not in queue_names(experiment)


def test_targets_go_first_then_the_rule_then_the_queue(experiment: Experiment) -> None:
    experiment.open_subscription(PATTERN, suffix="art-44444444")
    calls: list[str] = []

    def record(event_name: str, **_kwargs: Any) -> None:
        calls.append(event_name.rsplit(".", 1)[-1])

    for service in ("events", "sqs"):
        experiment.client(service).meta.events.register("before-call", record)
    (found,) = experiment.list_subscriptions()
    calls.clear()
    pruning.remove_subscription(experiment.aws, experiment.bus_name, found)
    assert calls == ["RemoveTargets", "DeleteRule", "DeleteQueue"]
    pruning.remove_subscription(experiment.aws, experiment.bus_name, found)  # already gone: nothing raised
    assert experiment.list_subscriptions() == []


def test_the_art_backend_prunes_stale_art_subscriptions_at_attach(
    resources: ExperimentResources, experiment: Experiment, tmp_path: Any
) -> None:
    dead = experiment.open_subscription(PATTERN, suffix="art-55555555")
    age(experiment, *dead, art.STALE_SUBSCRIPTION_S + 60)
    recent = experiment.open_subscription(PATTERN, suffix="art-66666666")  # another live worker
    age(experiment, *recent, 3600)
    watcher = experiment.open_subscription(PATTERN, suffix="tap-77777777")
    age(experiment, *watcher, art.STALE_SUBSCRIPTION_S + 60)  # not the backend's to prune
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps(resources.stack_outputs()))
    try:
        config = art.parse_config({"outputs_file": str(outputs), "region": REGION})
        link = art.attached(config)
        names = {sub.name for sub in experiment.list_subscriptions()}
        assert link.subscription is not None
        assert names == {recent[0], watcher[0], link.subscription[0]}
        # A live process keeps its own alive: its heartbeat refreshes the queue's seen-at while it is open.
        assert link.subscription[1] in subs._HEARTBEAT.open_urls()
        assert art.attached(config) is link
    finally:
        art.reset_clients()
    assert {sub.name for sub in experiment.list_subscriptions()} == {recent[0], watcher[0]}


def test_cli_prunes_with_a_dry_run_first(
    resources: ExperimentResources, experiment: Experiment, capsys: pytest.CaptureFixture[str]
) -> None:
    _deploy_stack(resources.stack_outputs())
    stale = experiment.open_subscription(PATTERN, suffix="art-88888888")
    age(experiment, *stale, 3 * DAY)
    fresh = experiment.open_subscription(PATTERN, suffix="tap-99999999")
    common = ["-e", "test-exp", "--region", REGION]
    assert main(["subscriptions", "prune", *common, "--older-than", "2d", "--dry-run"]) == EXIT_OK
    out = capsys.readouterr()
    assert f"would remove {stale[0]}  art" in out.out
    assert f"kept         {fresh[0]}  tap" in out.out
    assert "would remove 1 of 2 subscription(s)" in out.err
    assert main(["subscriptions", "prune", *common, "--older-than", "2d"]) == EXIT_OK
    assert "removed 1 of 2" in capsys.readouterr().err
    assert main(["subscriptions", "list", *common]) == EXIT_OK
    listed = capsys.readouterr().out
    assert fresh[0] in listed
    assert stale[0] not in listed
    assert main(["subscriptions", "prune", *common, "--older-than", "soon"]) != EXIT_OK


def test_a_smoke_runs_rule_on_the_default_bus_is_found_and_pruned(experiment: Experiment) -> None:
    name = f"{experiment.bus_name}-smoke-s3-abcd1234"
    subs.open_subscription(experiment.aws, "default", PATTERN, suffix="smoke", kind="smoke", name=name)
    (found,) = experiment.list_subscriptions()
    assert (found.name, found.kind, found.rule_bus) == (name, "smoke", "default")
    assert [r.action for r in experiment.prune_subscriptions(0)] == ["removed"]
    default_rules = experiment.client("events").list_rules(EventBusName="default")["Rules"]
    assert name not in [r["Name"] for r in default_rules]
    assert name not in queue_names(experiment)


def test_without_tagging_permissions_the_subscription_is_made_untagged(experiment: Experiment) -> None:
    """A trainer role without `sqs:TagQueue` / `events:TagResource` still subscribes; prune finds the subscription by
    its name's form and ages it by its queue's creation time."""
    from botocore.exceptions import ClientError

    def deny_tags(params: dict[str, Any], **_kwargs: Any) -> None:
        if "tags" in params or "Tags" in params:
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "no tagging"}}, "Create")

    experiment.client("sqs").meta.events.register("before-parameter-build.sqs.CreateQueue", deny_tags)
    experiment.client("events").meta.events.register("before-parameter-build.events.PutRule", deny_tags)
    name, queue_url = experiment.open_subscription(PATTERN, suffix="art-abcdef12")
    assert experiment.client("sqs").list_queue_tags(QueueUrl=queue_url).get("Tags", {}) == {}
    (found,) = experiment.list_subscriptions()
    assert (found.name, found.kind, found.owner) == (name, "art", "unknown")
    assert found.last_seen is not None
    experiment.close_subscription(name, queue_url)


def test_a_prune_that_skips_recent_rules_reads_nothing_more_of_them(experiment: Experiment) -> None:
    """The ART backend prunes at every attach: rules younger than the threshold (their description says when they
    were made) cost one ListRules call, nothing more, so many workers starting together stay cheap."""
    young = [experiment.open_subscription(PATTERN, suffix=f"art-{n:08x}") for n in range(3)]
    old = experiment.open_subscription(PATTERN, suffix="art-000000ff")
    age(experiment, *old, 5 * DAY)
    calls: list[str] = []

    def record(event_name: str, **_kwargs: Any) -> None:
        calls.append(event_name.rsplit(".", 1)[-1])

    for service in ("events", "sqs"):
        experiment.client(service).meta.events.register("before-call", record)
    results = experiment.prune_subscriptions(4 * DAY, kinds=("art",), skip_recent=True)
    assert [(r.subscription.name, r.action) for r in results] == [(old[0], "removed")]
    assert calls.count("ListTagsForResource") == 1  # the old rule's only
    assert calls.count("ListQueueTags") == 1
    assert {sub.name for sub in experiment.list_subscriptions()} == {name for name, _url in young}
