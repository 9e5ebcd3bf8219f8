"""Operating an experiment: an SNS topic every alarm notifies, the pipeline's alarms, and a dashboard.

Metrics are read exactly as the handlers flush them (`lambdas/glue.py` `flush_metrics`):
namespace `RolloutPipeline`, dimensions `Experiment` = the experiment name and `service` = the Powertools service of
the Lambda that emitted it (`SERVICES`). A metric several functions emit (e.g. `Failed`) is summed over them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from aws_cdk import ArnFormat, CfnResource, Duration, Fn, RemovalPolicy, Stack
from aws_cdk import aws_bedrockagentcore as agentcore
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_sqs as sqs
from aws_cdk import custom_resources as cr
from constructs import Construct

from rollout_pipeline import metric_names as m
from rollout_pipeline import quotas, topology
from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.contracts import FailureReason
from rollout_pipeline.metric_names import METRICS_NAMESPACE
from rollout_pipeline.observability import SERVICES
from stacks import nag

#: AgentCore's own namespace; `ActiveSessionCount` counts the account's live (and idle) sessions.
AGENTCORE_NAMESPACE: Final = "AWS/Bedrock-AgentCore"
ACTIVE_SESSIONS: Final = "ActiveSessionCount"
#: Alarm when live sessions reach this share of the account's quota.
SESSION_QUOTA_SHARE: Final = 0.8
#: Minutes of limit waits with free sessions before the dispatcher is considered stuck.
LIMIT_WAIT_MINUTES: Final = 10
#: Failure share of finished rollouts (over 15 minutes, at least `MIN_FINISHED` of them) that alarms.
FAILURE_RATE: Final = 0.2
MIN_FINISHED: Final = 10
#: One series per failure reason: the contract's enum, so a new reason shows up without an edit here.
FAILURE_REASONS: Final = tuple(reason.value for reason in FailureReason)
RUNTIME_LOG_PREFIX: Final = "/aws/bedrock-agentcore/runtimes/"
#: What CDK gives a log group it creates for a handler it manages (two years).
DEFAULT_CDK_LOG_RETENTION_DAYS: Final = 731
ONE_MINUTE: Final = Duration.minutes(1)
FIVE_MINUTES: Final = Duration.minutes(5)


def pipeline_metric(
    config: ExperimentConfig, name: str, function: str, statistic: str = "Sum", period: Duration = ONE_MINUTE
) -> cloudwatch.Metric:
    """One pipeline metric as `function`'s handler emits it."""
    return cloudwatch.Metric(
        namespace=METRICS_NAMESPACE,
        metric_name=name,
        dimensions_map={"Experiment": config.name, "service": SERVICES[function]},
        statistic=statistic,
        period=period,
    )


def summed(
    config: ExperimentConfig, name: str, functions: Sequence[str], period: Duration = ONE_MINUTE, label: str = ""
) -> cloudwatch.MathExpression:
    """`name` summed over the functions that emit it (a function that emitted nothing counts 0)."""
    using = {
        f"{name.lower()}_{function}": pipeline_metric(config, name, function, period=period) for function in functions
    }
    return cloudwatch.MathExpression(
        expression=" + ".join(f"FILL({key}, 0)" for key in using),
        using_metrics=using,
        label=label or name,
        period=period,
    )


#: Who emits what (the lifecycle logic runs in dispatch, completion and sweeper).
#: The account's new sessions/s, every runtime and consumer together (AgentCore publishes the pooled quota's usage in
#: `AWS/Usage` as `CombinedNewSessionCreation`: docs/aws-facts.md; its dimensions are not documented, so a SEARCH).
USAGE_NAMESPACE: Final = "AWS/Usage"
COMBINED_NEW_SESSIONS: Final = "CombinedNewSessionCreation"


def account_new_sessions(period: Duration) -> cloudwatch.MathExpression:
    """The account's new sessions per second (`COMBINED_NEW_SESSIONS`, summed over whatever dimensions it has)."""
    seconds = int(period.to_seconds())
    return cloudwatch.MathExpression(
        expression=(
            f"SUM(SEARCH('{{{USAGE_NAMESPACE}}} MetricName=\"{COMBINED_NEW_SESSIONS}\"', 'Sum', {seconds})) / {seconds}"
        ),
        label="account new sessions/s (AWS/Usage CombinedNewSessionCreation)",
        period=period,
    )


