"""Alarms (each on exactly the metric the handlers emit), the alarm topic, the dashboard and their outputs."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rollout_pipeline import metric_names as m
from rollout_pipeline.contracts import FailureReason
from rollout_pipeline.metric_names import METRICS_NAMESPACE
from rollout_pipeline.observability import SERVICES
from stacks.functions import LOG_RETENTION_DAYS
from stacks.monitoring import AGENTCORE_NAMESPACE, FAILURE_RATE, LIMIT_WAIT_MINUTES, SESSION_QUOTA_SHARE
from tests.infra.conftest import ALARM_EMAIL, EXPERIMENT, Synthesized


def alarm(synth: Synthesized, name: str) -> dict[str, Any]:
    props: dict[str, Any] = synth.resources[synth.logical_id(synth.stack.monitoring.alarms[name])]["Properties"]
    return props


def metrics_of(props: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Metric id -> {namespace, name, dimensions, stat} of a metric-math alarm."""
    found = {}
    for query in props["Metrics"]:
        if "MetricStat" in query:
            stat = query["MetricStat"]
            dims = {d["Name"]: d["Value"] for d in stat["Metric"].get("Dimensions", [])}
            found[query["Id"]] = {
                "namespace": stat["Metric"]["Namespace"],
                "name": stat["Metric"]["MetricName"],
                "dimensions": dims,
                "stat": stat["Stat"],
            }
    return found


def expression(props: dict[str, Any]) -> str:
    (query,) = [q for q in props["Metrics"] if q.get("ReturnData", True) and "Expression" in q]
    return str(query["Expression"])


def emitted(name: str, function: str) -> dict[str, Any]:
    return {
        "namespace": METRICS_NAMESPACE,
        "name": name,
        "dimensions": {"Experiment": EXPERIMENT, "service": SERVICES[function]},
    }


def test_every_alarm_notifies_the_topic(synth: Synthesized) -> None:
    topic_id = synth.logical_id(synth.stack.monitoring.topic)
    alarms = synth.of_type("AWS::CloudWatch::Alarm")
    assert len(alarms) >= 19  # 5 queue alarms, 2 per function, the sweeper heartbeat, 5 pipeline alarms
    for props in (a["Properties"] for a in alarms.values()):
        assert props["AlarmActions"] == [{"Ref": topic_id}], props.get("AlarmDescription")
    assert synth.outputs["AlarmTopicArn"]["Value"] == {"Ref": topic_id}
    assert synth.of_type("AWS::SNS::Subscription") == {}


def test_alarm_email_subscribes_to_the_topic(synth_local_image: Synthesized) -> None:
    (subscription,) = synth_local_image.of_type("AWS::SNS::Subscription").values()
    assert subscription["Properties"]["Protocol"] == "email"
    assert subscription["Properties"]["Endpoint"] == ALARM_EMAIL


def test_topic_is_tls_only(synth: Synthesized) -> None:
    (policy,) = synth.of_type("AWS::SNS::TopicPolicy").values()
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    assert any(
        s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}} for s in statements
    )


def test_lambda_errors_and_throttles_per_function(synth: Synthesized) -> None:
    for name, fn in synth.stack.functions.items():
        fn_id = synth.logical_id(fn.function)
        for kind, metric in (("Errors", "Errors"), ("Throttles", "Throttles")):
            props = alarm(synth, f"{name.capitalize()}{kind}")
            assert props["Namespace"] == "AWS/Lambda"
            assert props["MetricName"] == metric
            assert props["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": fn_id}}]
            assert (props["Statistic"], props["Threshold"]) == ("Sum", 0)
            assert props["ComparisonOperator"] == "GreaterThanThreshold"


def test_sweeper_not_running_alarms_on_missing_invocations(synth: Synthesized) -> None:
    props = alarm(synth, "SweeperNotRunning")
    assert props["MetricName"] == "Invocations"
    assert props["Dimensions"] == [
        {"Name": "FunctionName", "Value": {"Ref": synth.logical_id(synth.stack.functions["sweeper"].function)}}
    ]
    assert props["ComparisonOperator"] == "LessThanThreshold"
    assert props["TreatMissingData"] == "breaching"


