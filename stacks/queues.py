"""SQS building blocks: an encrypted queue with its dead-letter queue and DLQ alarm, and a queue-fed Lambda."""

from __future__ import annotations

from typing import Any, Final

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from rollout_pipeline.topology import DLQ_MAX_RECEIVE_COUNT, FunctionSpec

#: SQS's maximum: a dead-letter queue keeps its messages as long as SQS allows.
DLQ_RETENTION: Final = Duration.days(14)
DEFAULT_RETENTION: Final = Duration.days(4)
#: SQS keeps a message's ORIGINAL enqueue time when it moves it to the dead-letter queue, so a message dead-lettered
#: at the end of its queue's retention has only `DLQ_RETENTION - retention` left there: a queue with a DLQ keeps its
#: messages at most `DLQ_RETENTION - MIN_DLQ_DWELL`, so anything dead-lettered stays at least this long to be redriven.
#: https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-dead-letter-queues.html
MIN_DLQ_DWELL: Final = Duration.days(4)
DEFAULT_MAX_RECEIVE_COUNT: Final = DLQ_MAX_RECEIVE_COUNT


def private_queue(scope: Construct, construct_id: str, **props: Any) -> sqs.Queue:
    """A queue of the experiment: SQS-managed encryption at rest, TLS only (a policy denies plain HTTP)."""
    return sqs.Queue(scope, construct_id, encryption=sqs.QueueEncryption.SQS_MANAGED, enforce_ssl=True, **props)


class QueueWithDlq(Construct):
    """SSE-SQS, TLS-only queue whose poison messages go to a 14-day DLQ, with an alarm on a non-empty DLQ; the
    queue's own retention leaves a dead-lettered message at least `MIN_DLQ_DWELL` in the DLQ."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        visibility_timeout: Duration,
        retention_period: Duration = DEFAULT_RETENTION,
        max_receive_count: int = DEFAULT_MAX_RECEIVE_COUNT,
    ) -> None:
        super().__init__(scope, construct_id)
        if retention_period.to_seconds() + MIN_DLQ_DWELL.to_seconds() > DLQ_RETENTION.to_seconds():
            raise ValueError(
                f"{self.node.path}: a queue with a dead-letter queue keeps its messages at most "
                f"{(DLQ_RETENTION.to_seconds() - MIN_DLQ_DWELL.to_seconds()) // 86400} days (SQS keeps a message's "
                "enqueue time when it dead-letters it)"
            )
        self.dlq = private_queue(self, "Dlq", retention_period=DLQ_RETENTION)
        self.queue = private_queue(
            self,
            "Queue",
            visibility_timeout=visibility_timeout,
            retention_period=retention_period,
            dead_letter_queue=sqs.DeadLetterQueue(queue=self.dlq, max_receive_count=max_receive_count),
        )
        self.dlq_alarm = not_empty_alarm(
            self,
            "DlqNotEmpty",
            self.dlq,
            f"Messages in the dead-letter queue of {self.node.path}: inspect and redrive them",
        )


def not_empty_alarm(scope: Construct, construct_id: str, queue: sqs.IQueue, description: str) -> cloudwatch.Alarm:
    """An alarm that fires as soon as `queue` holds a visible message (dead-letter queues must stay empty)."""
    return cloudwatch.Alarm(
        scope,
        construct_id,
        alarm_description=description,
        metric=queue.metric_approximate_number_of_messages_visible(
            period=Duration.minutes(1), statistic=cloudwatch.Stats.MAXIMUM
        ),
        threshold=0,
        comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
        evaluation_periods=1,
        treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
    )


class QueuedLambdaConsumer(Construct):
    """A Lambda fed by its own queue (+DLQ, alarm) with partial batch responses and bounded concurrency.

    Every number comes from the function's `topology.FunctionSpec`: batch size, batching window, maximum
    concurrency, and the queue's visibility timeout derived from the function timeout.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        function: lambda_.Function,
        spec: FunctionSpec,
        max_receive_count: int = DEFAULT_MAX_RECEIVE_COUNT,
        retention_period: Duration = DEFAULT_RETENTION,
    ) -> None:
        super().__init__(scope, construct_id)
        if spec.batch_size is None or spec.max_concurrency is None:
            raise ValueError(f"{spec.name} is not a queue consumer in the topology")
        self.spec = spec
        self.queues = QueueWithDlq(
            self,
            "Queues",
            visibility_timeout=Duration.seconds(spec.visibility_timeout_s),
            retention_period=retention_period,
            max_receive_count=max_receive_count,
        )
        self.queue = self.queues.queue
        self.dlq = self.queues.dlq
        self.function = function
        function.add_event_source(
            sources.SqsEventSource(
                self.queue,
                batch_size=spec.batch_size,
                max_batching_window=Duration.seconds(spec.batching_window_s),
                report_batch_item_failures=True,
                max_concurrency=spec.max_concurrency,
            )
        )
