"""Many backend instances in many worker processes, one event bus: each process reads only its own rollouts'
events (its private subscription), nothing is lost, nothing is handed over twice, nothing is dead-lettered, and each
process removes its subscription when it exits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from rollout_pipeline.adapters.s3 import S3ObjectStore
from rollout_pipeline.fakes.acr import AgentBehaviour, FakeAgentRuntime, FakeInvocation
from rollout_pipeline.local.pipeline import REGION, LocalPipeline, LocalSettings

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 3
PER_WORKER = 8

WORKER = textwrap.dedent(
    """
    import asyncio, json, sys, uuid
    from agentcore_rl_toolkit.aws_tools.persistent_dict import NullPersister, PersistentDict
    from agentcore_rl_toolkit.rollout_session.factory import make_session

    outputs, endpoint, worker, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    cfg = {"backend": "rollout_pipeline.trainers.art.PipelineSession", "outputs_file": outputs,
           "endpoint_url": endpoint, "poll_wait_s": 1}

    async def one(i):
        sid = str(uuid.uuid4())
        state = PersistentDict({"session_id": sid}, persister=NullPersister())
        task = {"payload": {"score": worker * 100 + i}, "group_id": f"w{worker}-g{i // 4}", "global_steps": worker,
                "llm": {"model": "m", "base_url": "http://gw/v1", "api_key": sid}}
        async with make_session(sid, cfg, state) as session:
            await session.setup(task)
            dump = await asyncio.wait_for(session.run(task), 60)
        return dump.reward, dump.task_output["pipeline"]["policy_version"]

    async def main():
        return await asyncio.gather(*[one(i) for i in range(count)])

    print(json.dumps(asyncio.run(main())))
    """
)


def behaviour(inv: FakeInvocation) -> AgentBehaviour:
    return AgentBehaviour(rewards=float(inv.payload["score"]), delay_s=0.2 + (inv.call_no % 5) * 0.2)


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[LocalPipeline]:
    settings = LocalSettings(
        experiment="procs",
        group_size=1,
        model_url="http://127.0.0.1:9/v1",
        max_sessions=WORKERS * PER_WORKER,
        max_attempts=1,
        runtime_factory=lambda _resources: FakeAgentRuntime(store=S3ObjectStore(), behaviour=behaviour),
        work_dir=tmp_path / "work",
    )
    with LocalPipeline(settings) as running:
        yield running


def test_worker_processes_share_the_bus_without_losing_or_double_handing_events(
    pipeline: LocalPipeline, tmp_path: Path
) -> None:
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps(pipeline.resources.stack_outputs()))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(outputs), pipeline.endpoint_url, str(w), str(PER_WORKER)],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for w in range(WORKERS)
    ]
    results = []
    for w, proc in enumerate(workers):
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        results.append((w, json.loads(out)))

    for w, rewards in results:
        assert [r for r, _pv in rewards] == [float(w * 100 + i) for i in range(PER_WORKER)], "each got its own"
        assert {pv for _r, pv in rewards} == {str(w)}
    assert len(pipeline.runtime.invocations()) == WORKERS * PER_WORKER, "one rollout per run, none re-run"
    assert not any(pipeline.dead_letters().values()), "no event was bounced into a dead-letter queue"

    sqs = boto3.client("sqs", endpoint_url=pipeline.endpoint_url, region_name=REGION)
    events = boto3.client("events", endpoint_url=pipeline.endpoint_url, region_name=REGION)
    bus = pipeline.resources.bus_name
    leftover_queues = sqs.list_queues(QueueNamePrefix=f"{bus}-art-").get("QueueUrls", [])
    leftover_rules = [
        r["Name"] for r in events.list_rules(EventBusName=bus)["Rules"] if r["Name"].startswith(f"{bus}-art-")
    ]
    assert leftover_queues == []
    assert leftover_rules == [], "each worker removed its subscription at exit"
