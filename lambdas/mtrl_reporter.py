"""MTRL reporter Lambda (MTRL environment mode): the forwarded rollouts' terminal events (via its SQS queue) ->
`CompleteRollout` / `UpdateReward` at SageMaker's job runtime, at least once."""

from __future__ import annotations

from typing import Any

from lambdas.glue import PipelineFunction, RunResult, records
from rollout_pipeline.lifecycle.mtrl_report import MtrlReporter
from rollout_pipeline.wiring import Wiring


def run(reporter: MtrlReporter, event: dict[str, Any], context: Any) -> RunResult:  # noqa: ARG001
    batch = records(event)
    result = reporter.handle_records(batch)
    return RunResult.of_batch("reported to MTRL", len(batch), result)


function = PipelineFunction("mtrl_reporter", Wiring.mtrl_reporter, run, experiment=lambda stage: stage.exp_id)
handler = function.handler
