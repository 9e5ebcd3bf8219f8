"""Notification delay and AWS cost per rollout, measured in local mode.

One run of the local pipeline (moto server on loopback, the Lambda handlers as queue consumers, the trainer SDK)
with the in-process fake ACR standing in for agents: each rollout "runs" for its length, then writes its result
object like an ART agent. For every rollout, in the same run and against the same local S3:

- push (this project): time from the result object written to the `Rollout Completed` event received by the trainer
  SDK from the trainer queue (S3 -> EventBridge -> completion queue -> completion handler -> bus -> trainer queue);
- poll (ART 0.2.0): ART's own `RolloutFuture`, created when the rollout is invoked (as `RolloutClient.invoke` does),
  polling `head_object` with its default backoff (0.5 s, x1.5, capped at 30 s): time from the object written to the
  future seeing it;
- result written -> session stopped (this project's completion handler stops the session).

It also counts every AWS call the pipeline makes (botocore `before-call` hooks on the handlers' session and the SDK's)
and prices them per million rollouts with public us-east-1 list prices. Run: `python bench/bench_notify.py`
(about 2.5 minutes: the longest rollout is 90 s and ART's poll after it may come 30 s later).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rollout_pipeline.adapters import clients  # noqa: E402
from rollout_pipeline.adapters.s3 import S3ObjectStore  # noqa: E402
from rollout_pipeline.contracts import DetailType  # noqa: E402
from rollout_pipeline.fakes.acr import AgentBehaviour, FakeAgentRuntime, FakeInvocation  # noqa: E402
from rollout_pipeline.local.pipeline import LocalPipeline, LocalSettings  # noqa: E402
from rollout_pipeline.local.resources import ExperimentResources  # noqa: E402
from rollout_pipeline.topology import FUNCTIONS  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prices import PRICES  # noqa: E402


class TimedStore(S3ObjectStore):
    """The fake agent's S3: records when each result object was written (after PutObject returned)."""

    def __init__(self) -> None:
        super().__init__()
        self.written_at: dict[str, float] = {}

    def put_bytes(
        self,
        bucket: str,
        key: str,
        body: bytes,
        content_type: str = "application/json",
        metadata: Mapping[str, str] | None = None,
    ) -> str | None:
        version = super().put_bytes(bucket, key, body, content_type, metadata)
        self.written_at[key] = time.time()
        return version


class ArtPollers:
    """One ART `RolloutFuture` per invoked rollout, each waited on in its own thread (as `future.result()`)."""

    def __init__(self, bucket: str, exp_id: str) -> None:
        import boto3

        self.bucket = bucket
        self.exp_id = exp_id
        self.s3 = boto3.client("s3")  # endpoint from AWS_ENDPOINT_URL (the local moto server)
        self.seen_at: dict[str, float] = {}
        self.polls: Counter[str] = Counter()
        self._lock = threading.Lock()

    def start(self, session_id: str, input_id: str, timeout_s: float) -> None:
        from agentcore_rl_toolkit.client import RolloutFuture

        key = f"{self.exp_id}/{input_id}/{session_id}.json"
        future = RolloutFuture(self.s3, self.bucket, key, session_id=session_id, input_id=input_id)
        original_done = future.done

        def counted_done() -> bool:
            with self._lock:
                self.polls[key] += 1
            return bool(original_done())

        future.done = counted_done

        def wait() -> None:
            try:
                future.result(timeout=timeout_s)
            except Exception:
                return
            with self._lock:
                self.seen_at[key] = time.time()

        threading.Thread(target=wait, daemon=True).start()


class CallCounter:
    """Counts AWS API calls by service and operation, with DynamoDB request units estimated from the request."""

    def __init__(self) -> None:
        self.calls: Counter[tuple[str, str]] = Counter()
        self.wru = 0.0
        self.rru = 0.0
        self._lock = threading.Lock()

    def attach(self, session: Any) -> None:
        session.events.register("before-call", self._before_call)
        session.events.register("after-call", self._after_call)

    def attach_to_pipeline_clients(self, pipeline: LocalPipeline) -> None:
        for factory in (pipeline.clients, clients.default_factory()):  # the handlers'; the fake agent's
            factory.register_hook("before-call", self._before_call)
            factory.register_hook("after-call", self._after_call)

    def _after_call(self, model: Any, parsed: Mapping[str, Any], **_: Any) -> None:
        # Empty long polls are a per-hour cost of an idle consumer (Lambda's pollers make them too), not a
        # per-rollout one: count them apart.
        if model.name == "ReceiveMessage":
            op = "ReceiveMessage" if parsed.get("Messages") else "ReceiveMessage (empty poll)"
            with self._lock:
                self.calls[(model.service_model.service_name, op)] += 1

    def _before_call(self, model: Any, params: Mapping[str, Any], **_: Any) -> None:
        service = model.service_model.service_name
        op = model.name
        if op == "ReceiveMessage":
            return
        with self._lock:
            self.calls[(service, op)] += 1
            if service == "dynamodb":
                wru, rru = _request_units(op, params)
                self.wru += wru
                self.rru += rru


