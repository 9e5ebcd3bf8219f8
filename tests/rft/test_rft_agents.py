"""The RFT host with the real SDK, one agent process driven as ACR drives it: the shapes public RFT agents take.

- `@sagemaker_rft_handler` inside ART's `AgentCoreRuntimeApp(background=True)` (ART's second contract);
- `{"status": "error"}` returned (the SDK reports `failed` + [0.0]: here an agent error, not a reward of 0);
- a per-turn reward list; a streamed model answer; the SDK's "custom integration" (no decorator: the agent calls
  `RolloutFeedbackClient.report_complete` itself and returns a string).

Results are read back from a loopback moto S3 with `contracts.parse_result`, as the completion stage reads them."""

from __future__ import annotations

import json
import re
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from rollout_pipeline import contracts
from rollout_pipeline.agent.testing import FakeModelServer
from rollout_pipeline.local.acr import AgentProcess
from rollout_pipeline.local.moto_server import local_aws_environ, moto_server

REGION = "us-east-1"
BUCKET = "results"
JOB = "arn:aws:sagemaker:us-east-1:123456789012:training-job/rft-agents"
RESULT_WAIT_S = 30.0

RUNTIME_APP_AGENT = textwrap.dedent(
    """
    from agentcore_rl_toolkit import AgentCoreRuntimeApp
    from openai import OpenAI
    from sagemaker.core.token_generator import generate_token
    from sagemaker.train.rft import make_inference_headers, sagemaker_rft_handler

    app = AgentCoreRuntimeApp(background=True)


    @app.entrypoint
    @sagemaker_rft_handler
    async def invoke(payload):
        mode = payload["instance"]["mode"]
        if mode == "error":
            return {"status": "error", "error": "sandbox crashed", "reward": 0.0}
        if mode == "turns":
            return {"reward": [0.0, 0.5, 1.0]}
        metadata = payload["metadata"]
        client = OpenAI(
            base_url=metadata["endpoint"] + "/v1",
            api_key=generate_token(region=metadata["region"]),
            default_headers=make_inference_headers(metadata),
        )
        stream = client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "hi"}], stream=True,
            max_tokens=payload["inferenceParams"]["maxTokens"],
        )
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        return {"reward": 1.0 if text == "streamed 42" else 0.0, "text": text}


    if __name__ == "__main__":
        app.run()
    """
)

CUSTOM_AGENT = textwrap.dedent(
    """
    from bedrock_agentcore.runtime import BedrockAgentCoreApp
    from sagemaker.train.rft import RolloutFeedbackClient

    app = BedrockAgentCoreApp()


    @app.entrypoint
    def handle(payload):
        RolloutFeedbackClient(payload["metadata"]).report_complete(0.75)
        return "done"
    """
)


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with moto_server() as endpoint:
        _s3(endpoint).create_bucket(Bucket=BUCKET)
        yield endpoint


def _s3(endpoint: str) -> Any:
    return boto3.client(
        "s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id="local", aws_secret_access_key="local"
    )


@pytest.fixture(scope="module")
def agents_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rft_agents")
    (root / "runtime_rft_agent.py").write_text(RUNTIME_APP_AGENT)
    (root / "custom_rft_agent.py").write_text(CUSTOM_AGENT)
    return root


def _run(endpoint: str, agents: Path, module: str, model: FakeModelServer, rows: list[dict[str, Any]]) -> list[Any]:
    env = {**local_aws_environ(endpoint, REGION), "PYTHONPATH": str(agents), "SAGEMAKER_JOB_ARN": JOB}
    outcomes = []
    with AgentProcess(module, kind="rft", env=env) as agent:
        for number, row in enumerate(rows):
            session = f"{module}-{number}-".ljust(40, "x")
            payload = {
                **row,
                "_rollout": {
                    "exp_id": "rft",
                    "input_id": f"{module}-{number}",
                    "s3_bucket": BUCKET,
                    "base_url": model.base_url,
                    "model_id": "fake-model",
                    "sampling_params": {"max_tokens": 12},
                    "session_id": session,
                },
            }
            status, answer = agent.invoke(session, payload)
            assert status == 200
            assert answer["status"] == "processing", answer
            outcomes.append(_result(endpoint, answer["result_key"]))
    return outcomes


