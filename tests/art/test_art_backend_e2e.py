"""ART's own `run_rollout_with_bounds` (bounds from ART's `Local*` concurrency primitives) drives the pipeline's
backend, built by ART's own factory, against the local pipeline (loopback moto, the fake ACR): groups with one
agent that fails and one that times out resolve with the right successes and typed failures, and every session is
stopped."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agentcore_rl_toolkit.aws_tools.persistent_dict import NullPersister, PersistentDict
from agentcore_rl_toolkit.concurrency.priority_assigner import LocalPriorityAssigner
from agentcore_rl_toolkit.concurrency.priority_semaphore import LocalPrioritySemaphore
from agentcore_rl_toolkit.concurrency.rate_limiter import LocalRateLimiter
from agentcore_rl_toolkit.rollout_session.factory import make_session
from agentcore_rl_toolkit.rollout_session.lifecycle import RolloutSessionBounds, run_rollout_with_bounds
from agentcore_rl_toolkit.rollout_session.wire import RolloutDumpResponse

from rollout_pipeline.adapters.s3 import S3ObjectStore
from rollout_pipeline.fakes.acr import AgentBehaviour, FakeAgentRuntime, FakeInvocation
from rollout_pipeline.local.pipeline import LocalPipeline, LocalSettings
from rollout_pipeline.trainers import art

GROUP_SIZE = 3


def behaviour(inv: FakeInvocation) -> AgentBehaviour:
    kind = inv.payload.get("kind")
    if kind == "fail":
        return AgentBehaviour(kind="agent_error", error="the agent raised ValueError: bad tool call", delay_s=0.2)
    if kind == "hang":
        return AgentBehaviour(kind="hang")
    return AgentBehaviour(rewards=[0.0, float(inv.payload["score"])], delay_s=0.2, extra={"metrics": {"turns": 2}})


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[LocalPipeline]:
    settings = LocalSettings(
        experiment="art-backend",
        group_size=1,
        model_url="http://127.0.0.1:9/v1",
        max_sessions=8,
        max_attempts=1,
        rollout_timeout_s=10,
        sweep_interval_s=1.0,
        runtime_factory=lambda resources: FakeAgentRuntime(store=S3ObjectStore(), behaviour=behaviour),
        work_dir=tmp_path / "work",
    )
    with LocalPipeline(settings) as running:
        outputs = tmp_path / "outputs.json"
        outputs.write_text(json.dumps(running.resources.stack_outputs()))
        running.outputs_file = outputs  # type: ignore[attr-defined]
        try:
            yield running
        finally:
            art.reset_clients()


def bounds(agent_run_timeout: float = 60.0) -> RolloutSessionBounds:
    return RolloutSessionBounds(
        container_semaphore=LocalPrioritySemaphore(6),
        rollout_semaphore=LocalPrioritySemaphore(6),
        container_priority_assigner=LocalPriorityAssigner(),
        rollout_priority_assigner=LocalPriorityAssigner(),
        container_setup_timeout=30.0,
        agent_run_timeout=agent_run_timeout,
        session_rate_limiter=LocalRateLimiter(50),
    )


def art_task(group_id: str, session_id: str, payload: dict[str, Any], step: int = 7) -> dict[str, Any]:
    """A task as veRL's RolloutSessionAgentLoop builds it (`build_llm`: api_key = the session id)."""
    return {
        "payload": payload,
        "group_id": group_id,
        "global_steps": step,
        "llm": {"model": "openai/Qwen3-0.6B", "base_url": "http://gateway:8000/v1", "api_key": session_id},
    }


async def one_rollout(
    backend_cfg: dict[str, Any], group_id: str, payload: dict[str, Any], b: RolloutSessionBounds
) -> RolloutDumpResponse | BaseException:
    session_id = str(uuid.uuid4())
    state = PersistentDict({"session_id": session_id}, persister=NullPersister())
    session = make_session(session_id, backend_cfg, state)
    try:
        return await run_rollout_with_bounds(state, b, group_id, session, art_task(group_id, session_id, payload))
    except BaseException as exc:  # what the agent loop would see
        return exc


def sessions_left(pipeline: LocalPipeline, grace_s: float = 10.0) -> list[str]:
    deadline = time.monotonic() + grace_s
    while pipeline.active_sessions() and time.monotonic() < deadline:
        time.sleep(0.1)
    return pipeline.active_sessions()


