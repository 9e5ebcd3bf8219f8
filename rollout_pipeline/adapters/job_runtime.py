"""SageMaker's job runtime through boto3 (`sagemakerjobruntime`, botocore 1.44.5's service model
`sagemakerjobruntime/2026-02-01`): the MTRL reporter's `CompleteRollout` and `UpdateReward`, SigV4-signed with the
function's role (IAM actions `sagemaker:CompleteRollout`, `sagemaker:UpdateReward` on the job).

Errors, from the service model: `ResourceNotFoundException` (404), `ConflictException` (409: the trajectory is
already terminal), `ValidationException`, `AccessDeniedException`, `ThrottlingException`,
`ServiceQuotaExceededException`, `InternalServiceError`. A 404 or a conflict is a final answer (the trajectory is
already done, or MTRL gave up on it): False. So are the messages the SDK's own client treats that way ("not in valid
status", "Cannot transition trajectory": `sagemaker.train.rft.feedback`, sagemaker-train 1.27.0). Anything else
raises, so the report is retried (and dead-lettered, loudly, if it never passes).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Final

log = logging.getLogger(__name__)

#: The boto3 service name.
JOB_RUNTIME_SERVICE: Final = "sagemakerjobruntime"
FINAL_CODES: Final = frozenset({"ResourceNotFoundException", "ConflictException"})
FINAL_MARKERS: Final = ("not in valid status", "Cannot transition trajectory")


class BotoJobRuntime:
    """`ports.JobRuntimeReports` over a boto3 `sagemakerjobruntime` client (its endpoint: the job runtime's URL)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def complete_rollout(self, job_arn: str, trajectory_id: str, status: str, client_token: str) -> bool:
        return self._call(
            self.client.complete_rollout,
            JobArn=job_arn,
            TrajectoryId=trajectory_id,
            Status=status,
            ClientToken=client_token,
        )

    def update_reward(self, job_arn: str, trajectory_id: str, rewards: Sequence[float], client_token: str) -> bool:
        return self._call(
            self.client.update_reward,
            JobArn=job_arn,
            TrajectoryId=trajectory_id,
            Rewards=[float(reward) for reward in rewards],
            ClientToken=client_token,
        )

    @staticmethod
    def _call(operation: Callable[..., Any], **kwargs: Any) -> bool:
        from botocore.exceptions import ClientError

        try:
            operation(**kwargs)
        except ClientError as exc:
            error = exc.response.get("Error") or {}
            code, message = str(error.get("Code", "")), str(error.get("Message", ""))
            if code in FINAL_CODES or any(marker in message for marker in FINAL_MARKERS):
                log.info("trajectory %s: %s (%s): already terminal at MTRL", kwargs["TrajectoryId"], code, message)
                return False
            raise
        return True
