"""HTTP sinks (`sinks`): each an EventBridge API destination fed by rules on the experiment bus.

Per sink: a connection (its authorization: an API key header or basic auth read from the named Secrets Manager
secret at deploy time, or a fixed non-secret header for `none`), an API destination (the endpoint with `*` for each
path parameter, the method, the invocation rate), one rule per detail type with the patterns and bodies
`rollout_pipeline.sinks` compiles (the same ones local mode's consumer uses), each target retried as the sink says
and dead-lettered into the sink's own encrypted, TLS-only queue (an alarm when it holds anything). The target's role
may invoke this one API destination and nothing else; the queue takes messages from these rules only.
"""

from __future__ import annotations

from typing import Final

from aws_cdk import Duration, SecretValue
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from rollout_pipeline import sinks
from rollout_pipeline.config import ConfigError, ExperimentConfig, SinkAuth
from stacks import nag
from stacks.events import event_pattern
from stacks.queues import DLQ_RETENTION, not_empty_alarm, private_queue

#: The header a sink without authorization sends (EventBridge connections always authorize; its value is the
#: sink's name, not a secret).
NO_AUTH_HEADER: Final = "x-rollouts-sink"


def authorization(name: str, auth: SinkAuth) -> events.Authorization:
    """The connection's authorization: the secret is resolved by CloudFormation (a dynamic reference), never in the
    template."""
    if auth.type == "none":
        return events.Authorization.api_key(NO_AUTH_HEADER, SecretValue.unsafe_plain_text(name))
    assert auth.secret is not None  # SinkAuth refuses api_key / basic without it
    secret = SecretValue.secrets_manager(auth.secret, json_field=auth.secret_field)
    if auth.type == "api_key":
        return events.Authorization.api_key(auth.header, secret)
    assert auth.username is not None
    return events.Authorization.basic(auth.username, secret)


class SinksConstruct(Construct):
    """Every sink of the experiment (nothing when `sinks` is empty)."""

    def __init__(self, scope: Construct, construct_id: str, *, config: ExperimentConfig, bus: events.IEventBus) -> None:
        super().__init__(scope, construct_id)
        compiled = sinks.compile_sinks(config)
        problems = sinks.deploy_problems(compiled)
        if problems:
            raise ConfigError("; ".join(problems))
        self.destinations: dict[str, events.ApiDestination] = {}
        self.dead_letter_queues: dict[str, sqs.Queue] = {}
        for sink in compiled:
            self._sink(sink, bus)

    def _sink(self, sink: sinks.CompiledSink, bus: events.IEventBus) -> None:
        scope = Construct(self, sink.name)
        settings = sink.settings
        connection = events.Connection(
            scope,
            "Connection",
            authorization=authorization(sink.name, settings.auth),
            description=f"Authorization of the HTTP sink {sink.name}",
        )
        destination = events.ApiDestination(
            scope,
            "Destination",
            connection=connection,
            endpoint=sink.endpoint,
            http_method=events.HttpMethod(settings.method),
            rate_limit_per_second=settings.rate_per_s,
            description=f"HTTP sink {sink.name}",
        )
        dlq = private_queue(scope, "Dlq", retention_period=DLQ_RETENTION)
        nag.ack(
            dlq,
            "AwsSolutions-SQS3",
            "This queue is itself a dead-letter queue: the sink's rule targets send it the events they cannot deliver.",
        )
        not_empty_alarm(
            scope,
            "DlqNotEmpty",
            dlq,
            f"Events the HTTP sink {sink.name} could not deliver (its answer, retries and age are message attributes)",
        )
        for position, route in enumerate(sink.routes):
            target = targets.ApiDestination(
                destination,
                dead_letter_queue=dlq,
                retry_attempts=settings.max_retry_attempts,
                max_event_age=Duration.seconds(settings.max_event_age_s),
                path_parameter_values=list(sink.path_parameters) or None,
                header_parameters=dict(settings.headers) or None,
            )
            rule = events.Rule(
                scope,
                f"Rule{position}",
                event_bus=bus,
                description=f"{route.detail_type} to the HTTP sink {sink.name}",
                event_pattern=event_pattern(route.pattern),
                targets=[target],
            )
            _set_body(rule, route.body)
        self.destinations[sink.name] = destination
        self.dead_letter_queues[sink.name] = dlq


def _set_body(rule: events.Rule, body: sinks.CompiledBody) -> None:
    """The target's input: the compiled body exactly (an input path, an input transformer, or a literal)."""
    cfn = rule.node.default_child
    assert isinstance(cfn, events.CfnRule)
    if body.input_path is not None:
        cfn.add_property_override("Targets.0.InputPath", body.input_path)
    elif body.paths:
        cfn.add_property_override(
            "Targets.0.InputTransformer",
            {"InputPathsMap": dict(body.paths), "InputTemplate": body.input_template},
        )
    else:
        cfn.add_property_override("Targets.0.Input", body.input_template)
