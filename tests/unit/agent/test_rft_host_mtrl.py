"""The RFT host in MTRL environment mode, without the SageMaker SDK: an agent that does what `@sagemaker_rft_handler`
does (with plain urllib) runs one MTRL rollout against the front door; the model call and the outcome go to a
loopback job runtime (`local.mtrl.JobRuntimeStandIn`), never a reward for a failure. The real SDK: tests/rft/."""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.credentials import Credentials

from rollout_pipeline.agent.context import RolloutContext, rollout_context
from rollout_pipeline.agent.job_runtime import (
    JobRuntimeClient,
    JobRuntimeError,
    MtrlTarget,
    bearer_token,
    mtrl_target_of,
)
from rollout_pipeline.agent.modules import Entrypoint
from rollout_pipeline.agent.rft_door import FrontDoor
from rollout_pipeline.agent.rft_host import RftHost, mtrl_rewards
from rollout_pipeline.agent.testing import FakeModelServer
from rollout_pipeline.config import mtrl_client_token
from rollout_pipeline.local.mtrl import JobRuntimeStandIn

JOB = "arn:aws:sagemaker:us-east-1:123456789012:job/mtrl-unit"
ROLLOUT = "traj-0001"
SESSION = "mtrl-0123456789abcdef01234567-0-1-" + "a" * 16
AGENT_TOKEN = "Bearer sagemaker-api-key-YWdlbnQncyBvd24"


def _fixed_token(_region: str) -> str:
    return "sagemaker-api-key-aG9zdA"


@pytest.fixture
def runtime() -> Iterator[JobRuntimeStandIn]:
    with FakeModelServer("It is 15") as model, JobRuntimeStandIn(model.base_url, job_arn=JOB) as stand_in:
        stand_in.open(ROLLOUT)
        yield stand_in


def _entry(handler: Any) -> Entrypoint:
    return Entrypoint(module="test", app_name="app", app=None, handler=handler, is_rft=True, is_art_rollout_app=False)


def _post(url: str, body: dict[str, Any]) -> int:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    request.add_header("Authorization", AGENT_TOKEN)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _sample(metadata: dict[str, Any]) -> str:
    call = urllib.request.Request(
        metadata["endpoint"] + "/v1/chat/completions",
        data=json.dumps({"model": "default", "messages": [{"role": "user", "content": "7 + 8"}]}).encode(),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Authorization": AGENT_TOKEN,
            "X-Amzn-SageMaker-Job-Arn": metadata["jobArn"],
            "X-Amzn-SageMaker-Trajectory-Id": metadata["trajectoryId"],
        },
    )
    with urllib.request.urlopen(call, timeout=10) as response:
        return str(json.loads(response.read())["choices"][0]["message"]["content"])


def _sdk_like_success(payload: dict[str, Any]) -> dict[str, Any]:
    metadata = payload["metadata"]
    text = _sample(metadata)
    ids = {"JobArn": metadata["jobArn"], "TrajectoryId": metadata["trajectoryId"]}
    assert _post(metadata["endpoint"] + "/complete-rollout", {**ids, "Status": "ready"}) == 200
    assert _post(metadata["endpoint"] + "/update-reward", {**ids, "Rewards": [0.75]}) == 200
    return {"reward": 0.75, "text": text}


def _sdk_like_error(payload: dict[str, Any]) -> dict[str, Any]:
    """The decorator on an exception: complete `failed`, rewards `[0.0]`, then the raise."""
    metadata = payload["metadata"]
    ids = {"JobArn": metadata["jobArn"], "TrajectoryId": metadata["trajectoryId"]}
    _post(metadata["endpoint"] + "/complete-rollout", {**ids, "Status": "failed"})
    _post(metadata["endpoint"] + "/update-reward", {**ids, "Rewards": [0.0]})
    raise RuntimeError("the tool server is down")


def _payload(**row: Any) -> dict[str, Any]:
    return {
        "prompt": "What is 7 + 8?",
        "metadata": {"jobArn": JOB, "rolloutId": ROLLOUT},
        **row,
        "_rollout": {"session_id": SESSION, "base_url": "http://127.0.0.1:9/v1", "sampling_params": {"top_p": 0.9}},
    }


def _run(host: RftHost, payload: dict[str, Any]) -> dict[str, Any]:
    ctx = RolloutContext.from_payload(payload, SESSION)

    class Context:
        session_id = SESSION

    async def go() -> dict[str, Any]:
        with rollout_context(ctx):
            return await host.rollout(payload, Context())

    return asyncio.run(go())