def _request_units(op: str, params: Mapping[str, Any]) -> tuple[float, float]:
    """Estimated request units of one DynamoDB call (items under 1 KB; a failed condition still costs its write)."""
    if op in ("PutItem", "UpdateItem", "DeleteItem"):
        return 1.0, 0.0
    if op == "TransactWriteItems":
        return 2.0 * len(params.get("TransactItems") or []), 0.0
    if op == "BatchWriteItem":
        return float(sum(len(v) for v in (params.get("RequestItems") or {}).values())), 0.0
    if op == "GetItem":
        return 0.0, 1.0 if params.get("ConsistentRead") else 0.5
    if op in ("Query", "Scan"):
        return 0.0, 1.0
    if op == "TransactGetItems":
        return 0.0, 2.0 * len(params.get("TransactItems") or [])
    return 0.0, 0.0


def _handler_timer(durations: defaultdict[str, list[float]], name: str, handler: Any) -> Any:
    def timed(event: Any, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return handler(event, context)
        finally:
            durations[name].append(time.perf_counter() - started)

    return timed


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(lengths: list[float], per_length: int) -> dict[str, Any]:
    rows: list[dict[str, Any]] = [
        {"id": f"len{int(length)}-{i}", "question": "bench", "length_s": length}
        for length in lengths
        for i in range(per_length)
    ]
    store = TimedStore()
    pollers: dict[str, ArtPollers] = {}
    invoked_at: dict[str, float] = {}

    def behaviour(inv: FakeInvocation) -> AgentBehaviour:
        return AgentBehaviour(rewards=1.0, delay_s=float(inv.payload["length_s"]))

    class BenchRuntime(FakeAgentRuntime):
        def invoke(self, session_id: str, payload: Mapping[str, Any]) -> None:
            super().invoke(session_id, payload)
            invoked_at[session_id] = time.time()
            pollers["art"].start(session_id, str(payload["_rollout"]["input_id"]), timeout_s=max(lengths) + 120)

    def factory(resources: ExperimentResources) -> FakeAgentRuntime:
        pollers["art"] = ArtPollers(resources.results_bucket, resources.config.name)
        return BenchRuntime(store=store, behaviour=behaviour)

    settings = LocalSettings(
        experiment="bench-notify",
        group_size=1,
        max_sessions=len(rows),
        tps_limit=25,
        model_url="http://127.0.0.1:9/v1",
        rollout_timeout_s=int(max(lengths)) + 300,
        sweep_interval_s=30.0,
        runtime_factory=factory,
        dispatch_concurrency=2,
    )
    handler_counter, sdk_counter = CallCounter(), CallCounter()
    durations: defaultdict[str, list[float]] = defaultdict(list)
    received_at: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp, LocalPipeline(settings) as pipeline:
        handler_counter.attach_to_pipeline_clients(pipeline)  # the handlers' (and the fake agent's) boto3 clients
        sdk_counter.attach(pipeline.experiment.aws.session)
        for consumer in pipeline.consumers:
            consumer.handler = _handler_timer(durations, consumer.name, consumer.handler)
        dataset = Path(tmp) / "bench.jsonl"
        dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
        batch_id = pipeline.experiment.batches.submit_file(dataset)
        started = time.time()
        for event in pipeline.experiment.events(batch_id=batch_id, timeout=max(lengths) + 120):
            if event.detail_type is DetailType.ROLLOUT_COMPLETED:
                received_at[event.detail.session_id] = time.time()
            if event.detail_type is DetailType.BATCH_COMPLETED:
                break
        # ART's pollers of the longest rollouts may still be waiting for their next poll.
        deadline = time.time() + 40
        while len(pollers["art"].seen_at) < len(rows) and time.time() < deadline:
            time.sleep(0.5)
        stops = {c.session_id: c.at for c in pipeline.runtime.calls if c.op == "stop"}
        runtime_calls = Counter(c.op for c in pipeline.runtime.calls)
        wall = time.time() - started

    by_length: defaultdict[float, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for key, written in store.written_at.items():
        session = key.rsplit("/", 1)[-1][: -len(".json")]
        length = float(next(r["length_s"] for r in rows if key.split("/")[1] == r["id"]))
        if session in received_at:
            by_length[length]["push"].append(received_at[session] - written)
        if key in pollers["art"].seen_at:
            by_length[length]["poll"].append(pollers["art"].seen_at[key] - written)
        if session in stops:
            by_length[length]["stop"].append(stops[session] - written)
    return {
        "rows": rows,
        "by_length": by_length,
        "handler_calls": handler_counter,
        "sdk_calls": sdk_counter,
        "art_polls": sum(pollers["art"].polls.values()),
        "durations": durations,
        "runtime_calls": runtime_calls,
        "wall_s": wall,
    }


def report(result: dict[str, Any]) -> None:
    n = len(result["rows"])
    print(f"\nNotification delay: result object written -> trainer notified ({n} rollouts, one run, same local S3)\n")
    print(
        "| rollout length | push: event received by SDK (median / max) | ART RolloutFuture poll (median / max) | "
        "written -> session stopped (median) |"
    )
    print("|---|---|---|---|")
    for length in sorted(result["by_length"]):
        d = result["by_length"][length]
        push, poll, stop = d.get("push", []), d.get("poll", []), d.get("stop", [])

        def fmt(values: list[float]) -> str:
            if not values:
                return "n/a"
            return f"{statistics.median(values):.2f} s / {max(values):.2f} s"

        stop_text = f"{statistics.median(stop):.2f} s" if stop else "n/a"
        print(f"| {length:.0f} s | {fmt(push)} | {fmt(poll)} | {stop_text} |")

    handler_calls: CallCounter = result["handler_calls"]
    sdk_calls: CallCounter = result["sdk_calls"]
    print(
        f"\nAWS calls per rollout, local mode ({n} rollouts, group size 1; handlers + fake agent's S3 write; "
        "the trainer SDK separately)\n"
    )
    print("| service | operation | calls / rollout |")
    print("|---|---|---|")
    totals: Counter[str] = Counter()
    for (service, op), count in sorted(handler_calls.calls.items()):
        print(f"| {service} | {op} | {count / n:.2f} |")
        totals[service] += count
    for (service, op), count in sorted(sdk_calls.calls.items()):
        print(f"| {service} (trainer SDK) | {op} | {count / n:.2f} |")
    runtime_calls: Counter[str] = result["runtime_calls"]
    print(f"| bedrock-agentcore | InvokeAgentRuntime | {runtime_calls['invoke'] / n:.2f} |")
    print(f"| bedrock-agentcore | StopRuntimeSession | {runtime_calls['stop'] / n:.2f} |")
    print(
        f"\nART polling for comparison: {result['art_polls'] / n:.1f} S3 HEAD calls per rollout "
        f"(rollouts of {', '.join(f'{x:.0f}' for x in sorted(result['by_length']))} s)"
    )

    # Cost per million rollouts (AWS-side, excluding ACR compute and the model).
    per_rollout = {
        "SQS requests": (
            sum(c for (s, _), c in handler_calls.calls.items() if s == "sqs")
            + sum(c for (s, _), c in sdk_calls.calls.items() if s == "sqs")
            # EventBridge rule targets deliver into SQS: one SendMessage per event delivered.
            + handler_calls.calls[("s3", "PutObject")]
            + handler_calls.calls[("events", "PutEvents")]
        )
        / n
        * PRICES["sqs_request"],
        "DynamoDB": (
            handler_calls.wru * PRICES["dynamodb_wru"]
            + handler_calls.rru * PRICES["dynamodb_rru"]
            + sdk_calls.wru * PRICES["dynamodb_wru"]
            + sdk_calls.rru * PRICES["dynamodb_rru"]
        )
        / n,
        "EventBridge custom events": _events_published(handler_calls) / n * PRICES["eventbridge_custom_event"],
        "S3 requests": (
            sum(c for (s, op), c in handler_calls.calls.items() if s == "s3" and op in ("PutObject",))
            * PRICES["s3_put"]
            + sum(c for (s, op), c in handler_calls.calls.items() if s == "s3" and op in ("GetObject", "HeadObject"))
            * PRICES["s3_get"]
        )
        / n,
    }
    durations: dict[str, list[float]] = result["durations"]
    invocations = sum(len(v) for v in durations.values())
    gb_s = sum(sum(v) * FUNCTIONS[name].memory_mb / 1024 for name, v in durations.items())
    per_rollout["Lambda requests"] = invocations / n * PRICES["lambda_request"]
    per_rollout["Lambda compute (arm64)"] = gb_s / n * PRICES["lambda_gb_s_arm"]
    print("\nCost per million rollouts (us-east-1 list prices; AWS-side only: ACR compute and the model excluded)\n")
    print("| item | USD per 1M rollouts |")
    print("|---|---|")
    for item, usd in per_rollout.items():
        print(f"| {item} | {usd * 1e6:,.2f} |")
    print(f"| **total** | **{sum(per_rollout.values()) * 1e6:,.2f}** |")
    wall = result["wall_s"]
    print(f"\n(Lambda time measured locally: {invocations} invocations, {gb_s:.1f} GB-s; run took {wall:.0f} s)")


def _events_published(counter: CallCounter) -> float:
    # Each PutEvents call in the pipeline carries one to a few events; count calls as an upper bound of one each.
    return float(counter.calls[("events", "PutEvents")])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="1,5,15,30,60,90", help="rollout lengths in seconds, comma-separated")
    parser.add_argument("--per-length", type=int, default=4, help="rollouts per length (default: 4)")
    args = parser.parse_args(argv)
    lengths = [float(x) for x in args.lengths.split(",") if x.strip()]
    report(run(lengths, args.per_length))


if __name__ == "__main__":
    main()