EMITTERS: Final[Mapping[str, tuple[str, ...]]] = {
    m.FAILED: ("dispatch", "completion", "sweeper"),
    m.SUCCEEDED: ("completion",),
    m.STOP_FAILED: ("dispatch", "completion", "sweeper"),
    m.ACR_THROTTLED: ("dispatch", "completion", "sweeper"),
    m.LIMIT_BACKLOG: ("dispatch", "completion", "sweeper"),
    m.SWEEP_ERRORS: ("sweeper",),
    m.LIMIT_WAITS: ("dispatch",),
    m.NEW_SESSIONS: ("dispatch",),
    m.DISPATCHED: ("dispatch",),
    m.SUBMITTED: ("ingest",),
    m.REWARD: ("completion",),
    m.NOTIFICATION_LATENCY: ("dispatch", "completion", "sweeper"),
    m.IN_FLIGHT: ("sweeper",),
    m.ACCOUNT_SESSIONS_PERCENT: ("sweeper",),
    # every path that ends a rollout prices it; every path that stops sessions may find one overdue
    m.ESTIMATED_COST: ("dispatch", "completion", "sweeper"),
    m.SESSIONS_OVERDUE: ("dispatch", "completion", "sweeper"),
    m.BUDGET_USED_PERCENT: ("dispatch", "sweeper"),
    m.BUDGET_HELD: ("dispatch",),
}
#: The budget alarm's threshold (percent of `budget_usd` spent), as the `Budget Warning` event's.
BUDGET_WARNING_PERCENT: Final = 80
#: Both sample the ledger's in-flight count (the dispatcher on each batch, the sweeper every minute).
IN_FLIGHT_EMITTERS: Final = ("dispatch", "sweeper")