def test_limit_wait_with_free_sessions(synth: Synthesized) -> None:
    props = alarm(synth, "LimitWaitWithFreeSessions")
    found = metrics_of(props)
    assert {k: {**v, "stat": None} for k, v in found.items()} == {
        "waits": {**emitted(m.LIMIT_WAITS, "dispatch"), "stat": None},
        "inflight": {**emitted(m.IN_FLIGHT, "sweeper"), "stat": None},
    }
    assert found["inflight"]["stat"] == "Maximum"
    max_sessions = synth.stack.config.max_sessions
    assert expression(props) == f"IF(FILL(waits, 0) > 0 AND FILL(inflight, 0) < {max_sessions}, 1, 0)"
    assert props["EvaluationPeriods"] == props["DatapointsToAlarm"] == LIMIT_WAIT_MINUTES
    assert props["Metrics"][0].get("Period", 60) == 60 or all(
        q["MetricStat"]["Period"] == 60 for q in props["Metrics"] if "MetricStat" in q
    )


def test_failure_rate_sums_every_emitter(synth: Synthesized) -> None:
    props = alarm(synth, "RolloutFailureRate")
    found = metrics_of(props)
    failed = {v["dimensions"]["service"] for v in found.values() if v["name"] == m.FAILED}
    assert failed == {SERVICES[f] for f in ("dispatch", "completion", "sweeper")}
    succeeded = {v["dimensions"]["service"] for v in found.values() if v["name"] == m.SUCCEEDED}
    assert succeeded == {SERVICES["completion"]}
    assert all(v["dimensions"]["Experiment"] == EXPERIMENT for v in found.values())
    assert props["Threshold"] == FAILURE_RATE
    assert "failed / (failed + succeeded)" in expression(props)


def test_stops_failing_and_acr_throttles(synth: Synthesized) -> None:
    stops = metrics_of(alarm(synth, "StopsFailing"))
    assert {v["name"] for v in stops.values()} == {m.STOP_FAILED}
    assert {v["dimensions"]["service"] for v in stops.values()} == {
        SERVICES[f] for f in ("dispatch", "completion", "sweeper")
    }
    throttles = metrics_of(alarm(synth, "AgentCoreThrottles"))
    assert {v["name"] for v in throttles.values()} == {m.ACR_THROTTLED}  # AgentCore's answers, not the backlog
    assert {v["dimensions"]["service"] for v in throttles.values()} == {
        SERVICES[f] for f in ("dispatch", "completion", "sweeper")
    }


def test_sweep_errors_alarm(synth: Synthesized) -> None:
    props = alarm(synth, "SweepErrors")
    assert list(metrics_of(props).values()) == [{**emitted(m.SWEEP_ERRORS, "sweeper"), "stat": "Sum"}]
    assert (props["Threshold"], props["EvaluationPeriods"]) == (0, 3)


def test_cost_alarms_read_what_the_lifecycle_emits(synth: Synthesized) -> None:
    overdue = metrics_of(alarm(synth, "SessionsOverdue"))
    assert {v["name"] for v in overdue.values()} == {m.SESSIONS_OVERDUE}
    assert {v["dimensions"]["service"] for v in overdue.values()} == {
        SERVICES[f] for f in ("dispatch", "completion", "sweeper")
    }
    budget = alarm(synth, "BudgetWarning")
    assert {v["name"] for v in metrics_of(budget).values()} == {m.BUDGET_USED_PERCENT}
    assert {v["dimensions"]["service"] for v in metrics_of(budget).values()} == {
        SERVICES[f] for f in ("dispatch", "sweeper")
    }
    assert (budget["Threshold"], budget["ComparisonOperator"]) == (80, "GreaterThanOrEqualToThreshold")
    (dashboard,) = synth.of_type("AWS::CloudWatch::Dashboard").values()
    assert "RUNNING_SUM" in json.dumps(dashboard["Properties"]["DashboardBody"])


def test_active_sessions_near_quota_watches_the_accounts_sessions(synth: Synthesized) -> None:
    """Every experiment's sessions on the account pool against the account's quota: one experiment's count against
    the account's quota said nothing of the others sharing it."""
    props = alarm(synth, "ActiveSessionsNearQuota")
    assert props["Threshold"] == 100 * SESSION_QUOTA_SHARE
    assert props["MetricName"] == m.ACCOUNT_SESSIONS_PERCENT
    assert props["Statistic"] == "Maximum"


