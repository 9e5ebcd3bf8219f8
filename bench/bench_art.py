"""ART rollout sessions: ART's own S3 polling vs the pipeline's backend, same groups, same local S3, one run.

Both sides are driven by ART 0.2.0's own `run_rollout_with_bounds` (bounds from its `Local*` primitives), with the
same GRPO groups and rollout lengths, concurrently, against one loopback moto server:

- poll (ART): an `AgentCoreS3Session`-style session: `run` invokes the agent (the in-process fake ACR stands in for
  ACR, writing ART's result object to a bucket of its own) and awaits ART's own `RolloutFuture` (S3 HEAD polling
  with ART's default backoff 0.5 s x1.5 capped at 30 s, then a GET), then ART's own `to_dump`;
- push (this project): `rollout_pipeline.trainers.art.PipelineSession`, built by ART's factory, against the local
  pipeline (the Lambda handlers as queue consumers, the same fake ACR behind the dispatcher).

Measured per rollout: result object written -> `run()` returned (median, p99, max), and S3 requests made on each
side (ART: the trainer's HEADs and GET; ours: the trainer SDK's, plus the pipeline's own, reported apart).
Needs ART's rollout extra (aiobotocore): `make art-bench` (the `make art-test` environment). About a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentcore_rl_toolkit.aws_tools.persistent_dict import NullPersister, PersistentDict  # noqa: E402
from agentcore_rl_toolkit.client import RolloutFuture  # noqa: E402
from agentcore_rl_toolkit.concurrency.priority_assigner import LocalPriorityAssigner  # noqa: E402
from agentcore_rl_toolkit.concurrency.priority_semaphore import LocalPrioritySemaphore  # noqa: E402
from agentcore_rl_toolkit.rollout_session.agentcore_s3_session import to_dump as art_to_dump  # noqa: E402
from agentcore_rl_toolkit.rollout_session.factory import make_session  # noqa: E402
from agentcore_rl_toolkit.rollout_session.lifecycle import (  # noqa: E402
    RolloutSessionBounds,
    run_rollout_with_bounds,
)
from agentcore_rl_toolkit.rollout_session.wire import RolloutDumpResponse  # noqa: E402

from rollout_pipeline.adapters import clients  # noqa: E402
from rollout_pipeline.fakes.acr import AgentBehaviour, FakeAgentRuntime, FakeInvocation  # noqa: E402
from rollout_pipeline.local.pipeline import LocalPipeline, LocalSettings  # noqa: E402
from rollout_pipeline.trainers import art  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_notify import TimedStore  # noqa: E402

ART_BUCKET = "art-poll-results"
ART_EXP = "art-bench"


class S3Counter:
    """S3 requests by operation, from botocore's before-call hook."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, model: Any, **_: Any) -> None:
        if model.service_model.service_name == "s3":
            with self._lock:
                self.calls[model.name] += 1


def behaviour(inv: FakeInvocation) -> AgentBehaviour:
    return AgentBehaviour(rewards=float(inv.payload["score"]), delay_s=float(inv.payload["length_s"]))


class PollingSession:
    """`AgentCoreS3Session.run`, with the fake ACR's invoke in place of ACR's: ART's future, ART's dump."""

    def __init__(self, session_id: str, runtime: FakeAgentRuntime, s3: Any) -> None:
        self.session_id = session_id
        self.runtime = runtime
        self.s3 = s3
        self.result_key = ""

    async def __aenter__(self) -> PollingSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def setup(self, task: dict[str, Any]) -> None:  # noqa: ARG002 - the protocol's signature
        return None

    async def run(self, task: dict[str, Any]) -> RolloutDumpResponse:
        group = task["group_id"]
        rollout = {"exp_id": ART_EXP, "input_id": group, "s3_bucket": ART_BUCKET, "api_key": task["llm"]["api_key"]}
        await asyncio.to_thread(self.runtime.invoke, self.session_id, {**task["payload"], "_rollout": rollout})
        self.result_key = f"{ART_EXP}/{group}/{self.session_id}.json"
        future = RolloutFuture(self.s3, ART_BUCKET, self.result_key, session_id=self.session_id, input_id=group)
        return art_to_dump(await future)

    async def shutdown(self) -> None:
        self.runtime.stop(self.session_id)


def bounds(concurrency: int) -> RolloutSessionBounds:
    return RolloutSessionBounds(
        container_semaphore=LocalPrioritySemaphore(concurrency),
        rollout_semaphore=LocalPrioritySemaphore(concurrency),
        container_priority_assigner=LocalPriorityAssigner(),
        rollout_priority_assigner=LocalPriorityAssigner(),
        container_setup_timeout=60.0,
        agent_run_timeout=300.0,
    )