def test_art_drives_groups_to_typed_outcomes_and_every_session_stops(pipeline: LocalPipeline) -> None:
    cfg = {
        "backend": art.BACKEND_PATH,
        "outputs_file": str(pipeline.outputs_file),
        "endpoint_url": pipeline.endpoint_url,
        "poll_wait_s": 1,
        "timeout_s": 10,
    }
    groups = {
        "g-ok": [{"score": 1.0}, {"score": 0.5}, {"score": 0.25}],
        "g-fail": [{"score": 1.0}, {"kind": "fail"}, {"score": 0.0}],
        "g-hang": [{"score": 1.0}, {"score": 1.0}, {"kind": "hang"}],
    }
    b = bounds()

    async def main() -> dict[str, list[RolloutDumpResponse | BaseException]]:
        runs = {g: [one_rollout(cfg, g, p, b) for p in payloads] for g, payloads in groups.items()}
        flat = await asyncio.gather(*[c for cs in runs.values() for c in cs])
        out, i = {}, 0
        for g, cs in runs.items():
            out[g], i = list(flat[i : i + len(cs)]), i + len(cs)
        return out

    started = time.monotonic()
    results = asyncio.run(main())
    elapsed = time.monotonic() - started
    assert all(isinstance(r, RolloutDumpResponse) for rs in results.values() for r in rs), results

    ok = results["g-ok"]
    assert [r.reward for r in ok] == [1.0, 0.5, 0.25]  # the pipeline's scalar: the last turn's reward
    assert all(r.is_successful() and r.exception is None for r in ok)
    assert all(r.task_output["reward"] == r.reward for r in ok)  # where slime reads it
    assert all(r.metrics["turns"] == 2.0 and r.metrics["pipeline/attempt"] == 1.0 for r in ok)
    assert {r.task_output["pipeline"]["policy_version"] for r in ok} == {"7"}  # task["global_steps"]
    assert {r.task_output["pipeline"]["input_id"] for r in ok} == {"g-ok"}

    fail = results["g-fail"]
    assert [r.is_successful() for r in fail] == [True, False, True]
    assert fail[1].reward is None, "a failure is never a reward"
    assert fail[1].exception is not None
    assert fail[1].exception.startswith("agent_error: ")
    assert "bad tool call" in fail[1].exception

    hang = results["g-hang"]
    assert [r.is_successful() for r in hang] == [True, True, False]
    assert hang[2].reward is None
    assert hang[2].exception is not None
    assert hang[2].exception.startswith("timeout: ")
    assert elapsed < 40, elapsed

    assert sessions_left(pipeline) == [], "every terminal rollout stopped its session"
    runtime: FakeAgentRuntime = pipeline.runtime
    assert len(runtime.invocations()) == 9
    assert not any(pipeline.dead_letters().values())
    # The capture key travelled as the per-rollout key; no other credential did.
    for payload in runtime.payloads.values():
        rollout = payload["_rollout"]
        assert rollout["token_capture"] == "none"
        assert rollout["model_id"] == "Qwen3-0.6B"
        assert rollout["base_url"] == "http://gateway:8000/v1"
        assert rollout["policy_version"] == "7"
        uuid.UUID(rollout["api_key"])


def test_art_timeout_shutdown_cancels_the_rollout_and_stops_its_session(pipeline: LocalPipeline) -> None:
    cfg = {
        "backend": art.BACKEND_PATH,
        "outputs_file": str(pipeline.outputs_file),
        "endpoint_url": pipeline.endpoint_url,
        "poll_wait_s": 1,
        "timeout_s": 300,
    }
    runtime: FakeAgentRuntime = pipeline.runtime

    async def main() -> RolloutDumpResponse | BaseException:
        return await one_rollout(cfg, "g-art-timeout", {"kind": "hang"}, bounds(agent_run_timeout=3.0))

    outcome = asyncio.run(main())
    assert isinstance(outcome, TimeoutError), outcome  # ART's own agent_run_timeout
    assert sessions_left(pipeline) == [], "shutdown cancelled the rollout: its session was stopped"
    assert len(runtime.stops()) >= 1
    experiment = pipeline.experiment
    (session_id,) = runtime.payloads
    batch_id = runtime.payloads[session_id]["_rollout"]["batch_id"]
    status = experiment.status(batch_id)
    assert status.failed_by_reason == {"cancelled": 1}, status


def test_factory_rejects_unknown_config_keys() -> None:
    state = PersistentDict({"session_id": "s"}, persister=NullPersister())
    with pytest.raises(ValueError, match="surprise"):
        make_session("s" * 36, {"backend": art.BACKEND_PATH, "outputs_file": "x.json", "surprise": 1}, state)