def test_dlq_and_undelivered_alarms_notify_too(synth: Synthesized) -> None:
    topic = {"Ref": synth.logical_id(synth.stack.monitoring.topic)}
    dlq_alarms = [
        a["Properties"]
        for a in synth.of_type("AWS::CloudWatch::Alarm").values()
        if a["Properties"].get("MetricName") == "ApproximateNumberOfMessagesVisible"
    ]
    assert len(dlq_alarms) >= 5
    assert all(a["AlarmActions"] == [topic] for a in dlq_alarms)


def test_dashboard_reads_the_emitted_metrics_and_its_url_is_an_output(synth: Synthesized) -> None:
    (dashboard,) = synth.of_type("AWS::CloudWatch::Dashboard").values()
    assert dashboard["Properties"]["DashboardName"] == f"Rollouts-{EXPERIMENT}"
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    shown = (m.SUBMITTED, m.SUCCEEDED, m.FAILED, m.IN_FLIGHT, m.NEW_SESSIONS, m.NOTIFICATION_LATENCY, m.REWARD)
    shown += (m.ESTIMATED_COST, m.SESSIONS_OVERDUE, m.BUDGET_USED_PERCENT, m.BUDGET_HELD)
    for name in (*shown, m.ACR_THROTTLED, m.LIMIT_BACKLOG):
        assert f'\\"{name}\\"' in body, name
    for reason in FailureReason:
        assert f'\\"{m.failed_metric(reason.value)}\\"' in body, f"the dashboard forgets {reason.value}"
    assert "ApproximateNumberOfMessagesVisible" in body
    # The pipeline's own rate beside the account's (every runtime and consumer of the account together).
    assert "CombinedNewSessionCreation" in body
    assert "AWS/Usage" in body
    url = json.dumps(synth.outputs["DashboardUrl"]["Value"])
    assert "#dashboards/dashboard/" in url
    assert synth.logical_id(synth.stack.monitoring.dashboard) in url


def test_every_log_group_expires_and_follows_the_retention_choice(synth: Synthesized) -> None:
    groups = synth.of_type("AWS::Logs::LogGroup")
    assert len(groups) >= 6  # four functions, the image build, the deploy-time build's handler
    for group in groups.values():
        assert group["Properties"]["RetentionInDays"] == 30
        assert group["DeletionPolicy"] == "RetainExceptOnCreate"


def _log_group_of(synth: Synthesized, function_id: str, function: dict[str, Any]) -> str | None:
    """The log group resource a function writes to: its LoggingConfig's, else the one named /aws/lambda/{name}."""
    configured = function["Properties"].get("LoggingConfig", {}).get("LogGroup")
    if configured is not None:
        return str(configured["Ref"])
    default_name = {"Fn::Join": ["", ["/aws/lambda/", {"Ref": function_id}]]}
    named = [
        lid
        for lid, g in synth.of_type("AWS::Logs::LogGroup").items()
        if g["Properties"].get("LogGroupName") == default_name
    ]
    return named[0] if named else None


@pytest.mark.parametrize("retention", ["retain", "destroy"])
def test_every_function_writes_to_a_log_group_of_the_stack_that_exists_first(
    synth: Synthesized, synth_destroyed: Synthesized, retention: str
) -> None:
    """Also CDK's singleton handlers (BucketNotificationsHandler, the S3 auto-delete provider): Lambda would create
    a log group that never expires, outside the stack, on their first invocation."""
    stack = synth if retention == "retain" else synth_destroyed
    functions = stack.of_type("AWS::Lambda::Function")
    assert len(functions) >= 7
    customs = {lid: r for lid, r in stack.resources.items() if r["Type"].startswith("Custom::")}
    for function_id, function in functions.items():
        group = _log_group_of(stack, function_id, function)
        assert group is not None, f"{function_id} has no log group"
        assert stack.resources[group]["Properties"]["RetentionInDays"] == LOG_RETENTION_DAYS
        for custom_id, custom in customs.items():
            if custom["Properties"]["ServiceToken"] == {"Fn::GetAtt": [function_id, "Arn"]}:
                assert group in custom.get("DependsOn", []) or function["Properties"].get("LoggingConfig"), (
                    f"{custom_id} may invoke {function_id} before its log group exists"
                )