def _host(handler: Any, door: FrontDoor, runtime: JobRuntimeStandIn) -> RftHost:
    client = JobRuntimeClient(runtime.root_url, "us-east-1", token=_fixed_token, sleep=lambda _s: None)
    return RftHost(_entry(handler), door, region="us-east-1", job_runtime=client)


def test_an_mtrl_rollout_samples_from_the_job_runtime_and_reports_ready_and_its_reward(
    runtime: JobRuntimeStandIn,
) -> None:
    seen: dict[str, Any] = {}

    def agent(payload: dict[str, Any]) -> dict[str, Any]:
        seen.update(payload)
        return _sdk_like_success(payload)

    with FrontDoor() as door:
        body = _run(_host(agent, door, runtime), _payload())

    assert seen["metadata"]["rolloutId"] == seen["metadata"]["trajectoryId"] == ROLLOUT
    assert seen["metadata"]["jobArn"] == JOB
    assert seen["inferenceParams"] == {"topP": 0.9}
    assert body["rewards"] == 0.75
    assert body["rft"]["mtrl"]["status"] == "ready"
    trajectory = runtime.snapshot()[ROLLOUT]
    assert (trajectory.status, trajectory.rewards, trajectory.samples) == ("ready", [0.75], 1)
    assert [(r["call"], r["auth"], r["answer"]) for r in trajectory.reports] == [
        ("complete-ready", "bearer", 200),
        ("reward", "bearer", 200),
    ]
    tokens = {r["call"]: r["body"]["ClientToken"] for r in trajectory.reports}
    assert tokens == {call: mtrl_client_token(JOB, ROLLOUT, call) for call in ("complete-ready", "reward")}
    # The model call reached the job runtime with the host's token, never the agent's.
    assert runtime.samples == [{"trajectory": ROLLOUT, "auth": "bearer"}]


def test_the_agents_own_bearer_token_never_leaves_the_session(runtime: JobRuntimeStandIn) -> None:
    captured: list[dict[str, str]] = []
    original = runtime.sample

    def spy(headers: Any, raw: bytes) -> Any:
        captured.append(dict(headers))
        return original(headers, raw)

    runtime.sample = spy  # type: ignore[method-assign]
    with FrontDoor() as door:
        _run(_host(_sdk_like_success, door, runtime), _payload())
    assert captured
    assert all(AGENT_TOKEN not in json.dumps(headers) for headers in captured)
    assert {h["Authorization"] for h in captured} == {f"Bearer {_fixed_token('us-east-1')}"}


def test_an_agent_error_is_reported_failed_and_never_the_sdks_zero_reward(runtime: JobRuntimeStandIn) -> None:
    with FrontDoor() as door:
        host = _host(_sdk_like_error, door, runtime)
        with pytest.raises(RuntimeError, match="the tool server is down"):
            _run(host, _payload())
        assert door.record_of(ROLLOUT) is None
    trajectory = runtime.snapshot()[ROLLOUT]
    assert trajectory.status == "failed"
    assert trajectory.rewards is None
    assert [r["call"] for r in trajectory.reports] == ["complete-failed"]


@pytest.mark.parametrize(
    "returned",
    [{"status": "error", "error": "sandbox gone", "reward": 0.0}, {"response": "no reward"}],
    ids=["status-error", "no-reward"],
)
def test_a_returned_error_or_no_reward_is_reported_failed_only(
    runtime: JobRuntimeStandIn, returned: dict[str, Any]
) -> None:
    with FrontDoor() as door:
        body = _run(_host(lambda _payload: returned, door, runtime), _payload())
    assert body["status_code"] == 500 or "rewards" not in body
    trajectory = runtime.snapshot()[ROLLOUT]
    assert (trajectory.status, trajectory.rewards) == ("failed", None)
    assert [r["call"] for r in trajectory.reports] == ["complete-failed"]


def test_a_rollout_without_mtrl_ids_or_a_host_without_the_runtime_is_not_forwarded(
    runtime: JobRuntimeStandIn,
) -> None:
    plain = _payload()
    plain.pop("metadata")
    with FakeModelServer("15") as model, FrontDoor() as door:
        plain["_rollout"]["base_url"] = model.base_url
        host = _host(_sdk_like_success_plain, door, runtime)
        assert _run(host, plain)["rewards"] == 0.75
        without = RftHost(_entry(_sdk_like_success_plain), door, region="us-east-1")
        assert _run(without, {**_payload(), "_rollout": plain["_rollout"]})["rewards"] == 0.75
        assert len(model.requests) == 2
    assert runtime.snapshot()[ROLLOUT].reports == []
    assert runtime.samples == []


