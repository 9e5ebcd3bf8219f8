"""MTRL forwarder Lambda (MTRL environment mode): SageMaker MTRL's custom-agent Lambda. Each invocation asks for
one rollout; it is handed to the pipeline and answered at once (`{}` or MTRL's typed error)."""

from __future__ import annotations

from typing import Any

from lambdas.glue import PipelineFunction, RunResult
from rollout_pipeline.ingest.mtrl import MtrlForwarder
from rollout_pipeline.wiring import Wiring


def function_scope(context: Any) -> tuple[str | None, str | None]:
    """(account, region) of the invoked function's ARN (`arn:aws:lambda:REGION:ACCOUNT:function:NAME`)."""
    parts = str(getattr(context, "invoked_function_arn", "") or "").split(":")
    return (parts[4], parts[3]) if len(parts) >= 7 and parts[2] == "lambda" else (None, None)


def run(forwarder: MtrlForwarder, event: dict[str, Any], context: Any) -> RunResult:
    account, region = function_scope(context)
    owner = str(getattr(context, "aws_request_id", "") or "mtrl-forwarder")
    result = forwarder.forward(event, owner=owner, account=account, region=region)
    extra = {"outcome": result.outcome, "batch_id": result.batch_id, "mtrl_rollout_id": result.rollout_id}
    return RunResult(result.response, f"MTRL rollout {result.outcome}", extra)


function = PipelineFunction("mtrl_forwarder", Wiring.mtrl_forwarder, run, experiment=lambda stage: stage.exp_id)
handler = function.handler
