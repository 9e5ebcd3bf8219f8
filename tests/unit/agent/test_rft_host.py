"""The RFT host without the SageMaker SDK: the request it builds, how outcomes map to result objects (read back with
the completion stage's own reader), module loading and detection, and a rollout in process against the front door.

The SDK's own behaviour (what `@sagemaker_rft_handler` posts) is exercised with the real package in tests/rft/."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout_pipeline.agent.context import RolloutContext, rollout_context
from rollout_pipeline.agent.modules import Entrypoint, agent_kind_of, load_entrypoint
from rollout_pipeline.agent.rft_door import FrontDoor, TrajectoryRecord
from rollout_pipeline.agent.rft_host import RftHost, inference_params_of, rft_request, rft_result
from rollout_pipeline.agent.testing import FakeModelServer
from rollout_pipeline.contracts import FailureReason, parse_result

JOB = "arn:aws:sagemaker:us-east-1:123456789012:training-job/rft"
SESSION = "batch-0123456789ab-0-1-" + "f" * 20


def _record(status: str | None = None, rewards: list[float] | None = None) -> TrajectoryRecord:
    return TrajectoryRecord(SESSION, RolloutContext(session_id=SESSION), JOB, status=status, rewards=rewards)


def _outcome(returned: Any, record: TrajectoryRecord) -> Any:
    return parse_result(json.dumps(rft_result(returned, record)).encode())


# --- the request ---------------------------------------------------------------------------------------------------


def test_request_carries_metadata_in_both_casings_params_in_camel_case_and_the_row() -> None:
    payload = {
        "question": "7 + 8",
        "answer": "15",
        "_rollout": {"session_id": SESSION, "sampling_params": {"temperature": 0.7, "max_tokens": 32, "top_p": 0.9}},
    }
    request = rft_request(
        payload, trajectory_id=SESSION, job_arn=JOB, endpoint="http://127.0.0.1:1/r", region="eu-west-1"
    )

    assert request["question"] == "7 + 8"
    assert request["instance"] == {"question": "7 + 8", "answer": "15"}
    assert request["metadata"] == {
        "jobArn": JOB,
        "job_arn": JOB,
        "trajectoryId": SESSION,
        "trajectory_id": SESSION,
        "rolloutId": SESSION,
        "endpoint": "http://127.0.0.1:1/r",
        "region": "eu-west-1",
    }
    assert request["inferenceParams"] == {"temperature": 0.7, "maxTokens": 32, "topP": 0.9}
    assert request["inference_params"] == {"temperature": 0.7, "max_tokens": 32, "top_p": 0.9}
    assert request["_rollout"] == payload["_rollout"]


def test_a_row_instance_is_kept_and_its_metadata_cannot_override_ours() -> None:
    payload = {"instance": {"prompt": "hi"}, "metadata": {"endpoint": "https://evil", "task": "t"}, "_rollout": {}}
    request = rft_request(payload, trajectory_id=SESSION, job_arn="", endpoint="http://127.0.0.1:1", region="r")
    assert request["instance"] == {"prompt": "hi"}
    assert request["metadata"]["endpoint"] == "http://127.0.0.1:1"
    assert request["metadata"]["task"] == "t"


def test_inference_params_drop_nones_and_keep_other_keys() -> None:
    camel, snake = inference_params_of({"temperature": None, "max_tokens": 8, "seed": 3})
    assert camel == {"maxTokens": 8, "seed": 3}
    assert snake == {"max_tokens": 8, "seed": 3}


# --- the outcome (read with the completion stage's reader) ---------------------------------------------------------


def test_a_reported_reward_is_a_success_and_keeps_the_returned_shape() -> None:
    outcome = _outcome({"reward": 0.5, "accuracy": 1}, _record("ready", [0.5]))
    assert outcome.success
    assert outcome.rewards == 0.5
    assert outcome.body is not None
    assert outcome.body["accuracy"] == 1


def test_a_per_turn_list_is_kept_and_its_scalar_is_the_last_turn() -> None:
    outcome = _outcome({"reward": [0.0, 0.2, 1.0]}, _record("ready", [0.0, 0.2, 1.0]))
    assert outcome.success
    assert outcome.rewards == [0.0, 0.2, 1.0]
    assert outcome.reward == 1.0


def test_the_first_reported_reward_wins_over_a_different_returned_one() -> None:
    outcome = _outcome({"reward": 0.0}, _record("ready", [1.0]))
    assert outcome.rewards == 1.0


def test_a_reward_reported_by_hand_without_a_return_is_a_success() -> None:
    assert _outcome("free text", _record("ready", [0.25])).rewards == 0.25
    assert _outcome(None, _record(None, [1.0, 0.0])).rewards == [1.0, 0.0]


def test_a_returned_reward_counts_when_nothing_was_reported() -> None:
    assert _outcome({"reward": 1}, _record()).rewards == 1.0
    assert _outcome({"rewards": [0.0, 1.0]}, _record()).rewards == [0.0, 1.0]


def test_status_error_is_an_agent_error_with_its_message_not_a_zero_reward() -> None:
    outcome = _outcome({"status": "error", "error": "tool crashed", "reward": 0.0}, _record("failed", [0.0]))
    assert not outcome.success
    assert outcome.reason is FailureReason.AGENT_ERROR
    assert outcome.error is not None
    assert "tool crashed" in outcome.error


def test_an_art_style_error_status_code_is_an_agent_error() -> None:
    outcome = _outcome({"status_code": 503, "stop_reason": "sandbox gone", "rewards": 1.0}, _record())
    assert outcome.reason is FailureReason.AGENT_ERROR
    assert outcome.error is not None
    assert "sandbox gone" in outcome.error


def test_a_failed_report_is_an_agent_error() -> None:
    outcome = _outcome({"reward": 1.0}, _record("failed", [0.0]))
    assert outcome.reason is FailureReason.AGENT_ERROR


def test_no_reward_anywhere_is_an_invalid_result() -> None:
    for returned in ({"response": "15"}, "15", None):
        outcome = _outcome(returned, _record("ready"))
        assert not outcome.success
        assert outcome.reason is FailureReason.INVALID_RESULT


def test_a_malformed_returned_reward_is_an_invalid_result() -> None:
    outcome = _outcome({"reward": "high"}, _record())
    assert outcome.reason is FailureReason.INVALID_RESULT


def test_metrics_json_cannot_hold_do_not_fail_the_result() -> None:
    body = rft_result({"reward": 1.0, "when": object()}, _record())
    assert isinstance(body["when"], str)
    json.dumps(body)


# --- the author's module --------------------------------------------------------------------------------------------

RFT_SOURCE = """
from bedrock_agentcore.runtime import BedrockAgentCoreApp
from sagemaker.train.rft import sagemaker_rft_handler