def test_runtime_log_group_gets_a_retention_after_the_runtime_exists(synth: Synthesized) -> None:
    runtime_id = synth.logical_id(synth.stack.agent.runtime)
    calls = {lid: r for lid, r in synth.of_type("Custom::AWS").items() if lid.startswith("RuntimeLogs")}
    (create,) = [r for r in calls.values() if "createLogGroup" in json.dumps(r["Properties"]["Create"])]
    (retention,) = [r for r in calls.values() if "putRetentionPolicy" in json.dumps(r["Properties"]["Create"])]
    create_call = json.dumps(create["Properties"]["Create"])
    assert "createLogGroup" in create_call
    assert "ResourceAlreadyExistsException" in create_call
    assert "/aws/bedrock-agentcore/runtimes/" in create_call
    assert runtime_id in create_call  # the runtime's id: created after the runtime
    assert "-DEFAULT" in create_call
    assert "Delete" not in create["Properties"]  # retained with the results
    assert "putRetentionPolicy" in json.dumps(retention["Properties"]["Create"])
    assert '\\"retentionInDays\\":30' in json.dumps(retention["Properties"]["Create"])


def _alarm_publish_statements(synthesized: Synthesized) -> list[dict[str, Any]]:
    (policy,) = synthesized.of_type("AWS::SNS::TopicPolicy").values()
    return [
        s
        for s in policy["Properties"]["PolicyDocument"]["Statement"]
        if s["Effect"] == "Allow" and s.get("Principal") == {"Service": "cloudwatch.amazonaws.com"}
    ]


def test_cloudwatch_may_publish_this_stacks_alarms_only(synth: Synthesized) -> None:
    """The enforce_ssl policy replaces SNS's default one: without this statement no alarm notification arrives."""
    topic_id = synth.logical_id(synth.stack.monitoring.topic)
    (statement,) = _alarm_publish_statements(synth)
    assert statement["Action"] == "sns:Publish"
    assert statement["Resource"] == {"Ref": topic_id}
    assert statement["Condition"]["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
    source_arns = statement["Condition"]["ArnEquals"]["aws:SourceArn"]
    alarm_ids = set(synth.of_type("AWS::CloudWatch::Alarm"))
    assert all(list(arn) == ["Fn::GetAtt"] and arn["Fn::GetAtt"][1] == "Arn" for arn in source_arns)
    assert {arn["Fn::GetAtt"][0] for arn in source_arns} == alarm_ids, "every alarm that notifies may publish"


def test_agentcores_own_session_count_is_on_the_dashboard(synth: Synthesized) -> None:
    """AgentCore's ActiveSessionCount dimensions are unverified (an alarm matches one exact set): dashboard only."""
    props = alarm(synth, "ActiveSessionsNearQuota")
    assert props["Namespace"] != AGENTCORE_NAMESPACE
    body = json.dumps(synth.resources[synth.logical_id(synth.stack.monitoring.dashboard)]["Properties"])
    assert AGENTCORE_NAMESPACE in body
    assert "ActiveSessionCount" in body


def test_runtime_log_group_calls_are_granted_on_both_log_group_arn_forms(synth: Synthesized) -> None:
    """CloudWatch Logs authorizes some calls on `log-group:NAME`, others on `log-group:NAME:*`: grant both."""
    policies = {lid: p for lid, p in synth.of_type("AWS::IAM::Policy").items() if lid.startswith("RuntimeLogs")}
    assert len(policies) == 2  # the create and the retention custom resources
    for policy in policies.values():
        (statement,) = policy["Properties"]["PolicyDocument"]["Statement"]
        resources = [json.dumps(resource) for resource in statement["Resource"]]
        assert len(resources) == 2
        assert sum(resource.endswith('-DEFAULT"]]}') for resource in resources) == 1, resources
        assert sum(resource.endswith('-DEFAULT:*"]]}') for resource in resources) == 1, resources
