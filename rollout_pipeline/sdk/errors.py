"""Errors the SDK raises: each one carries a message that is fit to show a user as one line."""

from __future__ import annotations


class SdkError(Exception):
    """Base class of every error the trainer SDK raises on purpose."""


class ExperimentNotDeployed(SdkError):
    """The experiment's CloudFormation stack (`Rollouts-{name}`) does not exist in this account and region."""


class NoCredentials(SdkError):
    """boto3 found no AWS credentials (environment, profile, SSO, instance role...)."""


class AwsError(SdkError):
    """An AWS call failed for a reason other than missing credentials; the message names the call."""


class DatasetInvalid(SdkError):
    """A dataset file or in-memory payload list failed local validation.

    `problems` lists `(location, reason)` pairs, first ones first; the message shows the first of them.
    """

    def __init__(self, source: str, problems: list[tuple[str, str]], total: int | None = None) -> None:
        self.source = source
        self.problems = problems
        self.total = len(problems) if total is None else total
        first_where, first_reason = problems[0] if problems else ("", "invalid")
        more = f" (and {self.total - 1} more invalid row(s))" if self.total > 1 else ""
        where = f"{source}:{first_where}" if first_where else source
        super().__init__(f"{where}: {first_reason}{more}")


class BatchNotFound(SdkError):
    """No batch with this id exists in the experiment's ledger."""


class RolloutFailedError(SdkError):
    """A rollout ended in `Rollout Failed` (agent error, timeout, invalid result, rejected invoke, cancelled).

    The pipeline never disguises a failure as reward 0: a future whose rollout failed raises this error, and
    `event` holds the whole `RolloutFailed` detail (reason, error text, attempts used, result URI if any).
    """

    def __init__(self, message: str, event: object | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.event = event
        self.reason = reason


class DeployFailed(SdkError):
    """`cdk deploy` (or destroy) failed: the message names the first resource that failed and CloudFormation's
    reason (`resource`, `resource_type`, `reason`), or the CLI's own last error when no resource failed."""

    def __init__(
        self, message: str, *, resource: str | None = None, resource_type: str | None = None, reason: str | None = None
    ) -> None:
        super().__init__(message)
        self.resource = resource
        self.resource_type = resource_type
        self.reason = reason