class Monitoring(Construct):
    """The alarm topic (optionally e-mailed), the pipeline's alarms and the experiment's dashboard."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: ExperimentConfig,
        functions: Mapping[str, lambda_.IFunction],
        queues: Mapping[str, sqs.IQueue],
        alarm_email: str = "",
        active_session_quota: int,
    ) -> None:
        super().__init__(scope, construct_id)
        self.config = config
        self.topic = sns.Topic(
            self, "AlarmTopic", display_name=f"Rollout pipeline alarms ({config.name})", enforce_ssl=True
        )
        if alarm_email:
            self.topic.add_subscription(subscriptions.EmailSubscription(alarm_email))
        self.alarms: dict[str, cloudwatch.Alarm] = {}
        self._function_alarms(functions)
        self._pipeline_alarms()
        self._cost_alarms()
        self.dashboard = self._dashboard(functions, queues, active_session_quota)

    # --- alarms ------------------------------------------------------------------------------------------------

    def _alarm(
        self,
        name: str,
        description: str,
        metric: cloudwatch.IMetric,
        *,
        threshold: float,
        evaluation_periods: int = 1,
        comparison: cloudwatch.ComparisonOperator = cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
        missing: cloudwatch.TreatMissingData = cloudwatch.TreatMissingData.NOT_BREACHING,
    ) -> cloudwatch.Alarm:
        alarm = cloudwatch.Alarm(
            self,
            name,
            alarm_description=description,
            metric=metric,
            threshold=threshold,
            evaluation_periods=evaluation_periods,
            datapoints_to_alarm=evaluation_periods,
            comparison_operator=comparison,
            treat_missing_data=missing,
        )
        self.alarms[name] = alarm
        return alarm

    def _function_alarms(self, functions: Mapping[str, lambda_.IFunction]) -> None:
        for name, function in functions.items():
            title = name.capitalize()
            self._alarm(
                f"{title}Errors",
                f"The {name} Lambda failed (an exception or a timeout): read its log group",
                function.metric_errors(period=FIVE_MINUTES, statistic="Sum"),
                threshold=0,
            )
            self._alarm(
                f"{title}Throttles",
                f"The {name} Lambda was throttled: the account's Lambda concurrency is exhausted",
                function.metric_throttles(period=FIVE_MINUTES, statistic="Sum"),
                threshold=0,
            )
        if "sweeper" in functions:
            self._alarm(
                "SweeperNotRunning",
                "The sweeper (every minute) did not run for 5 minutes: timeouts and the outbox are not handled",
                functions["sweeper"].metric_invocations(period=FIVE_MINUTES, statistic="Sum"),
                threshold=1,
                comparison=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
                missing=cloudwatch.TreatMissingData.BREACHING,
            )

    def _pipeline_alarms(self) -> None:
        config = self.config
        waits = pipeline_metric(config, m.LIMIT_WAITS, "dispatch")
        in_flight = pipeline_metric(config, m.IN_FLIGHT, "sweeper", statistic="Maximum")
        self._alarm(
            "LimitWaitWithFreeSessions",
            f"The dispatcher waited on a rate limit for {LIMIT_WAIT_MINUTES} minutes while fewer than max_sessions "
            f"({config.max_sessions}) rollouts were in flight: a limit (tps_limit, session_rate_limit) is too low "
            "or its ledger item is stuck",
            cloudwatch.MathExpression(
                expression=f"IF(FILL(waits, 0) > 0 AND FILL(inflight, 0) < {config.max_sessions}, 1, 0)",
                using_metrics={"waits": waits, "inflight": in_flight},
                label="Waiting on limits with free sessions",
                period=ONE_MINUTE,
            ),
            threshold=1,
            evaluation_periods=LIMIT_WAIT_MINUTES,
            comparison=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        )
        period = Duration.minutes(15)
        failed = summed(config, m.FAILED, EMITTERS[m.FAILED], period)
        succeeded = summed(config, m.SUCCEEDED, EMITTERS[m.SUCCEEDED], period)
        self._alarm(
            "RolloutFailureRate",
            f"More than {FAILURE_RATE:.0%} of the rollouts that finished in 15 minutes failed (at least "
            f"{MIN_FINISHED} finished): see the failure reasons on the dashboard",
            cloudwatch.MathExpression(
                expression=f"IF((failed + succeeded) >= {MIN_FINISHED}, failed / (failed + succeeded), 0)",
                using_metrics={"failed": failed, "succeeded": succeeded},
                label="Failure rate",
                period=period,
            ),
            threshold=FAILURE_RATE,
        )
        self._any_in_a_row(
            "StopsFailing",
            "StopRuntimeSession failed for 15 minutes in a row: sessions may keep running (and billing) until "
            "their idle timeout; the outbox keeps retrying",
            m.STOP_FAILED,
            periods=3,
        )
        self._any_in_a_row(
            "AgentCoreThrottles",
            "AgentCore answered ThrottlingException for 10 minutes: the limits are above the account's quotas "
            "(run `rollouts preflight`)",
            m.ACR_THROTTLED,
            periods=2,
        )
        self._any_in_a_row(
            "SweepErrors",
            "The sweeper failed on rollouts or outbox entries in three 5-minute periods in a row: their timeouts, "
            "retries or stops are not handled; read the sweeper's log group",
            m.SWEEP_ERRORS,
            periods=3,
        )
        # On the account pool's count of every experiment's sessions, not AgentCore's ActiveSessionCount: an alarm
        # matches one exact dimension set, AgentCore's are not pinned yet, and its metrics need Transaction Search
        # (the dashboard shows it). The quota is the pool's (`rollouts bootstrap` read it from Service Quotas).
        self._alarm(
            "ActiveSessionsNearQuota",
            f"The account's sessions (every experiment's in-flight rollouts on the account pool) reached "
            f"{SESSION_QUOTA_SHARE:.0%} of its active-session quota: new sessions will be refused soon; idle "
            "sessions count until stopped",
            pipeline_metric(config, m.ACCOUNT_SESSIONS_PERCENT, "sweeper", statistic="Maximum"),
            threshold=100 * SESSION_QUOTA_SHARE,
            evaluation_periods=3,
            comparison=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        )

    def _cost_alarms(self) -> None:
        """Runaway sessions and the budget's 80% (docs/costs.md)."""
        config = self.config
        self._any_in_a_row(
            "SessionsOverdue",
            "AgentCore sessions were found alive past their rollout's deadline plus session_grace_s (their stop "
            "failed or their result came late): the sweeper keeps stopping them; they bill memory until then",
            m.SESSIONS_OVERDUE,
            periods=1,
        )
        self._alarm(
            "BudgetWarning",
            f"The experiment spent {BUDGET_WARNING_PERCENT}% of its budget (budget_usd or `rollouts budget set`): "
            "at 100% dispatch pauses until the budget is raised (`rollouts cost`, docs/costs.md)",
            cloudwatch.MathExpression(
                expression=f"MAX([{', '.join(f'FILL(used_{fn}, 0)' for fn in EMITTERS[m.BUDGET_USED_PERCENT])}])",
                using_metrics={
                    f"used_{fn}": pipeline_metric(config, m.BUDGET_USED_PERCENT, fn, statistic="Maximum")
                    for fn in EMITTERS[m.BUDGET_USED_PERCENT]
                },
                label="Budget used (%)",
                period=ONE_MINUTE,
            ),
            threshold=BUDGET_WARNING_PERCENT,
            comparison=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        )

    def _any_in_a_row(self, name: str, description: str, metric: str, *, periods: int) -> None:
        """An alarm when `metric` (summed over its emitters) is above 0 in `periods` 5-minute periods in a row."""
        self._alarm(
            name,
            description,
            summed(self.config, metric, EMITTERS[metric], FIVE_MINUTES),
            threshold=0,
            evaluation_periods=periods,
        )

    def notify_every_alarm(self, scope: Construct) -> None:
        """Point every alarm under `scope` (the whole stack: DLQ alarms too) at the topic, and let them publish.

        The topic policy `enforce_ssl` writes REPLACES SNS's default policy, so nothing else may publish: CloudWatch
        may, for exactly these alarms (`aws:SourceArn`) of this account (`aws:SourceAccount`). The alarms refer to
        the topic and the topic policy to the alarms: no cycle (the policy is its own resource).
        https://docs.aws.amazon.com/sns/latest/dg/sns-access-policy-use-cases.html (CloudWatch alarms publishing)
        """
        action = actions.SnsAction(self.topic)
        alarms = [construct for construct in scope.node.find_all() if isinstance(construct, cloudwatch.Alarm)]
        for alarm in alarms:
            alarm.add_alarm_action(action)
        self.topic.add_to_resource_policy(
            iam.PolicyStatement(
                sid="CloudWatchAlarmsPublish",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["sns:Publish"],
                resources=[self.topic.topic_arn],
                conditions={
                    "StringEquals": {"aws:SourceAccount": Stack.of(self).account},
                    "ArnEquals": {"aws:SourceArn": [alarm.alarm_arn for alarm in alarms]},
                },
            )
        )

    # --- dashboard ---------------------------------------------------------------------------------------------

    def _dashboard(
        self, functions: Mapping[str, lambda_.IFunction], queues: Mapping[str, sqs.IQueue], active_session_quota: int
    ) -> cloudwatch.Dashboard:
        config = self.config
        period = ONE_MINUTE

        def total(name: str, label: str) -> cloudwatch.MathExpression:
            return summed(config, name, EMITTERS.get(name, ("dispatch", "completion", "sweeper")), period, label)

        rollouts = cloudwatch.GraphWidget(
            title="Rollouts per minute",
            left=[
                total(m.SUBMITTED, "submitted"),
                total(m.DISPATCHED, "dispatched"),
                total(m.SUCCEEDED, "succeeded"),
                total(m.FAILED, "failed"),
            ],
            right=[pipeline_metric(config, m.IN_FLIGHT, "sweeper", statistic="Maximum").with_(label="in flight")],
            right_y_axis=cloudwatch.YAxisProps(label="in flight", min=0),
            width=12,
        )
        reasons = cloudwatch.GraphWidget(
            title="Failed rollouts by reason",
            left=[total(m.failed_metric(reason), reason) for reason in FAILURE_REASONS],
            stacked=True,
            width=12,
        )
        sessions, latency = self._session_widgets(total)
        reward = cloudwatch.GraphWidget(
            title="Reward (mean of finished rollouts)",
            left=[pipeline_metric(config, m.REWARD, "completion", statistic="Average", period=FIVE_MINUTES)],
            width=8,
        )
        depth = cloudwatch.GraphWidget(
            title="Queue depths",
            left=[
                queue.metric_approximate_number_of_messages_visible(label=name, period=period, statistic="Maximum")
                for name, queue in queues.items()
            ],
            width=8,
        )
        errors = cloudwatch.GraphWidget(
            title="Lambda errors and throttles",
            left=[fn.metric_errors(label=f"{name} errors", period=period) for name, fn in functions.items()],
            right=[fn.metric_throttles(label=f"{name} throttles", period=period) for name, fn in functions.items()],
            width=8,
        )
        capacity = self._capacity_widget(active_session_quota)
        cost, budget = self._cost_widgets(total)
        alarms = cloudwatch.AlarmStatusWidget(title="Alarms", alarms=list(self.alarms.values()), width=12, height=6)
        return cloudwatch.Dashboard(
            self,
            "Dashboard",
            dashboard_name=topology.stack_name(config.name),
            default_interval=Duration.hours(3),
            widgets=[
                [cloudwatch.TextWidget(markdown=f"# Rollouts: {config.name}", width=24, height=1)],
                [rollouts, reasons],
                [sessions, latency],
                [reward, depth, errors],
                [cost, budget],
                [capacity, alarms],
            ],
        )

    def _session_widgets(
        self, total: Callable[[str, str], cloudwatch.MathExpression]
    ) -> tuple[cloudwatch.GraphWidget, cloudwatch.GraphWidget]:
        """New sessions per second, this experiment's beside the whole account's, against the account's quota (with
        AgentCore's refusals), and result-to-event latency."""
        config, period = self.config, ONE_MINUTE
        quota = quotas.DEFAULT_NEW_SESSIONS_PER_S
        sessions = cloudwatch.GraphWidget(
            title="New sessions per second: this experiment and the whole account",
            left=[
                cloudwatch.MathExpression(
                    expression="FILL(new, 0) / PERIOD(new)",
                    using_metrics={"new": pipeline_metric(config, m.NEW_SESSIONS, "dispatch")},
                    label=f"{config.name} new sessions/s",
                    period=period,
                ),
                account_new_sessions(period),
            ],
            left_annotations=[
                cloudwatch.HorizontalAnnotation(value=quota, label="documented account quota"),
                cloudwatch.HorizontalAnnotation(
                    value=quota * (1 - quotas.DEFAULT_RESERVE), label="pool less the default reserve"
                ),
                *(
                    [cloudwatch.HorizontalAnnotation(value=config.session_rate_limit, label="session_rate_limit")]
                    if config.session_rate_limit
                    else []
                ),
            ],
            # AgentCore's refusals apart from the pipeline's own backlog (calls that found no budget in time).
            right=[total(m.ACR_THROTTLED, "AgentCore throttled"), total(m.LIMIT_BACKLOG, "budget backlog")],
            right_y_axis=cloudwatch.YAxisProps(label="calls per minute", min=0),
            width=12,
        )
        latency = cloudwatch.GraphWidget(
            title="Result-to-event latency (ms)",
            left=[
                pipeline_metric(config, m.NOTIFICATION_LATENCY, fn, statistic=stat).with_(label=f"{fn} {stat}")
                for fn in EMITTERS[m.NOTIFICATION_LATENCY]
                for stat in ("p50", "p99")
            ],
            width=12,
        )
        return sessions, latency

    def _cost_widgets(
        self, total: Callable[[str, str], cloudwatch.MathExpression]
    ) -> tuple[cloudwatch.GraphWidget, cloudwatch.GraphWidget]:
        """Estimated cost per minute with its running total, and the budget used with runaway and held rollouts."""
        config, period = self.config, ONE_MINUTE
        spend = summed(config, m.ESTIMATED_COST, EMITTERS[m.ESTIMATED_COST], period, "USD per minute")
        cost = cloudwatch.GraphWidget(
            title="Estimated cost (USD: AgentCore sessions + the pipeline's AWS, docs/costs.md)",
            left=[spend],
            right=[
                cloudwatch.MathExpression(
                    expression="RUNNING_SUM(spend)",
                    using_metrics={"spend": spend},
                    label="total over the period shown",
                    period=period,
                )
            ],
            right_y_axis=cloudwatch.YAxisProps(label="USD", min=0),
            width=12,
        )
        budget = cloudwatch.GraphWidget(
            title="Budget used (%) and runaway sessions",
            left=[
                pipeline_metric(config, m.BUDGET_USED_PERCENT, fn, statistic="Maximum").with_(label=f"budget ({fn})")
                for fn in EMITTERS[m.BUDGET_USED_PERCENT]
            ],
            left_annotations=[
                cloudwatch.HorizontalAnnotation(value=BUDGET_WARNING_PERCENT, label="warning"),
                cloudwatch.HorizontalAnnotation(value=100, label="dispatch pauses"),
            ],
            left_y_axis=cloudwatch.YAxisProps(label="%", min=0),
            right=[total(m.SESSIONS_OVERDUE, "sessions overdue"), total(m.BUDGET_HELD, "rollouts held on the budget")],
            right_y_axis=cloudwatch.YAxisProps(label="per minute", min=0),
            width=12,
        )
        return cost, budget

    def _capacity_widget(self, active_session_quota: int) -> cloudwatch.GraphWidget:
        """AgentCore's active sessions against the account's quota."""
        period = ONE_MINUTE
        return cloudwatch.GraphWidget(
            title="AgentCore active sessions vs quota",
            left=[
                cloudwatch.Metric(
                    namespace=AGENTCORE_NAMESPACE, metric_name=ACTIVE_SESSIONS, statistic="Maximum", period=period
                )
            ],
            left_annotations=[cloudwatch.HorizontalAnnotation(value=active_session_quota, label="quota")],
            width=12,
        )