app = BedrockAgentCoreApp()

@app.entrypoint
@sagemaker_rft_handler
def invoke(payload):
    return {"reward": 1.0}

if __name__ == "__main__":
    app.run()
"""
ART_SOURCE = """
from agentcore_rl_toolkit import AgentCoreRLApp
app = AgentCoreRLApp()

@app.rollout_entrypoint
def invoke(payload):
    return {"rewards": 1.0}
"""
RUNTIME_APP_SOURCE = """
import json
from agentcore_rl_toolkit import AgentCoreRuntimeApp

app = AgentCoreRuntimeApp(background=True)
STARTED = []

@app.entrypoint
def invoke(payload, context):
    return {"rewards": [0.0, 1.0], "saw": sorted(payload["metadata"]), "session": context.session_id}

if __name__ == "__main__":
    STARTED.append(True)
    app.run()
"""


@pytest.fixture
def agent_dir(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "rft_agent_src.py").write_text(RFT_SOURCE)
    (tmp_path / "art_agent_src.py").write_text(ART_SOURCE)
    (tmp_path / "runtime_agent_src.py").write_text(RUNTIME_APP_SOURCE)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("raise RuntimeError('detection must not import packages')\n")
    (tmp_path / "pkg" / "agent.py").write_text(RFT_SOURCE)
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in ("runtime_agent_src", "art_agent_src"):
        sys.modules.pop(name, None)


def test_agent_kind_is_read_from_the_source_without_importing(agent_dir: Path) -> None:
    path = [str(agent_dir)]
    assert agent_kind_of("rft_agent_src", path) == "rft"
    assert agent_kind_of("pkg.agent", path) == "rft"
    assert agent_kind_of("runtime_agent_src", path) == "rft"
    assert agent_kind_of("art_agent_src", path) == "art"
    assert agent_kind_of("rollout_pipeline.agent.examples.math_agent") == "art"
    assert agent_kind_of("rollout_pipeline.agent.examples.rft_math_agent") == "rft"
    assert agent_kind_of("no_such_module_anywhere", path) == "art"


def test_loading_takes_the_registered_entrypoint_without_running_main(agent_dir: Path) -> None:
    entry = load_entrypoint("runtime_agent_src")
    module = sys.modules["runtime_agent_src"]
    assert module.STARTED == []
    assert entry.handler is module.invoke
    assert entry.app_name == "app"
    assert not entry.is_rft
    assert not entry.is_art_rollout_app


def test_an_art_rollout_app_is_recognised(agent_dir: Path) -> None:
    assert load_entrypoint("art_agent_src").is_art_rollout_app


def test_a_module_without_an_app_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LookupError, match="no BedrockAgentCoreApp"):
        load_entrypoint("json")


# --- one rollout in process, against the real front door -------------------------------------------------------------


def _post(url: str, body: dict[str, Any]) -> int:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    request.add_header("Authorization", "Bearer sagemaker-api-key-c2VjcmV0")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


class _Context:
    session_id = SESSION


def _run(host: RftHost, payload: dict[str, Any]) -> dict[str, Any]:
    ctx = RolloutContext.from_payload(payload, SESSION)

    async def go() -> dict[str, Any]:
        with rollout_context(ctx):
            return await host.rollout(payload, _Context())

    return asyncio.run(go())


def _payload(model: FakeModelServer, **row: Any) -> dict[str, Any]:
    return {
        **row,
        "_rollout": {
            "session_id": SESSION,
            "base_url": model.base_url,
            "model_id": "fake-model",
            "job_arn": JOB,
            "sampling_params": {"max_tokens": 8},
        },
    }


def _sdk_like(payload: dict[str, Any]) -> dict[str, Any]:
    """What `@sagemaker_rft_handler` does around an agent that returns `{"reward": ...}`, with plain urllib."""
    metadata = payload["metadata"]
    call = urllib.request.Request(
        metadata["endpoint"] + "/v1/chat/completions",
        data=json.dumps({"model": "default", "messages": [{"role": "user", "content": payload["question"]}]}).encode(),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Authorization": "Bearer sagemaker-api-key-c2VjcmV0",
            "X-Amzn-SageMaker-Job-Arn": metadata["jobArn"],
            "X-Amzn-SageMaker-Trajectory-Id": metadata["trajectoryId"],
        },
    )
    with urllib.request.urlopen(call, timeout=10) as response:
        text = json.loads(response.read())["choices"][0]["message"]["content"]
    reward = 1.0 if "15" in text else 0.0
    ids = {"JobArn": metadata["jobArn"], "TrajectoryId": metadata["trajectoryId"]}
    assert _post(metadata["endpoint"] + "/complete-rollout", {**ids, "Status": "ready"}) == 200
    assert _post(metadata["endpoint"] + "/update-reward", {**ids, "Rewards": [reward]}) == 200
    return {"reward": reward, "text": text}


def test_a_rollout_reports_through_the_front_door_and_its_model_call_is_rewired(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "our-model-key")
    with FakeModelServer("It is 15") as model, FrontDoor() as door:
        host = RftHost(load_entrypoint_stub(_sdk_like), door, region="us-east-1")
        body = _run(host, _payload(model, question="7 + 8"))

        assert body["rewards"] == 1.0
        assert body["rft"]["reported_status"] == "ready"
        assert body["rft"]["model_calls"] == 1
        assert door.record_of(SESSION) is None, "the trajectory is unregistered after the rollout"
        (call,) = model.requests
        assert call.body["model"] == "fake-model"
        assert call.header("Authorization") == "Bearer our-model-key"
        assert "sagemaker-api-key" not in json.dumps(call.headers)
        assert call.header("X-Amzn-SageMaker-Trajectory-Id") == SESSION
        assert call.header("X-Amzn-SageMaker-Job-Arn") == JOB


def test_the_capture_key_of_the_rollout_is_the_model_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "our-model-key")
    with FakeModelServer("15") as model, FrontDoor() as door:
        payload = _payload(model, question="7 + 8")
        payload["_rollout"]["api_key"] = "capture-123"
        _run(RftHost(load_entrypoint_stub(_sdk_like), door), payload)
        assert model.requests[0].header("Authorization") == "Bearer capture-123"


def test_a_raise_propagates_with_its_message_and_unregisters() -> None:
    def boom(payload: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("the tool server is down")

    with FakeModelServer() as model, FrontDoor() as door:
        host = RftHost(load_entrypoint_stub(boom), door)
        with pytest.raises(RuntimeError, match="the tool server is down"):
            _run(host, _payload(model, question="x"))
        assert door.record_of(SESSION) is None


def test_an_async_entrypoint_with_context_gets_the_request_and_the_context() -> None:
    seen: dict[str, Any] = {}

    async def entry(payload: dict[str, Any], context: Any) -> dict[str, Any]:
        seen.update(payload=payload, session=context.session_id)
        return {"reward": [0.0, 1.0]}

    with FakeModelServer() as model, FrontDoor() as door:
        body = _run(RftHost(load_entrypoint_stub(entry), door), _payload(model, question="x"))
    assert body["rewards"] == [0.0, 1.0]
    assert seen["session"] == SESSION
    assert seen["payload"]["metadata"]["endpoint"] == door.endpoint_for(SESSION)


def test_an_agentcore_runtime_app_entrypoint_is_served_unchanged(agent_dir: Path) -> None:
    entry = load_entrypoint("runtime_agent_src")
    with FakeModelServer() as model, FrontDoor() as door:
        body = _run(RftHost(entry, door), _payload(model, question="x"))
    assert parse_result(json.dumps(body).encode()).rewards == [0.0, 1.0]
    assert body["session"] == SESSION
    assert "jobArn" in body["saw"]


def load_entrypoint_stub(handler: Any) -> Any:
    return Entrypoint(module="test", app_name="app", app=None, handler=handler, is_rft=False, is_art_rollout_app=False)


# --- local mode picks the host for RFT modules ------------------------------------------------------------------------


def test_local_mode_runs_every_agent_through_the_host_which_tells_the_kind(agent_dir: Path) -> None:
    from rollout_pipeline.agent.host import resolve_kind
    from rollout_pipeline.local.acr import DEFAULT_AGENT_MODULE, HOST_MODULE, agent_command

    command = agent_command("rft_agent_src", 9001, "127.0.0.1", "python")
    assert command == [
        "python", "-m", HOST_MODULE, "--agent-module", "rft_agent_src", "--agent-kind", "auto",
        "--host", "127.0.0.1", "--port", "9001",
    ]  # fmt: skip
    assert agent_command(DEFAULT_AGENT_MODULE, kind="rft")[4:7] == [DEFAULT_AGENT_MODULE, "--agent-kind", "rft"]
    assert resolve_kind("rft_agent_src", "auto") == "rft"  # the host reads the source on its own sys.path
    assert resolve_kind("art_agent_src", "auto") == "art"
    assert resolve_kind("art_agent_src", "RFT") == "rft"
    with pytest.raises(ValueError, match="agent kind"):
        agent_command(DEFAULT_AGENT_MODULE, kind="sagemaker")


def test_the_local_cli_takes_the_agent_kind() -> None:
    import argparse

    from rollout_pipeline.local import cli

    parser = argparse.ArgumentParser()
    cli._add_pipeline_options(parser, demo=False)
    args = parser.parse_args(["--agent-module", "my_agent", "--agent-kind", "rft", "--model-url", "http://m/v1"])
    settings = cli._settings(args)
    assert (settings.agent_module, settings.agent_kind) == ("my_agent", "rft")
    assert parser.parse_args([]).agent_kind == "auto"


def test_starting_the_host_points_the_sdks_default_endpoint_at_the_front_door(
    agent_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rollout_pipeline.agent.app import RolloutApp
    from rollout_pipeline.agent.rft_host import RFT_RUNTIME_ENDPOINT_ENV, start_host

    monkeypatch.setenv(RFT_RUNTIME_ENDPOINT_ENV, "https://job-runtime.sagemaker.us-east-1.api.aws")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    app, door, entry = start_host("runtime_agent_src", environ={"SAGEMAKER_JOB_ARN": JOB})
    try:
        assert isinstance(app, RolloutApp)
        assert "main" in app.handlers
        assert entry.module == "runtime_agent_src"
        assert door.root_url.startswith("http://127.0.0.1:")
        assert door.port not in (80, 443, 8080)
        assert os.environ[RFT_RUNTIME_ENDPOINT_ENV] == door.root_url
    finally:
        door.stop()


def test_concurrent_rollouts_of_one_process_keep_their_own_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    """One process serving several sessions (local mode's shared isolation): each trajectory gets its own reward."""
    monkeypatch.setenv("OPENAI_API_KEY", "our-model-key")
    sessions = [f"batch-0123456789ab-{n}-1-" + "c" * 20 for n in range(6)]

    def reply(request: Any) -> str:
        return "15" if "RIGHT" in json.dumps(request.body) else "0"

    async def one(host: RftHost, model: FakeModelServer, session: str, right: bool) -> dict[str, Any]:
        payload = _payload(model, question=("RIGHT " if right else "") + "7 + 8")
        payload["_rollout"]["session_id"] = session

        class Context:
            session_id = session

        with rollout_context(RolloutContext.from_payload(payload, session)):
            return await host.rollout(payload, Context())

    with FakeModelServer(reply) as model, FrontDoor() as door:
        host = RftHost(load_entrypoint_stub(_sdk_like), door)

        async def all_of_them() -> list[dict[str, Any]]:
            return await asyncio.gather(*(one(host, model, s, n % 2 == 0) for n, s in enumerate(sessions)))

        bodies = asyncio.run(all_of_them())
        calls = {call.header("X-Amzn-SageMaker-Trajectory-Id") for call in model.requests}
    assert [body["rewards"] for body in bodies] == [1.0, 0.0] * 3
    assert [body["rft"]["trajectory_id"] for body in bodies] == sessions
    assert calls == set(sessions)
