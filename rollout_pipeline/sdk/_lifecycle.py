"""Cancel through the lifecycle stage (`lifecycle.cancel`) with the experiment's own clients."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollout_pipeline.ports import AgentRuntime

if TYPE_CHECKING:
    from rollout_pipeline.lifecycle.cancel import CancelReport
    from rollout_pipeline.lifecycle.deps import LifecycleDeps
    from rollout_pipeline.sdk.experiment import Experiment


def _deps(experiment: Experiment, runtime: AgentRuntime | None) -> LifecycleDeps:
    from rollout_pipeline.adapters.eventbridge import EventBridgePublisher
    from rollout_pipeline.adapters.s3 import S3ObjectStore
    from rollout_pipeline.adapters.sqs import SqsQueue
    from rollout_pipeline.ledger.rollouts import RolloutLedger
    from rollout_pipeline.lifecycle.deps import LifecycleDeps

    if runtime is None:
        from rollout_pipeline.adapters.acr import AcrAgentRuntime

        runtime = AcrAgentRuntime(
            experiment.runtime_arn, experiment.client("bedrock-agentcore"), endpoints=experiment.config.endpoints
        )
    return LifecycleDeps(
        settings=experiment.settings(),
        ledger=RolloutLedger(
            experiment.table_name, experiment.client("dynamodb"), ttl_days=experiment.config.ledger_ttl_days
        ),
        runtime=runtime,
        store=S3ObjectStore(experiment.client("s3")),
        queue=SqsQueue(experiment.client("sqs")),
        publisher=EventBridgePublisher(experiment.bus_name, experiment.client("events")),
    )


def cancel_batch(experiment: Experiment, batch_id: str, runtime: AgentRuntime | None = None) -> CancelReport:
    """Cancel a batch: nothing more is dispatched, running sessions are stopped (through `runtime`, by default
    ACR with the experiment's session), every rollout ends once as `Rollout Failed` (cancelled)."""
    from rollout_pipeline.lifecycle.cancel import cancel_batch as lifecycle_cancel_batch

    return lifecycle_cancel_batch(batch_id, _deps(experiment, runtime))


def cancel_rollout(
    experiment: Experiment, batch_id: str, input_id: str, index: int, runtime: AgentRuntime | None = None
) -> str:
    """End one rollout as `Rollout Failed` (cancelled), stopping its session; "cancelled" or "already_terminal"."""
    from rollout_pipeline.lifecycle.cancel import cancel_rollout as lifecycle_cancel_rollout

    return lifecycle_cancel_rollout(
        exp_id=experiment.name, batch_id=batch_id, input_id=input_id, index=index, deps=_deps(experiment, runtime)
    )