class RuntimeLogRetention(Construct):
    """A retention on the AgentCore runtime's log group, which the service creates without one.

    The service may create `/aws/bedrock-agentcore/runtimes/{id}-{endpoint}` itself (at creation or on the first
    session), so a CloudFormation LogGroup could collide with it: a custom resource creates it if missing
    (ignoring "already exists"), sets the retention, and deletes it on `cdk destroy` unless results are retained.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        runtime: agentcore.Runtime,
        endpoint: str,
        retention_days: int,
        retained: bool,
    ) -> None:
        super().__init__(scope, construct_id)
        self._runtime, self._endpoint = runtime, endpoint
        self.log_group_name = f"{RUNTIME_LOG_PREFIX}{runtime.agent_runtime_id}-{endpoint}"
        # Both ARN forms: CloudWatch Logs authorizes some calls on `log-group:NAME` and others on `log-group:NAME:*`
        # (https://docs.aws.amazon.com/AmazonCloudWatch/latest/logs/iam-access-control-overview-cwl.html).
        self.log_group_arns = [
            Stack.of(self).format_arn(
                service="logs",
                resource="log-group",
                resource_name=name,
                arn_format=ArnFormat.COLON_RESOURCE_NAME,
            )
            for name in (self.log_group_name, f"{self.log_group_name}:*")
        ]
        create = cr.AwsSdkCall(
            service="CloudWatchLogs",
            action="createLogGroup",
            parameters={"logGroupName": self.log_group_name},
            physical_resource_id=cr.PhysicalResourceId.of(self.log_group_name),
            ignore_error_codes_matching="ResourceAlreadyExistsException",
        )
        retention = cr.AwsSdkCall(
            service="CloudWatchLogs",
            action="putRetentionPolicy",
            parameters={"logGroupName": self.log_group_name, "retentionInDays": retention_days},
            physical_resource_id=cr.PhysicalResourceId.of(self.log_group_name),
        )
        delete = cr.AwsSdkCall(
            service="CloudWatchLogs",
            action="deleteLogGroup",
            parameters={"logGroupName": self.log_group_name},
            ignore_error_codes_matching="ResourceNotFoundException",
        )
        policy = cr.AwsCustomResourcePolicy.from_statements(
            [
                iam.PolicyStatement(
                    actions=["logs:CreateLogGroup", "logs:PutRetentionPolicy", "logs:DeleteLogGroup"],
                    resources=self.log_group_arns,
                )
            ]
        )
        self.create = cr.AwsCustomResource(
            self,
            "Create",
            on_create=create,
            on_delete=None if retained else delete,
            policy=policy,
            install_latest_aws_sdk=False,
        )
        self.retention = cr.AwsCustomResource(
            self, "Retention", on_create=retention, on_update=retention, policy=policy, install_latest_aws_sdk=False
        )
        self.retention.node.add_dependency(self.create)
        self._acknowledge()

    def _acknowledge(self) -> None:
        stack = Stack.of(self)
        runtime_arn = f"{nag.account_arn(stack, 'logs')}:log-group:{RUNTIME_LOG_PREFIX}"
        for custom in (self.create, self.retention):
            policy = custom.node.find_child("CustomResourcePolicy")
            nag.ack(
                policy,
                nag.iam5(f"{runtime_arn}<{nag.logical_id(self._runtime)}.AgentRuntimeId>-{self._endpoint}:*"),
                "The runtime's own log group (log-group ARNs end in ':*'); its name is known after the runtime exists.",
            )
        for child in stack.node.children:
            if child.node.id.startswith("AWS679f53fac002430cb0da5b7982bd2287"):
                nag.ack(
                    child.node.find_child("ServiceRole"),
                    f"{nag.IAM4}[{nag.BASIC_EXECUTION_POLICY}]",
                    "CDK's AwsCustomResource handler (runtime log retention) only needs to write its logs.",
                )


def expire_every_log_group(scope: Construct, retention_days: int, removal: RemovalPolicy) -> None:
    """Give every log group in `scope` a retention and the stack's removal policy.

    CDK-managed log groups of library and framework handlers (the deploy-time build's, AwsCustomResource's)
    default to two years and Retain; `cdk destroy` of a `results_retention=destroy` stack must not leave them.
    """
    for construct in scope.node.find_all():
        if isinstance(construct, logs.CfnLogGroup):
            if construct.retention_in_days in (None, DEFAULT_CDK_LOG_RETENTION_DAYS):
                construct.retention_in_days = retention_days
            construct.apply_removal_policy(removal)


#: Where Lambda writes a function's logs when its LoggingConfig names no log group.
LAMBDA_LOG_PREFIX: Final = "/aws/lambda/"


def give_every_function_a_log_group(stack: Stack, retention_days: int, removal: RemovalPolicy) -> None:
    """A log group with a retention for every function of the stack, in place before its first invocation.

    CDK's singleton handlers made from a bare `CfnResource` (`BucketNotificationsHandler`, the S3 auto-delete
    provider) get no log group: Lambda would create `/aws/lambda/{name}` on first use, with no retention and
    outside the stack. This adds `/aws/lambda/{name}` with the stack's retention where none exists, and makes
    every custom resource a function serves depend on its log group (CDK-managed ones included), so the group
    exists before the function first writes (else Lambda creates it first and the stack's create of it fails).
    """
    groups = {
        json.dumps(stack.resolve(group.log_group_name), sort_keys=True): group
        for group in stack.node.find_all()
        if isinstance(group, logs.CfnLogGroup)
    }
    for function in stack.node.find_all():
        if not isinstance(function, CfnResource) or function.cfn_resource_type != "AWS::Lambda::Function":
            continue
        configured = function.logging_config if isinstance(function, lambda_.CfnFunction) else None
        if configured is not None and stack.resolve(configured).get("logGroup"):
            continue  # the pipeline's functions: their own log group, set before the function is created
        name = Fn.join("", [LAMBDA_LOG_PREFIX, function.ref])
        group = groups.get(json.dumps(stack.resolve(name), sort_keys=True))
        if group is None:
            scope = function.node.scope
            assert isinstance(scope, Construct)
            group = logs.CfnLogGroup(scope, "LogGroup", log_group_name=name, retention_in_days=retention_days)
            group.apply_removal_policy(removal)
        for custom in _served_by(stack, stack.resolve(function.logical_id)):
            custom.add_dependency(group)


def _served_by(stack: Stack, function_id: str) -> list[CfnResource]:
    """The custom resources whose ServiceToken is the function `function_id`."""
    served = []
    for construct in stack.node.find_all():
        if isinstance(construct, CfnResource) and construct.cfn_resource_type.startswith("Custom::"):
            token = stack.resolve(construct._cfn_properties).get("ServiceToken")
            if token == {"Fn::GetAtt": [function_id, "Arn"]}:
                served.append(construct)
    return served