def _result(endpoint: str, key: str) -> contracts.ResultOutcome:
    deadline = time.monotonic() + RESULT_WAIT_S
    while time.monotonic() < deadline:
        try:
            body = _s3(endpoint).get_object(Bucket=BUCKET, Key=key)["Body"].read()
        except Exception:
            time.sleep(0.1)
            continue
        return contracts.parse_result(body)
    raise AssertionError(f"no result at {key} after {RESULT_WAIT_S} s")


def test_rft_agents_in_arts_runtime_app_are_served_unchanged(s3_endpoint: str, agents_dir: Path) -> None:
    with FakeModelServer("streamed 42") as model:
        stream, turns, error = _run(
            s3_endpoint,
            agents_dir,
            "runtime_rft_agent",
            model,
            [{"instance": {"mode": "stream"}}, {"instance": {"mode": "turns"}}, {"instance": {"mode": "error"}}],
        )
        (call,) = model.requests
    assert stream.success, stream
    assert stream.rewards == 1.0
    assert stream.body is not None
    assert stream.body["text"] == "streamed 42"
    assert call.body["stream"] is True
    assert call.body["max_tokens"] == 12
    assert call.header("X-Amzn-SageMaker-Job-Arn") == JOB
    assert "sagemaker-api-key" not in json.dumps(call.headers)

    assert turns.rewards == [0.0, 0.5, 1.0]
    assert turns.reward == 1.0, "the scalar of a per-turn list is its last turn"

    assert not error.success
    assert error.reason is contracts.FailureReason.AGENT_ERROR
    assert error.error is not None
    assert "sandbox crashed" in error.error


def test_an_agent_reporting_by_hand_is_a_success(s3_endpoint: str, agents_dir: Path) -> None:
    with FakeModelServer() as model:
        (outcome,) = _run(s3_endpoint, agents_dir, "custom_rft_agent", model, [{"prompt": "x"}])
    assert outcome.success
    assert outcome.rewards == 0.75
    assert outcome.body is not None
    assert outcome.body["response"] == "done"


def test_the_images_start_command_serves_the_rft_example_with_the_rft_setting(s3_endpoint: str) -> None:
    """What the deployed runtime runs: the Dockerfile's CMD module with the environment the stack sets for
    `-c agent_kind=rft` (tests/infra/test_agent_kind.py checks the synthesized values)."""
    dockerfile = (Path(__file__).resolve().parents[2] / "agent_image" / "Dockerfile").read_text()
    (cmd,) = re.findall(r"^CMD (\[.*\])$", dockerfile, re.MULTILINE)
    start_module = json.loads(cmd)[2]
    env = {**local_aws_environ(s3_endpoint, REGION), "ROLLOUTS_AGENT_KIND": "rft", "SAGEMAKER_JOB_ARN": JOB}
    env.pop("ROLLOUTS_AGENT_MODULE", None)
    with FakeModelServer("It is 15") as model, AgentProcess(start_module, hosted=False, env=env) as agent:
        session = "start-command-".ljust(40, "x")
        payload = {
            "question": "7 + 8",
            "answer": "15",
            "_rollout": {
                "exp_id": "rft",
                "input_id": "start",
                "s3_bucket": BUCKET,
                "base_url": model.base_url,
                "model_id": "fake-model",
                "session_id": session,
            },
        }
        status, answer = agent.invoke(session, payload)
        assert status == 200
        outcome = _result(s3_endpoint, answer["result_key"])
        assert model.requests[0].header("X-Amzn-SageMaker-Job-Arn") == JOB
    assert outcome.success
    assert outcome.rewards == 1.0
