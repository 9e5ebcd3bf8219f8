"""`rollouts smoke`: what a user runs right after the first deploy. Each check is one line, `pass`, `fail` or
`skipped`, with what to do; everything the run creates is removed at the end.

It checks against the deployed stack what only a real account can show:

- `special key`: a tiny batch (a few rows of the bundled arithmetic sample) uploaded straight to S3 under a key with
  `+` and a space goes through (a refusal by the pipeline's own key rule is recorded, a misread key is a fail);
- `batch`: that batch (or, after a refusal, the same rows under a plain key) from upload to `Batch Completed`, every
  rollout succeeded;
- `sessions stopped`: every rollout's AgentCore session stop confirmed in the ledger;
- `dead letters`: no new message in any dead-letter queue of the stack;
- `event key`: the object key as the S3 event on EventBridge carried it (raw or URL-encoded: the encoding bet the
  ingest stage makes, recorded);
- `missing key`: a missing dataset key read as the ingest role answers 404, not 403 (the role must be assumable;
  else IAM's policy simulator says whether the role's policies allow `s3:ListBucket` with the `s3:prefix` context of
  the stack's grant: the policy, not S3's answer);
- `alarm delivery`: a temporary SQS subscription on the alarm topic receives the notification of a stack alarm set to
  ALARM with `SetAlarmState` (then set back to OK);
- `agentcore metrics`: the dimensions of the `AWS/Bedrock-AgentCore` metrics as `ListMetrics` shows them;
- `quota codes`: which of the AgentCore quota codes the preflight compares the account lists.

Against local mode (a loopback `endpoint_url`) the account-only checks report "skipped: local". The batch's ledger
items and results stay (they expire like any batch's).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, TextIO
from urllib.parse import quote, quote_plus, unquote, unquote_plus

from rollout_pipeline import ids, topology
from rollout_pipeline.contracts import BatchCompleted, DetailType
from rollout_pipeline.ops import subscriptions
from rollout_pipeline.ops.preflight import AGENTCORE_QUOTAS, CONTAINER_SESSION_RATE, QuotaReader, check_line
from rollout_pipeline.sdk import subscription
from rollout_pipeline.sdk._aws import aws_errors, error_code, is_loopback
from rollout_pipeline.sdk.errors import BatchNotFound, SdkError
from rollout_pipeline.sdk.experiment import Experiment

logger = logging.getLogger(__name__)

Status = Literal["pass", "fail", "skipped"]
SAMPLE: Final = Path(__file__).resolve().parents[1] / "sample_data" / "arithmetic_sample.jsonl"
AGENTCORE_NAMESPACE: Final = "AWS/Bedrock-AgentCore"
#: After `Batch Completed`, how long the stops of the batch's sessions may take to be confirmed.
STOP_GRACE_S: Final = 120.0
#: How long a notification may take from `SetAlarmState` to the SQS queue subscribed to the topic.
ALARM_WAIT_S: Final = 120.0
LOCAL: Final = "skipped: local"


@dataclass(frozen=True)
class SmokeCheck:
    """One line of `rollouts smoke`: what was checked, how it went, and what to do about it."""

    name: str
    status: Status
    message: str

    def line(self) -> str:
        return check_line(self.status, self.name, self.message)


@dataclass
class _Batch:
    key: str = ""
    batch_id: str = ""
    #: Batch ids the ingest stage derives if it reads the key otherwise (decodes a raw key): key read -> batch id.
    misread: dict[str, str] = field(default_factory=dict)
    completed: BatchCompleted | None = None
    rejected: str = ""
    read_as: str = ""


class Smoke:
    """One smoke run over an attached experiment; `run()` returns the checks in order."""

    def __init__(
        self,
        experiment: Experiment,
        *,
        rows: int = 3,
        timeout_s: float = 600.0,
        poll_wait_s: float = 5.0,
        out: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.experiment = experiment
        self.rows = max(1, min(rows, 20))
        self.timeout_s = timeout_s
        self.poll_wait_s = poll_wait_s
        self.out = out
        self.clock = clock
        self.token = uuid.uuid4().hex[:8]
        self.local = bool(experiment.aws.endpoint_url and is_loopback(experiment.aws.endpoint_url))
        self.checks: list[SmokeCheck] = []
        self._cleanup_failures: list[str] = []
        self._cleaned = 0

    # ---------------------------------------------------------------------------------------------- output

    def emit(self, name: str, status: Status, message: str) -> SmokeCheck:
        check = SmokeCheck(name, status, message)
        self.checks.append(check)
        if self.out is not None:
            print(check.line(), file=self.out, flush=True)
        return check

    def _guarded(self, name: str, check: Callable[[], None]) -> None:
        """Run one check; an AWS error becomes its `fail` line instead of ending the run."""
        try:
            check()
        except SdkError as exc:
            self.emit(name, "fail", str(exc))

    @contextlib.contextmanager
    def _cleanup(self, what: str, undo: Callable[[], Any]) -> Iterator[None]:
        try:
            yield
        finally:
            try:
                with aws_errors(what):
                    undo()
                self._cleaned += 1
            except SdkError as exc:
                self._cleanup_failures.append(str(exc))

    # ------------------------------------------------------------------------------------------------- run

    def run(self) -> list[SmokeCheck]:
        """Every check, in order (printed as it completes when `out` is given)."""
        with contextlib.ExitStack() as stack:
            batch = _Batch()
            self._guarded("batch", lambda: self._batch(stack, batch))
            self._guarded("missing key", self._missing_key)
            self._guarded("alarm delivery", lambda: self._alarm_delivery(stack))
            self._guarded("agentcore metrics", self._metrics)
            self._guarded("quota codes", self._quotas)
        if self._cleanup_failures:
            self.emit("cleanup", "fail", "; ".join(self._cleanup_failures) + ": remove these by hand")
        else:
            self.emit("cleanup", "pass", f"removed the {self._cleaned} resource(s) the smoke run created")
        return self.checks

    # ----------------------------------------------------------------------------------------------- batch

    def _rows(self) -> bytes:
        lines = SAMPLE.read_text(encoding="utf-8").splitlines()[: self.rows]
        rows = []
        for number, line in enumerate(lines, start=1):
            row = json.loads(line)
            row["id"] = f"smoke-{number}"
            rows.append(json.dumps(row))
        return ("\n".join(rows) + "\n").encode()

    def _dead_letter_queues(self) -> list[str]:
        """The stack's dead-letter queues: its queues with `Dlq` or `Undelivered` in their logical id (deployed),
        or named `*-dlq` (local mode)."""
        base = topology.resource_base(self.experiment.name)
        sqs = self.experiment.client("sqs")
        if self.local:
            urls = sqs.list_queues(QueueNamePrefix=base).get("QueueUrls", [])
            return [str(u) for u in urls if str(u).endswith("-dlq")]
        cloudformation = self.experiment.client("cloudformation")
        found = []
        pages = cloudformation.get_paginator("list_stack_resources").paginate(
            StackName=topology.stack_name(self.experiment.name)
        )
        for page in pages:
            for resource in page.get("StackResourceSummaries", []):
                logical = str(resource.get("LogicalResourceId", ""))
                if resource.get("ResourceType") == "AWS::SQS::Queue" and ("Dlq" in logical or "Undelivered" in logical):
                    found.append(str(resource["PhysicalResourceId"]))
        return found

    def _dead_letters(self, urls: list[str]) -> dict[str, int]:
        sqs = self.experiment.client("sqs")
        counts = {}
        for url in urls:
            attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
            counts[url] = int(attributes["Attributes"]["ApproximateNumberOfMessages"])
        return counts

    def _batch(self, stack: contextlib.ExitStack, batch: _Batch) -> None:
        experiment = self.experiment
        aws = experiment.aws
        prefix = f"datasets/smoke-{self.token}/"
        special_key = f"{prefix}smoke a+b {self.token}.jsonl"  # `+` and a space: the S3 event encoding bet
        with aws_errors("read the dead-letter queues"):
            dlqs = self._dead_letter_queues()
            before = self._dead_letters(dlqs)
        # The S3 event on the default bus, before the upload so it cannot be missed.
        key_pattern = {
            "source": ["aws.s3"],
            "detail-type": ["Object Created"],
            "detail": {"bucket": {"name": [experiment.input_bucket]}, "object": {"key": [{"prefix": prefix}]}},
        }
        key_name, key_queue = subscription.open_subscription(
            aws,
            "default",
            key_pattern,
            suffix="smoke",
            kind="smoke",
            name=f"{experiment.bus_name}-smoke-s3-{self.token}",
            experiment=experiment.name,
        )
        stack.enter_context(
            self._cleanup(
                "remove the S3 event subscription",
                lambda: subscriptions.remove_subscription(aws, "default", _subscription(key_name, key_queue)),
            )
        )
        tap = stack.enter_context(
            subscription.tap(aws, experiment.bus_name, None, None, None, poll_wait_s=self.poll_wait_s)
        )
        stack.enter_context(self._cleanup("delete the smoke dataset", lambda: self._delete_dataset(prefix)))
        started = self.clock()
        if not self._upload_and_wait(tap, batch, special_key):
            return
        self._special_key_line(batch)
        if batch.rejected:  # the key was refused or misread: the rest of the pipeline still gets its batch
            batch = _Batch()
            if not self._upload_and_wait(tap, batch, f"{prefix}smoke-{self.token}.jsonl"):
                return
        self._batch_line(batch, self.clock() - started)
        if batch.completed is not None:
            self._sessions_stopped(batch.batch_id)
        else:
            self.emit("sessions stopped", "skipped", "the batch did not complete")
        with aws_errors("read the dead-letter queues"):
            after = self._dead_letters(dlqs)
        grown = {url.rsplit("/", 1)[-1]: after[url] - before.get(url, 0) for url in after}
        grown = {name: count for name, count in grown.items() if count > 0}
        if not dlqs:
            self.emit(
                "dead letters", "fail", "no dead-letter queue found in the stack: is it deployed from this version?"
            )
        elif grown:
            self.emit(
                "dead letters",
                "fail",
                f"new messages in {grown}: read them (`aws sqs receive-message`), fix the cause, redrive them",
            )
        else:
            self.emit("dead letters", "pass", f"none new in the {len(dlqs)} dead-letter queue(s)")
        self._event_key(key_queue, special_key)

    def _upload_and_wait(self, tap: Any, batch: _Batch, key: str) -> bool:
        """Upload the rows under `key` (straight to S3: the SDK refuses some keys) and wait for the batch's end;
        False (a `batch` fail line emitted) when the upload itself was refused."""
        experiment = self.experiment
        batch.key = key
        options = experiment.batches.file_options(1, None, None, 1, f"smoke-{self.token}")
        try:
            with aws_errors(f"upload s3://{experiment.input_bucket}/{key}"):
                response = experiment.client("s3").put_object(
                    Bucket=experiment.input_bucket,
                    Key=key,
                    Body=self._rows(),
                    ContentType="application/x-ndjson",
                    Metadata=options.to_metadata(),
                )
        except SdkError as exc:
            self.emit("batch", "fail", f"the upload was refused ({exc}): check the input bucket's policy")
            return False
        version = response.get("VersionId")
        etag = str(response.get("ETag", "")).strip('"') or None
        batch.batch_id = ids.batch_id_for_upload(experiment.input_bucket, key, version, etag)
        for read in {unquote_plus(key), unquote(key)} - {key}:
            batch.misread[read] = ids.batch_id_for_upload(experiment.input_bucket, read, version, etag)
        self._wait_for_completion(tap, batch, self.clock() + self.timeout_s)
        return True

    def _special_key_line(self, batch: _Batch) -> None:
        if batch.read_as:
            self.emit(
                "special key",
                "fail",
                f"the ingest stage read the key {batch.key!r} as {batch.read_as!r} (batch {batch.rejected}): it "
                "decoded a key the event carried raw (see the `event key` line); upgrade the pipeline",
            )
        elif batch.rejected:
            self.emit(
                "special key",
                "skipped",
                f"the pipeline refused the key {batch.key!r} ({batch.rejected}): recorded; the batch runs under a "
                "plain key instead",
            )
        elif batch.completed is not None:
            self.emit("special key", "pass", f"the key {batch.key!r} (with `+` and a space) went through")
        else:
            self.emit("special key", "skipped", "the batch did not complete (see the `batch` line)")

    def _delete_dataset(self, prefix: str) -> None:
        """Every object version (and delete marker) under the smoke run's prefix: the dataset and what the pipeline
        wrote next to it (an errors object)."""
        s3, bucket = self.experiment.client("s3"), self.experiment.input_bucket
        pages = s3.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=prefix)
        for page in pages:
            for version in [*page.get("Versions", []), *page.get("DeleteMarkers", [])]:
                s3.delete_object(Bucket=bucket, Key=version["Key"], VersionId=version["VersionId"])

    def _wait_for_completion(self, tap: Any, batch: _Batch, deadline: float) -> None:
        next_status = self.clock() + 10.0
        while batch.completed is None and self.clock() < deadline:
            with aws_errors("read the batch's events"):
                delivery = tap.next_delivery(max(0.0, min(10.0, deadline - self.clock())))
            if delivery is not None:
                event = delivery.event
                tap.ack(delivery)
                if (
                    event is not None
                    and event.batch_id == batch.batch_id
                    and event.detail_type == DetailType.BATCH_COMPLETED
                    and isinstance(event.detail, BatchCompleted)
                ):
                    batch.completed = event.detail
                    self._rejected(batch)  # a file refused as a whole also ends in `Batch Completed` (0 rollouts)
                    return
            if self.clock() >= next_status:
                next_status = self.clock() + 10.0
                if self._rejected(batch):
                    return

    def _rejected(self, batch: _Batch) -> bool:
        """Whether the file was rejected: look for its batch in the ledger, under the batch id of the key as uploaded
        and of the key decoded once more (what the ingest stage reads if the event carried it raw)."""
        for read, batch_id in [(batch.key, batch.batch_id), *batch.misread.items()]:
            try:
                status = self.experiment.batches.status(batch_id)
            except BatchNotFound:
                continue
            if read != batch.key:
                batch.read_as = read
            if status.status == "rejected" or read != batch.key:
                batch.rejected = status.error or status.status
                return True
        return False

    def _batch_line(self, batch: _Batch, elapsed: float) -> None:
        done = batch.completed
        if batch.rejected:
            self.emit(
                "batch",
                "fail",
                f"the ingest stage rejected {batch.key!r} ({batch.rejected}): see `rollouts status -e "
                f"{self.experiment.name} --batch {batch.batch_id}` and the ingest logs",
            )
        elif done is None:
            self.emit(
                "batch",
                "fail",
                f"no `Batch Completed` for batch {batch.batch_id} within {self.timeout_s:g} s: see "
                f"`rollouts status -e {self.experiment.name} --batch {batch.batch_id}`, the dashboard and the logs",
            )
        elif done.failed:
            self.emit(
                "batch",
                "fail",
                f"batch {batch.batch_id}: {done.succeeded} of {done.rollouts_total} succeeded, failed by reason "
                f"{done.failed_by_reason}: see `rollouts export -e {self.experiment.name} --batch {batch.batch_id}`",
            )
        else:
            self.emit(
                "batch",
                "pass",
                f"batch {batch.batch_id} ({done.rollouts_total} rollouts, key {batch.key!r}) completed in "
                f"{elapsed:.0f} s, all succeeded",
            )

    def _sessions_stopped(self, batch_id: str) -> None:
        from rollout_pipeline.ledger.outbox import OUTBOX_STOP

        deadline = self.clock() + STOP_GRACE_S
        pending: list[str] = []
        while True:
            with aws_errors(f"read the rollouts of batch {batch_id}"):
                records = list(self.experiment.wiring().ledger().rollouts.batch_rollouts(batch_id))
            pending = [
                f"{r.input_id}#{r.index}"
                for r in records
                if r.stop_sessions or OUTBOX_STOP in r.outbox or not r.terminal
            ]
            if not pending or self.clock() >= deadline:
                break
            time.sleep(min(2.0, max(0.0, deadline - self.clock())))
        if pending:
            self.emit(
                "sessions stopped",
                "fail",
                f"{len(pending)} rollout(s) without a confirmed stop after {STOP_GRACE_S:g} s "
                f"({', '.join(pending[:5])}): check the `StopsFailing` alarm and the completion/sweeper logs",
            )
        else:
            self.emit("sessions stopped", "pass", f"every session of the {len(records)} rollout(s) stopped")

    def _event_key(self, queue_url: str, key: str) -> None:
        sqs = self.experiment.client("sqs")
        carried: list[str] = []
        deadline = self.clock() + 30.0
        while not any(self._names(c, key) for c in carried) and self.clock() < deadline:
            with aws_errors("read the S3 event"):
                wait = int(max(0, min(self.poll_wait_s, deadline - self.clock())))
                messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=wait)
            for message in messages.get("Messages", []):
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    carried.append(str(json.loads(message["Body"])["detail"]["object"]["key"]))
            if not messages.get("Messages") and wait == 0:
                time.sleep(0.2)
        ours = [c for c in carried if self._names(c, key)] or [c for c in carried if c.endswith(".jsonl")]
        if not ours:
            self.emit(
                "event key",
                "skipped" if self.local else "fail",
                "no S3 `Object Created` event of the dataset reached the default bus: is EventBridge notification on "
                f"for the input bucket? (other keys seen: {carried[:3]})",
            )
            return
        carried_key = ours[0]
        form = (
            "raw"
            if carried_key == key
            else "URL-encoded (+ for spaces)"
            if carried_key == quote_plus(key, safe="/")
            else "URL-encoded (%20 for spaces)"
            if carried_key == quote(key, safe="/")
            else "in another form"
        )
        message = f"the S3 event carried {key!r} {form}: {carried_key!r}"
        if self.local:
            self.emit("event key", "skipped", f"local: {message}")
        else:
            self.emit("event key", "pass", f"{message} (recorded: the ingest stage reads the key this way)")

    @staticmethod
    def _names(carried: str, key: str) -> bool:
        """The event's key is `key`, raw or encoded once."""
        return key in (carried, unquote_plus(carried), unquote(carried))

    # ------------------------------------------------------------------------------------------ missing key

    def _ingest_role(self) -> str | None:
        cloudformation = self.experiment.client("cloudformation")
        pages = cloudformation.get_paginator("list_stack_resources").paginate(
            StackName=topology.stack_name(self.experiment.name)
        )
        for page in pages:
            for resource in page.get("StackResourceSummaries", []):
                if resource.get("ResourceType") == "AWS::Lambda::Function" and str(
                    resource.get("LogicalResourceId", "")
                ).startswith("IngestFunction"):
                    function = str(resource["PhysicalResourceId"])
                    return str(
                        self.experiment.client("lambda").get_function_configuration(FunctionName=function)["Role"]
                    )
        return None

    def _missing_key(self) -> None:
        if self.local:
            self.emit("missing key", "skipped", "local")
            return
        bucket = self.experiment.input_bucket
        key = f"datasets/smoke-{self.token}/missing.jsonl"
        with aws_errors("find the ingest function's role"):
            role_arn = self._ingest_role()
        if role_arn is None:
            self.emit("missing key", "skipped", "no ingest function in the stack's resources")
            return
        from botocore.exceptions import ClientError

        try:
            credentials = self.experiment.client("sts").assume_role(
                RoleArn=role_arn, RoleSessionName=f"rollouts-smoke-{self.token}", DurationSeconds=900
            )["Credentials"]
        except ClientError as exc:
            self._simulated_missing_key(role_arn, bucket, key, error_code(exc))
            return
        s3 = self.experiment.aws.session.client(
            "s3",
            region_name=self.experiment.aws.region,
            aws_access_key_id=credentials["AccessKeyId"],
            aws_secret_access_key=credentials["SecretAccessKey"],
            aws_session_token=credentials["SessionToken"],
        )
        try:
            s3.head_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
            if status == 404:
                self.emit("missing key", "pass", f"as the ingest role, a missing key reads 404 ({role_arn})")
            else:
                self.emit(
                    "missing key",
                    "fail",
                    f"as the ingest role, a missing key reads {status} ({error_code(exc)}), not 404: grant the role "
                    f"s3:ListBucket on {bucket}",
                )
            return
        self.emit("missing key", "fail", f"s3://{bucket}/{key} exists: run the smoke again")

    def _simulated_missing_key(self, role_arn: str, bucket: str, key: str, assume_error: str) -> None:
        """The role cannot be assumed (Lambda roles trust only Lambda): ask IAM's policy simulator whether the role's
        policies allow `s3:ListBucket` of the key's prefix. The stack's grant is conditioned on `s3:prefix`
        (`access.LIST_GRANTS`), so the request is simulated with that context; asked without it, the answer is a
        deny on every account. The simulator evaluates the policy only: what S3 answers for a missing key (404 or
        403) only the assumed role's own HeadObject shows."""
        from botocore.exceptions import ClientError

        partition = role_arn.split(":")[1] if role_arn.count(":") >= 5 else "aws"
        try:
            result = self.experiment.client("iam").simulate_principal_policy(
                PolicySourceArn=role_arn,
                ActionNames=["s3:ListBucket"],
                ResourceArns=[f"arn:{partition}:s3:::{bucket}"],
                ContextEntries=[{"ContextKeyName": "s3:prefix", "ContextKeyValues": [key], "ContextKeyType": "string"}],
            )["EvaluationResults"]
        except ClientError as exc:
            self.emit(
                "missing key",
                "skipped",
                f"the ingest role cannot be assumed ({assume_error}) and the policy simulator is not allowed "
                f"({error_code(exc)}): grant iam:SimulatePrincipalPolicy to check it",
            )
            return
        decision = str(result[0].get("EvalDecision", "")) if result else ""
        missing = sorted(str(name) for name in (result[0].get("MissingContextValues") or [])) if result else []
        asked = f"s3:ListBucket of {bucket} with s3:prefix {key!r}"
        caveat = (
            "the simulator shows what the role's policies allow, not what S3 answers: only the role itself (it cannot "
            f"be assumed: {assume_error}) could show S3's 404 or 403 for a missing key"
        )
        if missing:
            self.emit(
                "missing key",
                "skipped",
                f"the policy simulator cannot decide {asked}: it needs the context values {', '.join(missing)}; "
                + caveat,
            )
        elif decision == "allowed":
            self.emit("missing key", "pass", f"the ingest role's policies allow {asked}; {caveat}")
        else:
            self.emit(
                "missing key",
                "fail",
                f"the ingest role's policies do not allow {asked} ({decision or 'no decision'}): without it S3 "
                "answers 403 for a missing key, which ingest takes for a permission error: grant it; " + caveat,
            )

    # -------------------------------------------------------------------------------------- alarm delivery

    def _alarm_delivery(self, stack: contextlib.ExitStack) -> None:
        if self.local:
            self.emit("alarm delivery", "skipped", "local")
            return
        topic_arn = self.experiment.outputs.get("AlarmTopicArn")
        if not topic_arn:
            self.emit("alarm delivery", "fail", "the stack has no AlarmTopicArn output: redeploy it")
            return
        cloudwatch = self.experiment.client("cloudwatch")
        with aws_errors("find the stack's alarms"):
            alarms = [
                alarm
                for page in cloudwatch.get_paginator("describe_alarms").paginate(
                    ActionPrefix=topic_arn, AlarmTypes=["MetricAlarm"]
                )
                for alarm in page.get("MetricAlarms", [])
            ]
        quiet = [a for a in alarms if a.get("StateValue") != "ALARM"]
        if not quiet:
            self.emit("alarm delivery", "fail", f"no alarm notifies {topic_arn} in a non-ALARM state to test with")
            return
        alarm_name = str(quiet[0]["AlarmName"])
        queue_url = self._alarm_test_queue(stack, topic_arn)
        with aws_errors(f"set alarm {alarm_name} to ALARM"):
            cloudwatch.set_alarm_state(
                AlarmName=alarm_name, StateValue="ALARM", StateReason="rollouts smoke: alarm delivery test"
            )
        stack.enter_context(
            self._cleanup(
                f"set alarm {alarm_name} back to OK",
                lambda: cloudwatch.set_alarm_state(
                    AlarmName=alarm_name, StateValue="OK", StateReason="rollouts smoke: test over (re-evaluated next)"
                ),
            )
        )
        started = self.clock()
        if self._alarm_notified(queue_url, alarm_name, deadline=started + ALARM_WAIT_S):
            self.emit(
                "alarm delivery",
                "pass",
                f"{alarm_name} reached {topic_arn} in {self.clock() - started:.0f} s (you get its ALARM and OK e-mails "
                "too)",
            )
            return
        self.emit(
            "alarm delivery",
            "fail",
            f"no notification of {alarm_name} on {topic_arn} within {ALARM_WAIT_S:g} s: the topic policy must allow "
            "cloudwatch.amazonaws.com sns:Publish (and a KMS-encrypted topic's key must let CloudWatch use it)",
        )

    def _alarm_test_queue(self, stack: contextlib.ExitStack, topic_arn: str) -> str:
        """A queue subscribed to the alarm topic for this run (removed by `stack`); its URL."""
        sns, sqs = self.experiment.client("sns"), self.experiment.client("sqs")
        name = f"{self.experiment.bus_name}-smoke-alarm-{self.token}"[:80]
        with aws_errors("create the alarm test queue"):
            queue_url = str(
                sqs.create_queue(
                    QueueName=name,
                    Attributes={"SqsManagedSseEnabled": "true", "MessageRetentionPeriod": "3600"},
                    tags=subscription.subscription_tags("smoke"),
                )["QueueUrl"]
            )
        stack.enter_context(self._cleanup("delete the alarm test queue", lambda: sqs.delete_queue(QueueUrl=queue_url)))
        with aws_errors("subscribe the test queue to the alarm topic"):
            queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
                "QueueArn"
            ]
            policy = subscription.delivery_policy(queue_arn, "sns.amazonaws.com", topic_arn)
            sqs.set_queue_attributes(QueueUrl=queue_url, Attributes={"Policy": json.dumps(policy)})
            subscription_arn = sns.subscribe(
                TopicArn=topic_arn, Protocol="sqs", Endpoint=queue_arn, ReturnSubscriptionArn=True
            )["SubscriptionArn"]
        stack.enter_context(
            self._cleanup("unsubscribe the test queue", lambda: sns.unsubscribe(SubscriptionArn=subscription_arn))
        )
        return queue_url

    def _alarm_notified(self, queue_url: str, alarm_name: str, *, deadline: float) -> bool:
        """Whether `alarm_name`'s ALARM notification reaches the test queue by `deadline`."""
        sqs = self.experiment.client("sqs")
        while self.clock() < deadline:
            with aws_errors("read the alarm test queue"):
                wait = int(max(0, min(20.0, deadline - self.clock())))
                messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=wait)
            for message in messages.get("Messages", []):
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    alarm = json.loads(json.loads(message["Body"])["Message"])
                    if alarm.get("AlarmName") == alarm_name and alarm.get("NewStateValue") == "ALARM":
                        return True
        return False

    # ------------------------------------------------------------------------------------ metrics, quotas

    def _metrics(self) -> None:
        if self.local:
            self.emit("agentcore metrics", "skipped", "local")
            return
        cloudwatch = self.experiment.client("cloudwatch")
        found: dict[str, set[tuple[str, ...]]] = {}
        with aws_errors(f"list the {AGENTCORE_NAMESPACE} metrics"):
            pages = cloudwatch.get_paginator("list_metrics").paginate(
                Namespace=AGENTCORE_NAMESPACE, PaginationConfig={"MaxItems": 2000}
            )
            for page in pages:
                for metric in page.get("Metrics", []):
                    dims = tuple(sorted(str(d["Name"]) for d in metric.get("Dimensions", [])))
                    found.setdefault(str(metric["MetricName"]), set()).add(dims)
        if not found:
            self.emit(
                "agentcore metrics",
                "fail",
                f"no {AGENTCORE_NAMESPACE} metrics: enable CloudWatch Transaction Search once (see docs/deploy.md), "
                "then run the smoke again a few minutes after a batch",
            )
            return
        first = ["ActiveSessionCount", "Invocations", "Throttles", "SessionCount"]
        names = [n for n in first if n in found] + sorted(n for n in found if n not in first)
        shown = "; ".join(f"{n} {sorted(list(d) for d in found[n])}" for n in names[:6])
        more = f" (+{len(names) - 6} more)" if len(names) > 6 else ""
        self.emit("agentcore metrics", "pass", f"dimension sets: {shown}{more}")

    def _quotas(self) -> None:
        if self.local:
            self.emit("quota codes", "skipped", "local")
            return
        from botocore.exceptions import ClientError

        reader = QuotaReader(self.experiment.client("service-quotas"))
        listed, missing = [], []
        try:
            for ref in AGENTCORE_QUOTAS:
                quota, source = reader.find_with_source(ref)
                if quota is None:
                    missing.append(ref)
                    continue
                by_name = (
                    "" if quota.get("QuotaCode") == ref.code else f" (by name; listed as {quota.get('QuotaCode')})"
                )
                value = float(quota.get("Value", 0))
                listed.append(f"{ref.code} {quota.get('QuotaName')!r} = {value:g} {source}{by_name}")
        except ClientError as exc:
            self.emit("quota codes", "skipped", f"cannot read Service Quotas ({error_code(exc)})")
            return
        required = [ref for ref in missing if ref != CONTAINER_SESSION_RATE]
        text = "; ".join(listed) or "none"
        if missing:
            text += "; not listed: " + ", ".join(f"{r.code} {r.name!r}" if r.name else r.code for r in missing)
        if required:
            self.emit(
                "quota codes",
                "fail",
                f"{text}: find the codes with `aws service-quotas list-aws-default-service-quotas --service-code "
                "bedrock-agentcore` and update rollout_pipeline/ops/preflight.py",
            )
        else:
            self.emit("quota codes", "pass", text)


def _subscription(name: str, queue_url: str) -> subscription.Subscription:
    """The smoke run's S3-event subscription on the default bus, for `remove_subscription`."""
    return subscription.Subscription(
        name=name,
        kind="smoke",
        owner="",
        rule_arn=name,
        queue_url=queue_url,
        last_seen=None,
        target_ids=("tap",),
        rule_bus="default",
    )


def run_smoke(
    experiment: Experiment,
    *,
    rows: int = 3,
    timeout_s: float = 600.0,
    poll_wait_s: float = 5.0,
    out: TextIO | None = None,
) -> list[SmokeCheck]:
    """Run every smoke check against `experiment` (printing each line to `out` as it completes); see the module."""
    return Smoke(experiment, rows=rows, timeout_s=timeout_s, poll_wait_s=poll_wait_s, out=out).run()
