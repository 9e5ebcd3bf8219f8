"""Local mode's HTTP sinks: what an EventBridge API destination does, as a local consumer.

Each sink gets a queue and a dead-letter queue on the local endpoint, and one rule per detail type on the
experiment's bus, with the patterns the stack deploys (`rollout_pipeline.sinks`). `SinkConsumer` reads the queue and
sends each event as the API destination would: the same URL and body (`CompiledSink.url_for`,
`CompiledBody.render`), a 5 s time-out, at most `rate_per_s` requests a second. An answer EventBridge retries
(`sinks.retried`) leaves the message in the queue for the next attempt, after an exponential back-off with jitter
(its visibility); once `max_retry_attempts` retries or `max_event_age_s` have passed, or at an answer EventBridge
does not retry, the event goes to the dead-letter queue with EventBridge's message attributes (`ERROR_CODE`,
`ERROR_MESSAGE`, `RETRY_ATTEMPTS`, `RULE_ARN`, `TARGET_ARN`). Nothing is dropped: a message leaves the queue only
once it was delivered or dead-lettered.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from rollout_pipeline import sinks, topology
from rollout_pipeline.config import ExperimentConfig, SinkSettings
from rollout_pipeline.contracts import parse_iso

log = logging.getLogger(__name__)

#: The first retry's back-off; each one doubles it (with full jitter), up to `MAX_BACKOFF_S`.
RETRY_BASE_S: Final = 1.0
MAX_BACKOFF_S: Final = 60.0
#: How long one receive waits for a message.
POLL_WAIT_S: Final = 1


@dataclass(frozen=True)
class SinkQueues:
    """One sink's local resources."""

    sink: sinks.CompiledSink
    queue_url: str
    dlq_url: str
    rule_arns: tuple[str, ...]


def sink_rule_name(config: ExperimentConfig, sink: str, detail_type: str) -> str:
    """The rule of one sink and detail type (as the stack names it)."""
    return f"{topology.resource_base(config.name)}-sink-{sink}-{detail_type.lower().replace(' ', '-')}"[:64]


def create_sink_resources(config: ExperimentConfig, bus_name: str, client: Callable[[str], Any]) -> list[SinkQueues]:
    """Each sink's queue, dead-letter queue and rules on the local endpoint (idempotent)."""
    sqs, events = client("sqs"), client("events")
    base = topology.resource_base(config.name)
    made: list[SinkQueues] = []
    for sink in sinks.compile_sinks(config):
        queue_url = sqs.create_queue(QueueName=f"{base}-sink-{sink.name}")["QueueUrl"]
        dlq_url = sqs.create_queue(QueueName=f"{base}-sink-{sink.name}-dlq")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        rules = []
        for route in sink.routes:
            name = sink_rule_name(config, sink.name, route.detail_type)
            rules.append(
                events.put_rule(
                    Name=name, EventBusName=bus_name, EventPattern=json.dumps(route.pattern), State="ENABLED"
                )["RuleArn"]
            )
            events.put_targets(Rule=name, EventBusName=bus_name, Targets=[{"Id": "sink", "Arn": arn}])
        made.append(SinkQueues(sink, queue_url, dlq_url, tuple(rules)))
    return made


@dataclass
class SinkStats:
    delivered: int = 0
    retried: int = 0
    dead_lettered: int = 0
    answers: list[int | None] = field(default_factory=list)


