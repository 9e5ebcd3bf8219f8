"""Event routing: the experiment's custom bus (+archive) feeding the trainer queue, and S3 rules on the default bus."""

from __future__ import annotations

from typing import Any, Final

from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from rollout_pipeline import routing, topology
from rollout_pipeline.config import ExperimentConfig
from stacks.queues import DLQ_RETENTION, QueueWithDlq, not_empty_alarm, private_queue

#: The trainer may be offline for a while: keep its events as long as its dead-letter queue allows (a message the
#: trainer failed on keeps its enqueue time in the DLQ: `queues.MIN_DLQ_DWELL`).
TRAINER_RETENTION: Final = Duration.days(10)
TRAINER_VISIBILITY: Final = Duration.seconds(topology.TRAINER_VISIBILITY_TIMEOUT_S)
#: EventBridge retries a failed delivery to a target up to 185 times over 24 hours before dead-lettering it.
TARGET_RETRY_ATTEMPTS: Final = 185
TARGET_MAX_EVENT_AGE: Final = Duration.hours(24)


def event_pattern(pattern: dict[str, Any]) -> events.EventPattern:
    """A plain EventBridge pattern dict (as in `rollout_pipeline.routing`) as a CDK EventPattern."""
    return events.EventPattern(
        source=pattern.get("source"),
        detail_type=pattern.get("detail-type"),
        detail=pattern.get("detail"),
    )


def bus_name(config: ExperimentConfig) -> str:
    return topology.bus_name(config.name)


class EventRouting(Construct):
    """The experiment bus with an archive and a rule sending every pipeline event to the trainer queue.

    Users add their own rules on `bus` (any target: Lambda, API destination, Kinesis, another queue).
    """

    def __init__(
        self, scope: Construct, construct_id: str, *, config: ExperimentConfig, archive_retention_days: int
    ) -> None:
        super().__init__(scope, construct_id)
        self.bus = events.EventBus(
            self, "Bus", event_bus_name=bus_name(config), description=f"Rollout events of experiment {config.name}"
        )
        if archive_retention_days > 0:
            self.bus.archive(
                "Archive",
                description=f"Replayable rollout events of {config.name}",
                event_pattern=event_pattern(routing.trainer_event_pattern()),
                retention=Duration.days(archive_retention_days),
            )
        # Events EventBridge could not deliver to a rule's queue (after retries) land here instead of being dropped.
        self.undelivered = private_queue(self, "Undelivered", retention_period=DLQ_RETENTION)
        not_empty_alarm(
            self,
            "UndeliveredNotEmpty",
            self.undelivered,
            "Events EventBridge could not deliver to a pipeline queue: inspect them and re-send them to their queue",
        )
        self.trainer = QueueWithDlq(
            self, "Trainer", visibility_timeout=TRAINER_VISIBILITY, retention_period=TRAINER_RETENTION
        )
        self.trainer_queue: sqs.Queue = self.trainer.queue
        events.Rule(
            self,
            "ToTrainer",
            event_bus=self.bus,
            description="Every pipeline event to the trainer queue",
            event_pattern=event_pattern(routing.trainer_event_pattern()),
            targets=[self.queue_target(self.trainer_queue)],
        )

    def queue_target(self, queue: sqs.IQueue) -> targets.SqsQueue:
        """A rule target delivering to `queue`, retried for a day, then kept in the undelivered-events queue."""
        return targets.SqsQueue(
            queue,
            dead_letter_queue=self.undelivered,
            retry_attempts=TARGET_RETRY_ATTEMPTS,
            max_event_age=TARGET_MAX_EVENT_AGE,
        )

    def s3_rule(
        self, scope: Construct, construct_id: str, *, pattern: dict[str, Any], queue: sqs.IQueue, description: str
    ) -> events.Rule:
        """A default-bus rule (where S3 sends its events) delivering matching events to `queue`."""
        return events.Rule(
            scope,
            construct_id,
            description=description,
            event_pattern=event_pattern(pattern),
            targets=[self.queue_target(queue)],
        )