def _sdk_like_success_plain(payload: dict[str, Any]) -> dict[str, Any]:
    """As `_sdk_like_success`, for a rollout that is not MTRL's (its trajectory is the session)."""
    return _sdk_like_success(payload)


def test_mtrl_ids_are_read_from_the_rows_metadata_only_when_valid() -> None:
    assert mtrl_target_of({"metadata": {"jobArn": JOB, "rolloutId": "r-1.a"}}) == MtrlTarget(JOB, "r-1.a")
    for metadata in (
        {"jobArn": JOB},
        {"jobArn": "arn:aws:s3:::bucket", "rolloutId": "r"},
        {"jobArn": JOB, "rolloutId": "r/../x"},
        "not a mapping",
    ):
        assert mtrl_target_of({"metadata": metadata}) is None


def test_what_mtrl_is_told_of_a_result_object() -> None:
    assert mtrl_rewards({"status_code": 200, "rewards": 1.0}) == [1.0]
    assert mtrl_rewards({"status_code": 200, "rewards": [0.0, 0.5]}) == [0.0, 0.5]
    assert mtrl_rewards({"status_code": 200}) is None
    assert mtrl_rewards({"status_code": 500, "rewards": 0.0}) is None


def test_the_bearer_token_is_the_sdks_presigned_call_with_bearer_token() -> None:
    token = bearer_token("eu-west-1", Credentials("AKIDEXAMPLE", "secret", "session-token"), lifetime_s=60)
    assert token.startswith("sagemaker-api-key-")
    url = base64.b64decode(token.removeprefix("sagemaker-api-key-")).decode()
    assert url.startswith("sagemaker.amazonaws.com/?")
    assert url.endswith("&Version=1")
    query = urllib.parse.parse_qs(urllib.parse.urlsplit("https://" + url).query)
    assert query["Action"] == ["CallWithBearerToken"]
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"]
    assert query["X-Amz-Credential"][0].split("/")[2:4] == ["eu-west-1", "sagemaker"]
    assert query["X-Amz-Expires"] == ["60"]
    assert query["X-Amz-Security-Token"] == ["session-token"]


class _Answers:
    """A job runtime answering each call from a script of (status, body)."""

    def __init__(self, script: list[tuple[int, str]]) -> None:
        self.script = script
        self.calls = 0

    def __call__(self, request: urllib.request.Request, timeout: float) -> Any:
        status, text = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        if status == 200:
            return _Response()
        raise urllib.error.HTTPError(request.full_url, status, "x", {}, _Body(text))  # type: ignore[arg-type]


class _Response:
    def __enter__(self) -> _Response:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def read(self) -> bytes:
        return b"{}"


class _Body:
    def __init__(self, text: str) -> None:
        self.text = text

    def read(self, *_args: Any) -> bytes:
        return self.text.encode()

    def close(self) -> None:
        return None


@pytest.mark.parametrize(
    ("script", "expected", "calls"),
    [
        ([(429, "slow down"), (200, "")], "ok", 2),
        ([(503, "busy"), (500, "busy"), (200, "")], "ok", 3),
        ([(409, '{"message": "Cannot transition trajectory"}')], "already terminal", 1),
        ([(400, "trajectory not in valid status")], "already terminal", 1),
        ([(404, "gone")], "already terminal", 1),
    ],
)
def test_a_call_retries_throttles_and_server_errors_and_takes_terminal_answers_as_final(
    monkeypatch: pytest.MonkeyPatch, script: list[tuple[int, str]], expected: str, calls: int
) -> None:
    answers = _Answers(script)
    monkeypatch.setattr(urllib.request, "urlopen", answers)
    client = JobRuntimeClient("https://runtime.invalid", "us-east-1", token=_fixed_token, sleep=lambda _s: None)
    assert client.call(MtrlTarget(JOB, ROLLOUT), "complete-ready", {"Status": "ready"}) == expected
    assert answers.calls == calls


def test_a_refused_call_is_not_retried_and_a_report_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = _Answers([(403, "denied")])
    monkeypatch.setattr(urllib.request, "urlopen", answers)
    client = JobRuntimeClient("https://runtime.invalid", "us-east-1", token=_fixed_token, sleep=lambda _s: None)
    with pytest.raises(JobRuntimeError, match="HTTP 403"):
        client.call(MtrlTarget(JOB, ROLLOUT), "complete-failed", {"Status": "failed"})
    assert answers.calls == 1
    sent = client.report(MtrlTarget(JOB, ROLLOUT), [1.0])
    assert sent["answers"]["complete-ready"].startswith("error: ")