class SinkConsumer:
    """Delivers one sink's events (see the module doc). `start()` runs it in a thread; `stop()` ends it."""

    def __init__(
        self,
        queues: SinkQueues,
        client: Callable[[str], Any],
        *,
        secret: Callable[[SinkSettings], str | None] | None = None,
        retry_base_s: float = RETRY_BASE_S,
        rng: random.Random | None = None,
    ) -> None:
        self.queues = queues
        self.sink = queues.sink
        self.sqs = client("sqs")
        self._secret = secret or (lambda settings: secret_value(settings, client))
        self.retry_base_s = retry_base_s
        self.stats = SinkStats()
        self._rng = rng or random.Random()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_send = 0.0

    def start(self) -> SinkConsumer:
        self._thread = threading.Thread(target=self._run, name=f"sink-{self.sink.name}", daemon=True)
        self._thread.start()
        return self

    def request_stop(self) -> None:
        """Take no more messages (a message being sent finishes; one left in the queue is not lost)."""
        self._stop.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception:  # the endpoint went away (local mode stopping) or a passing error: poll again
                log.exception("sink %s: poll failed", self.sink.name)
                self._stop.wait(1.0)

    def poll_once(self, wait_s: int = POLL_WAIT_S) -> int:
        """Receive and handle one batch of messages; returns how many were received."""
        resp = self.sqs.receive_message(
            QueueUrl=self.queues.queue_url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=wait_s,
            AttributeNames=["ApproximateReceiveCount"],
        )
        messages = resp.get("Messages") or []
        for message in messages:
            if self._stop.is_set():
                break
            self._handle(message)
        return len(messages)

    def _handle(self, message: dict[str, Any]) -> None:
        event = json.loads(message["Body"])
        retries = int(message.get("Attributes", {}).get("ApproximateReceiveCount", "1")) - 1
        route = self.sink.route(str(event.get("detail-type")))
        if route is None:  # not one of this sink's detail types: nothing to deliver
            self._delete(message)
            return
        status, error = self._send(self.sink.url_for(event), route.body.render(event))
        self.stats.answers.append(status)
        if status is not None and 200 <= status < 300:
            self.stats.delivered += 1
            self._delete(message)
            return
        settings = self.sink.settings
        if sinks.retried(status) and retries < settings.max_retry_attempts and _age_s(event) < settings.max_event_age_s:
            self.stats.retried += 1
            backoff = min(MAX_BACKOFF_S, self.retry_base_s * 2**retries) * self._rng.uniform(0.5, 1.0)
            self.sqs.change_message_visibility(
                QueueUrl=self.queues.queue_url,
                ReceiptHandle=message["ReceiptHandle"],
                VisibilityTimeout=max(0, round(backoff)),
            )
            if backoff < 1:  # SQS counts whole seconds: a shorter back-off waits here
                time.sleep(backoff)
            return
        self._dead_letter(message, status, error, retries)

    def _send(self, url: str, body: bytes) -> tuple[int | None, str]:
        settings = self.sink.settings
        now = time.monotonic()
        if now < self._next_send:
            time.sleep(self._next_send - now)
        self._next_send = max(now, self._next_send) + 1.0 / settings.rate_per_s
        headers = {"Content-Type": "application/json; charset=utf-8", **settings.headers, **self._auth_headers()}
        request = urllib.request.Request(url, data=body, method=settings.method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=sinks.REQUEST_TIMEOUT_S) as answer:
                return int(answer.status), ""
        except urllib.error.HTTPError as exc:
            return int(exc.code), str(exc.reason)
        except (OSError, TimeoutError) as exc:
            return None, str(exc)

    def _auth_headers(self) -> dict[str, str]:
        auth = self.sink.settings.auth
        if auth.type == "none":
            return {}
        value = self._secret(self.sink.settings) or ""
        if auth.type == "api_key":
            return {auth.header: value}
        token = base64.b64encode(f"{auth.username}:{value}".encode()).decode()
        return {"Authorization": f"Basic {token}"}

    def _delete(self, message: dict[str, Any]) -> None:
        self.sqs.delete_message(QueueUrl=self.queues.queue_url, ReceiptHandle=message["ReceiptHandle"])

    def _dead_letter(self, message: dict[str, Any], status: int | None, error: str, retries: int) -> None:
        code = "SDK_CLIENT_ERROR" if status is None else f"{status}"
        attributes = {
            "ERROR_CODE": code,
            "ERROR_MESSAGE": (error or f"HTTP {status}")[:256],
            "RETRY_ATTEMPTS": str(retries),
            "RULE_ARN": self.queues.rule_arns[0] if self.queues.rule_arns else "",
            "TARGET_ARN": self.sink.endpoint,
        }
        self.sqs.send_message(
            QueueUrl=self.queues.dlq_url,
            MessageBody=message["Body"],
            MessageAttributes={k: {"DataType": "String", "StringValue": v or "-"} for k, v in attributes.items()},
        )
        self.stats.dead_lettered += 1
        self._delete(message)
        log.warning("sink %s: event dead-lettered after %d retries (%s)", self.sink.name, retries, code)


def _age_s(event: dict[str, Any]) -> float:
    sent = parse_iso(event.get("time"))
    return 0.0 if sent is None else (datetime.now(UTC) - sent).total_seconds()


def secret_value(settings: SinkSettings, client: Callable[[str], Any]) -> str | None:
    """The sink's secret from (local) Secrets Manager: the string, or its JSON's `secret_field`."""
    auth = settings.auth
    if not auth.secret:
        return None
    text = client("secretsmanager").get_secret_value(SecretId=auth.secret).get("SecretString") or ""
    if auth.secret_field:
        with contextlib.suppress(json.JSONDecodeError, AttributeError):
            return str(json.loads(text).get(auth.secret_field) or "")
        return ""
    return str(text)
