"""`exp.batches`: the work a trainer hands the pipeline and where it stands: submit a file or payloads, a batch's
status and rollouts, cancel, the current policy version."""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout_pipeline import ids
from rollout_pipeline.config import SamplingParams
from rollout_pipeline.contracts import DatasetRow, FileOptions, iso, utcnow
from rollout_pipeline.sdk import submission
from rollout_pipeline.sdk._aws import aws_errors
from rollout_pipeline.sdk.errors import BatchNotFound, DatasetInvalid, SdkError
from rollout_pipeline.sdk.handle import ExperimentHandle
from rollout_pipeline.sdk.status import BatchStatus, batch_status

if TYPE_CHECKING:
    from rollout_pipeline.ledger.items import RolloutSummary
    from rollout_pipeline.lifecycle.cancel import CancelResult
    from rollout_pipeline.ports import AgentRuntime

logger = logging.getLogger(__name__)


class Batches:
    """The batches of one experiment (`exp.batches`)."""

    def __init__(self, experiment: ExperimentHandle) -> None:
        self._exp = experiment

    def submit_file(
        self,
        path: str | os.PathLike[str],
        *,
        group_size: int | None = None,
        sampling_params: Mapping[str, Any] | SamplingParams | None = None,
        timeout_s: int | None = None,
        max_attempts: int | None = None,
        policy_version: str | None = None,
        key: str | None = None,
        validate: bool = True,
        budget_usd: float | None = None,
        oversample: int | None = None,
    ) -> str:
        """Upload a dataset file (`.jsonl`, `.jsonl.gz`, `.json` array) to `datasets/` and return its batch id.

        The file is validated locally first (same reader and row rules as ingestion): a bad row, or a key with
        `+`, `%` or a space, raises `DatasetInvalid` naming the file, the line and the reason, before anything is
        uploaded. Options not given default to the experiment's; they travel as S3 object metadata. The batch id is
        the one ingestion derives from the upload's version id, so it is known at once. `budget_usd`: the batch's own
        budget (its rollouts wait once its cost reaches it; `exp.cost.set_budget(..., batch=...)` raises it).
        `oversample`: extra rollouts per group (docs/lifecycle.md, "Trainer-ready groups"; default: the
        experiment's).
        """
        options = self.file_options(
            group_size,
            sampling_params,
            timeout_s,
            max_attempts,
            policy_version,
            budget_usd=budget_usd,
            oversample=oversample,
        )
        try:
            object_key = submission.dataset_key(path, key)
        except ids.InvalidId as exc:
            raise DatasetInvalid(str(path), [("", f"invalid_key: {exc}")]) from None
        rows = 0
        if validate:
            rows = submission.validate_file(path)
        elif not Path(path).is_file():
            raise DatasetInvalid(str(path), [("", "no such file")])
        bucket = self._exp.input_bucket
        with aws_errors(f"upload s3://{bucket}/{object_key}"), Path(path).open("rb") as body:
            resp = self._exp.client("s3").put_object(
                Bucket=bucket,
                Key=object_key,
                Body=body,
                ContentType=submission.content_type(object_key),
                Metadata=options.to_metadata(),
            )
        # Ingestion derives the batch id from the S3 event's version id and etag: the same values PutObject returns.
        etag = str(resp.get("ETag", "")).strip('"') or None
        batch_id = ids.batch_id_for_upload(bucket, object_key, resp.get("VersionId"), etag)
        logger.info("uploaded %s as s3://%s/%s (batch %s)", path, bucket, object_key, batch_id)
        from rollout_pipeline.feed.feed import start_warnings

        for warning in start_warnings(self._exp.config, rows * options.rollouts_per_group):
            logger.warning("batch %s: %s", batch_id, warning)
        return batch_id

    def submit(
        self,
        payloads: Iterable[Mapping[str, Any]],
        *,
        group_size: int | None = None,
        sampling_params: Mapping[str, Any] | SamplingParams | None = None,
        timeout_s: int | None = None,
        max_attempts: int | None = None,
        policy_version: str | None = None,
        name: str = "sdk",
        budget_usd: float | None = None,
        oversample: int | None = None,
    ) -> str:
        """Submit in-memory payloads (dataset rows: `id` and `_rollout` keys allowed) straight to the rollout queue.

        Goes through the ingestion stage's own code: batch and group items in the ledger, claim checks for big
        payloads, one rollout message per rollout, `Batch Accepted`. Returns the new batch id (`{name}-{12 hex}`).
        Invalid payloads raise `DatasetInvalid` (index and reason) before anything is written. `budget_usd`: the
        batch's own budget, and `oversample`, as for `submit_file`.
        """
        options = self.file_options(
            group_size,
            sampling_params,
            timeout_s,
            max_attempts,
            policy_version,
            budget_usd=budget_usd,
            oversample=oversample,
        )
        return self.submit_rows(submission.validate_payloads(payloads), options, name)

    def submit_rows(self, rows: Sequence[DatasetRow], options: FileOptions, name: str) -> str:
        """Submit rows validated once (`submission.validate_payloads`) as batch `name-...` with `options`
        (`file_options`); ingestion takes them as they are. Returns the batch id."""
        with aws_errors("submit payloads"):
            result = (
                self._exp.wiring()
                .ingestion()
                .submit_rows(rows, name=name, options=options, owner=submission.new_lease_owner())
            )
        if result.batch_id is None:  # pragma: no cover - submit_rows always creates a batch
            raise SdkError("the submission created no batch")
        if result.rows_rejected:  # pragma: no cover - validated above with the same rules
            logger.warning("batch %s: %d payload(s) rejected: %s", result.batch_id, result.rows_rejected, result.errors)
        for warning in result.warnings:
            logger.warning("batch %s: %s", result.batch_id, warning)
        return result.batch_id

    def file_options(
        self,
        group_size: int | None,
        sampling_params: Mapping[str, Any] | SamplingParams | None,
        timeout_s: int | None,
        max_attempts: int | None,
        policy_version: str | None,
        *,
        budget_usd: float | None = None,
        oversample: int | None = None,
    ) -> FileOptions:
        """The options of one batch: those given, the experiment's defaults for the rest (`SdkError` naming a bad
        one)."""
        try:
            return submission.file_options(
                self._exp.config,
                group_size=group_size,
                sampling_params=sampling_params,
                timeout_s=timeout_s,
                max_attempts=max_attempts,
                policy_version=policy_version,
                budget_usd=budget_usd,
                oversample=oversample,
            )
        except ValueError as exc:
            raise SdkError(f"invalid option {exc}") from None

    def status(self, batch_id: str) -> BatchStatus:
        """Where a batch stands, from the ledger: queued, running, succeeded, failed by reason, reward mean/std."""
        with aws_errors(f"read batch {batch_id}"):
            item = self._exp.ledger().batches.read_batch(batch_id)
            if item is None:
                raise BatchNotFound(f"no batch {batch_id!r} in experiment {self._exp.name!r}")
            states = Counter(r.state for r in self.rollout_states(batch_id, states_only=True))
        return batch_status(item, states)

    def rollout_states(self, batch_id: str, *, states_only: bool = False) -> Iterator[RolloutSummary]:
        """Each dispatched rollout of a batch as the ledger holds it: state, ids, reward, failure reason (with
        `states_only`, the state alone: a smaller read). Rollouts not yet dispatched have no entry."""
        with aws_errors(f"read the rollouts of batch {batch_id}"):
            yield from self._exp.ledger().rollouts.rollout_summaries(batch_id, states_only=states_only)

    def recent(self, limit: int = 20) -> list[str]:
        """The ids of the experiment's newest batches, newest first (at most `limit`; an index read: a batch created
        a moment ago may be missing)."""
        with aws_errors("list the experiment's batches"):
            return self._exp.ledger().batches.recent_batch_ids(limit)

    def cancel(self, batch_id: str, runtime: AgentRuntime | None = None) -> CancelResult:
        """Cancel a batch: queued rollouts are never started, running ones are stopped (through `runtime`, by
        default ACR with this experiment's session) and every rollout ends once as `Rollout Failed` (cancelled).
        Idempotent; returns the lifecycle stage's report (counts)."""
        from rollout_pipeline.lifecycle.cancel import cancel_batch

        with aws_errors(f"cancel batch {batch_id}"):
            if self._exp.ledger().batches.read_batch(batch_id) is None:
                raise BatchNotFound(f"no batch {batch_id!r} in experiment {self._exp.name!r}")
            report = cancel_batch(batch_id, self._exp.wiring(runtime).lifecycle())
        if not report.found:
            raise SdkError(f"batch {batch_id!r} cannot be cancelled: it was rejected as a whole (see `status`)")
        return report

    def cancel_rollout(self, batch_id: str, input_id: str, index: int = 0, runtime: AgentRuntime | None = None) -> str:
        """Cancel one rollout (stop its session, end it as `Rollout Failed` / cancelled); the rest of its batch goes
        on. Returns "cancelled" or "already_terminal"."""
        from rollout_pipeline.lifecycle.cancel import cancel_rollout

        with aws_errors(f"cancel rollout {input_id}#{index} of batch {batch_id}"):
            deps = self._exp.wiring(runtime).lifecycle()
            return cancel_rollout(exp_id=self._exp.name, batch_id=batch_id, input_id=input_id, index=index, deps=deps)

    def set_policy_version(self, version: str | None) -> None:
        """Advance the experiment's current policy version (an async trainer, after each weight sync): rollouts
        dispatched from now on are stamped with it (`policy_version` on their events; the batch's own version, when
        different, as `batch_policy_version`), so stale rollouts can be dropped or corrected. None clears it."""
        if version is not None and not 0 < len(version) <= 128:
            raise SdkError("a policy version is 1-128 characters")
        with aws_errors("set the current policy version"):
            self._exp.ledger().experiment.set_current_policy_version(version, iso(utcnow()))
