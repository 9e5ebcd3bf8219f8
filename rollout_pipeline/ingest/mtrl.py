"""The MTRL forwarder: one invocation of SageMaker MTRL's custom-agent Lambda becomes one rollout of the pipeline.

`MtrlForwarder.forward(event)` implements the contract of `contracts.mtrl`: it validates the event (a refusal is
MTRL's `ValidationError`, a job of another account `AccessDenied`), submits ONE rollout through ingestion and the
feed (one batch of one group of one rollout, `max_attempts` 1: MTRL retries a failed rollout itself, and a second
attempt would add a second attempt's turns to the same trajectory), and answers `{}` at once; a failure of the
pipeline's own stores is `InternalServerError`, which MTRL retries.

Idempotent on the rollout id: the batch id is derived from (job ARN, rollout id) and created conditionally
(`Ingestion.submit_once`), so a repeated invocation finds it and enqueues nothing new; an invocation that crashed
mid-way is taken over by the next one once its lease (`LEASE_S`) has expired.

From there the rollout is the pipeline's like any other: the account pool's quotas and fair shares, the release
window, the sweeper's deadline, typed failures, its cost. The agent host forwards its model calls and its report to
the job runtime (`agent.rft_host`); the MTRL reporter (`lifecycle.mtrl_report`) reports every end the agent did not.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Final, Literal

from rollout_pipeline.contracts import FileOptions, RowError, parse_row
from rollout_pipeline.contracts.mtrl import (
    ACCESS_DENIED,
    INTERNAL_ERROR,
    VALIDATION_ERROR,
    MtrlRefusal,
    MtrlRollout,
    error_response,
    parse_mtrl_event,
)
from rollout_pipeline.ingest.core import Ingestion
from rollout_pipeline.topology import MTRL_FUNCTIONS

logger = logging.getLogger(__name__)

#: How long an invocation owns its submission (the forwarder's timeout and a margin): a retry after a crash waits
#: this long at most before it takes over.
LEASE_S: Final = MTRL_FUNCTIONS["mtrl_forwarder"].timeout_s + 30

ForwardOutcome = Literal["enqueued", "duplicate", "refused", "failed"]


@dataclass(frozen=True, slots=True)
class ForwardResult:
    """What one invocation did: the answer for MTRL, and what to log."""

    response: dict[str, Any]
    outcome: ForwardOutcome
    batch_id: str | None = None
    rollout_id: str | None = None


class MtrlForwarder:
    """MTRL's rollouts into one experiment (see the module doc). `account` / `region`: this environment's, from
    the function's own ARN; a job elsewhere is refused (the agent forwards to its own region's job runtime)."""

    def __init__(self, ingestion: Ingestion) -> None:
        self.ingestion = ingestion
        self.exp_id = ingestion.exp_id
        config = ingestion.settings.experiment
        self.options = FileOptions.defaults(config).model_copy(update={"group_size": 1, "max_attempts": 1})

    def forward(self, event: Any, *, owner: str, account: str | None, region: str | None) -> ForwardResult:
        """Hand one MTRL rollout to the pipeline; `owner`: the invocation's request id (its submission lease)."""
        try:
            rollout = parse_mtrl_event(event)
            self._check_scope(rollout, account, region)
            row = parse_row(rollout.row(), 1)  # every rule a dataset row meets (size, credentials, sampling)
        except MtrlRefusal as exc:
            logger.warning("MTRL invocation refused: %s: %s", exc.error_type, exc)
            return ForwardResult(exc.response(), "refused")
        except RowError as exc:
            logger.warning("MTRL invocation refused: %s", exc)
            return ForwardResult(error_response(VALIDATION_ERROR, str(exc)), "refused")
        ids = {"batch_id": rollout.batch_id, "rollout_id": rollout.rollout_id}
        try:
            result = self.ingestion.submit_once(
                rollout.batch_id, [row], options=self.options, source=rollout.source, owner=owner
            )
        except Exception:
            logger.exception("MTRL rollout %s: the pipeline could not take it", rollout.rollout_id)
            message = "the rollout pipeline could not record the rollout; retry"
            return ForwardResult(error_response(INTERNAL_ERROR, message), "failed", **ids)
        if result.outcome in ("already_done", "in_progress"):
            logger.info("MTRL rollout %s: already %s (%s)", rollout.rollout_id, result.outcome, rollout.batch_id)
            return ForwardResult({}, "duplicate", **ids)
        if result.rows_rejected:
            reason = result.errors[0].get("error", "rejected") if result.errors else "rejected"
            return ForwardResult(error_response(VALIDATION_ERROR, str(reason)), "refused", **ids)
        logger.info("MTRL rollout %s: %s as batch %s", rollout.rollout_id, result.outcome, rollout.batch_id)
        return ForwardResult({}, "enqueued", **ids)

    @staticmethod
    def _check_scope(rollout: MtrlRollout, account: str | None, region: str | None) -> None:
        if account and rollout.account != account:
            raise MtrlRefusal(
                ACCESS_DENIED,
                f"job {rollout.job_arn} is in account {rollout.account}: this environment serves {account}",
            )
        if region and rollout.region != region:
            raise MtrlRefusal(
                VALIDATION_ERROR,
                f"job {rollout.job_arn} runs in {rollout.region}: this environment's agents report to {region}'s job "
                "runtime",
            )