def task(group: str, session_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    llm = {"model": "openai/bench", "base_url": "http://gateway:8000/v1", "api_key": session_id}
    return {"payload": payload, "group_id": group, "global_steps": 1, "llm": llm}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(latencies: list[float]) -> dict[str, float]:
    return {
        "median_ms": round(statistics.median(latencies) * 1000, 1),
        "p99_ms": round(percentile(latencies, 0.99) * 1000, 1),
        "max_ms": round(max(latencies) * 1000, 1),
    }


def run(groups: int, group_size: int, max_length_s: float) -> dict[str, Any]:
    store = TimedStore()
    n = groups * group_size
    payloads = {
        f"g{g}": [
            {
                "score": (i % 2) * 1.0,
                "length_s": round(1 + (max_length_s - 1) * (g * group_size + i) / max(1, n - 1), 2),
            }
            for i in range(group_size)
        ]
        for g in range(groups)
    }
    settings = LocalSettings(
        experiment="art-bench",
        group_size=1,
        model_url="http://127.0.0.1:9/v1",
        max_sessions=n + 4,
        tps_limit=50,
        max_attempts=1,
        rollout_timeout_s=600,
        dispatch_concurrency=4,
        runtime_factory=lambda _resources: FakeAgentRuntime(store=store, behaviour=behaviour),
    )
    with LocalPipeline(settings) as pipeline:
        import boto3

        pipeline_s3 = S3Counter()
        for factory in (pipeline.clients, clients.default_factory()):  # the handlers'; the fake agent's
            factory.register_hook("before-call", pipeline_s3)
        s3 = boto3.client("s3")  # AWS_ENDPOINT_URL points at the local moto server
        s3.create_bucket(Bucket=ART_BUCKET)
        art_s3 = S3Counter()
        s3.meta.events.register("before-call", art_s3)
        art_runtime = FakeAgentRuntime(store=store, behaviour=behaviour)

        outputs = pipeline.work_dir / "outputs.json"
        outputs.write_text(json.dumps(pipeline.resources.stack_outputs()))
        cfg = {"outputs_file": str(outputs), "endpoint_url": pipeline.endpoint_url, "poll_wait_s": 20}
        sdk_s3 = S3Counter()
        art.shared_client(art.parse_config(cfg)).experiment.aws.session.events.register("before-call", sdk_s3)
        backend_cfg = {"backend": art.BACKEND_PATH, **cfg}

        returned: dict[str, list[tuple[str, float]]] = {"poll": [], "push": []}

        async def one(side: str, group: str, payload: dict[str, Any], b: RolloutSessionBounds) -> None:
            session_id = str(uuid.uuid4())
            state = PersistentDict({"session_id": session_id}, persister=NullPersister())
            session: Any = (
                PollingSession(session_id, art_runtime, s3)
                if side == "poll"
                else make_session(session_id, backend_cfg, state)
            )
            dump = await run_rollout_with_bounds(state, b, group, session, task(group, session_id, payload))
            now = time.time()
            if not dump.is_successful():
                raise RuntimeError(f"{side} rollout failed: {dump.exception}")
            if side == "poll":
                key = session.result_key
            else:
                key = str(dump.task_output["pipeline"]["result_uri"]).split("/", 3)[3]
            returned[side].append((key, now))

        async def main() -> None:
            b_poll, b_push = bounds(n), bounds(n)
            await asyncio.gather(
                *[one("poll", g, p, b_poll) for g, ps in payloads.items() for p in ps],
                *[one("push", g, p, b_push) for g, ps in payloads.items() for p in ps],
            )

        started = time.monotonic()
        asyncio.run(main())
        wall_s = time.monotonic() - started
        art.reset_clients()
        runtimes = {"poll": art_runtime, "push": pipeline.runtime}

    def slowest(side: str) -> list[dict[str, float]]:
        """The three slowest rollouts of a side: their length and latency (where the tail comes from)."""
        rows = []
        for key, t in returned[side]:
            session = key.rsplit("/", 1)[1].removesuffix(".json")
            length = float(runtimes[side].payloads[session]["length_s"])
            rows.append({"length_s": length, "latency_ms": round((t - store.written_at[key]) * 1000, 1)})
        return sorted(rows, key=lambda r: -r["latency_ms"])[:3]

    latencies = {side: [t - store.written_at[key] for key, t in rows] for side, rows in returned.items()}
    return {
        "rollouts_per_side": n,
        "groups": groups,
        "rollout_length_s": [min(p["length_s"] for ps in payloads.values() for p in ps), max_length_s],
        "wall_s": round(wall_s, 1),
        "poll": {
            **summary(latencies["poll"]),
            "s3_requests_per_rollout": round(sum(art_s3.calls.values()) / n, 2),
            "s3_requests": dict(art_s3.calls),
            "slowest": slowest("poll"),
        },
        "push": {
            **summary(latencies["push"]),
            "s3_requests_per_rollout": round(sum(sdk_s3.calls.values()) / n, 2),
            "s3_requests": dict(sdk_s3.calls),
            "slowest": slowest("push"),
            # Without PutObject: those are the fake agents' result writes (both sides'), not the pipeline's requests.
            "pipeline_s3_requests_per_rollout": round(
                sum(c for op, c in pipeline_s3.calls.items() if op != "PutObject") / n, 2
            ),
            "pipeline_s3_requests": dict(pipeline_s3.calls),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=5)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-length-s", type=float, default=20.0)
    args = parser.parse_args()
    result = run(args.groups, args.group_size, args.max_length_s)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
