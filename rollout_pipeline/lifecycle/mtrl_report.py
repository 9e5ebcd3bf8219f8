"""The MTRL reporter: tells SageMaker's job runtime how each rollout the MTRL forwarder made ended.

In MTRL environment mode (`mtrl_environment`) the agent host reports the agent's own outcome to the job runtime as
soon as the agent returns (`agent.rft_host`). This stage is the backstop that makes the report at-least-once and
covers what the agent never saw: it consumes the experiment's own `Rollout Completed` / `Rollout Failed` events of
the forwarder's batches (a rule on the bus, `routing.mtrl_report_event_pattern`, to its queue) and reports

- `Rollout Completed` -> `CompleteRollout(ready)` then `UpdateReward(rewards)` (the rewards as written: one per
  turn, or one);
- `Rollout Failed`, whatever the reason (`timeout`, `agent_error`, `invalid_result`, `invoke_rejected`, `throttled`,
  `cancelled`: the trainer must not train on it) -> `CompleteRollout(failed)`, never a reward: MTRL drops a failed
  trajectory instead of learning a 0 from an infrastructure failure.

Each call carries the `ClientToken` the agent host uses for the same call (`config.mtrl_client_token`), so a report
both sent is taken once. A trajectory already terminal at MTRL (the host reported first, MTRL timed it out) is a
final answer; any other error raises and the message is retried (then dead-lettered). The job and rollout ids come
from the batch's `source` (`contracts.mtrl.parse_mtrl_source`): one ledger read per report.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rollout_pipeline.config import mtrl_client_token
from rollout_pipeline.contracts import DetailType, RolloutCompleted, RolloutFailed, parse_detail
from rollout_pipeline.contracts.mtrl import MTRL_BATCH_PREFIX, parse_mtrl_source
from rollout_pipeline.ledger.ledger import Ledger
from rollout_pipeline.ports import JobRuntimeReports
from rollout_pipeline.sqs_batch import BatchOutcome, SqsRecord, run_partial_batch

log = logging.getLogger(__name__)

READY = "ready"
FAILED = "failed"


@dataclass
class MtrlReportResult(BatchOutcome[str]):
    """What one SQS batch of reports did: per message, `ready`, `failed`, `already terminal` or `ignored`."""

    def counts(self) -> dict[str, int]:
        done = list(self.outcomes.values())
        return {"ready": done.count(READY), "failed": done.count(FAILED), "errors": len(self.failures)}


class MtrlReporter:
    """Reports forwarded rollouts' ends to the job runtime (see the module doc)."""

    def __init__(self, ledger: Ledger, runtime: JobRuntimeReports, exp_id: str) -> None:
        self.ledger = ledger
        self.runtime = runtime
        self.exp_id = exp_id

    def handle_records(self, records: Sequence[SqsRecord]) -> MtrlReportResult:
        """An SQS batch of EventBridge events (`Rollout Completed` / `Rollout Failed`); a record that raises is a
        failure (redelivered)."""
        result = MtrlReportResult()
        run_partial_batch(records, lambda record: self.report(json.loads(record["body"])), result, what="mtrl report")
        return result

    def report(self, event: Mapping[str, Any]) -> str:
        """Report one event's rollout; what was reported (`ready`, `failed`), `already terminal`, or `ignored`."""
        detail_type = str(event.get("detail-type", ""))
        if detail_type not in (DetailType.ROLLOUT_COMPLETED, DetailType.ROLLOUT_FAILED):
            return "ignored"
        detail = parse_detail(detail_type, event.get("detail") or {})
        assert isinstance(detail, RolloutCompleted | RolloutFailed)
        if not detail.batch_id.startswith(MTRL_BATCH_PREFIX) or detail.exp_id != self.exp_id:
            return "ignored"
        batch = self.ledger.batches.read_batch(detail.batch_id)
        target = parse_mtrl_source(batch.source if batch is not None else None)
        if target is None:
            log.warning("batch %s: no MTRL job in its source; not reported", detail.batch_id)
            return "ignored"
        job_arn, trajectory = target
        if isinstance(detail, RolloutFailed):
            took = self.runtime.complete_rollout(
                job_arn, trajectory, FAILED, mtrl_client_token(job_arn, trajectory, "complete-failed")
            )
            log.info("trajectory %s: failed (%s) reported to MTRL: %s", trajectory, detail.reason, took)
            return FAILED if took else "already terminal"
        rewards = detail.rewards if isinstance(detail.rewards, list) else [detail.rewards]
        completed = self.runtime.complete_rollout(
            job_arn, trajectory, READY, mtrl_client_token(job_arn, trajectory, "complete-ready")
        )
        rewarded = self.runtime.update_reward(
            job_arn, trajectory, rewards, mtrl_client_token(job_arn, trajectory, "reward")
        )
        log.info(
            "trajectory %s: ready and rewards %s reported to MTRL: %s, %s", trajectory, rewards, completed, rewarded
        )
        return READY if completed or rewarded else "already terminal"
