"""Benchmark the rollout lifecycle: dispatcher + completion over moto with the fake ACR, under the global limits.

What runs: in-process moto (every request made atomic with a lock, as AWS requests are) holds the ledger table,
the queues, the buckets and the bus of one experiment. A feeder keeps the rollout queue shallow (moto SQS slows
down with depth) the way ingestion would fill it; local mode's queue consumers (`local.lambda_runtime.QueueConsumer`,
SQS batches of 10) run the Lambdas' own handlers: `--dispatchers` dispatcher workers (a wait budget of
`WAIT_BUDGET_S`) and `--completers` completion workers, with the real lifecycle code and boto3 adapters. The
fake ACR "agent" writes its result to S3 after a random delay (`--min-delay`..`--max-delay`), which reaches the
completion queue through S3 -> EventBridge -> SQS.

Printed:
- ACR calls per second (InvokeAgentRuntime + StopRuntimeSession, as the fake saw them) vs the TPS limit: the
  busiest second and the mean over the busy period;
- max sessions in flight (the fake's running sessions, invoke -> stop) vs max_sessions;
- slot refill delay: once the session limit is saturated, from a session's stop (its slot is freed in the
  same step) to the next InvokeAgentRuntime that took the slot (p50/p95/max);
- notification latency (result written -> event published, ms);
- AWS calls per rollout by service and operation (botocore `before-call` hooks; only the lifecycle's calls:
  not the feeder's sends, nor the fake agent's result writes).
moto answers in ~1-5 ms per call under one lock, so throughput is bounded by moto, not by the lifecycle: read the
limits and the per-rollout call counts, not the absolute rollouts/s.

Usage: python bench/bench_lifecycle.py [--rollouts 1500] [--tps 50] [--max-sessions 100] [--max-seconds 360]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

COUNTERS = ("terminal", "succeeded", "failed", "reward_sum", "reward_sumsq", "reward_count")
COUNTED_THREADS = ("dispatch", "lc-")  # lifecycle worker threads (ThreadPoolExecutor prefix, bench consumers)
#: How long a dispatcher invocation may wait for limits (the Lambda's remaining time minus the glue's margin).
WAIT_BUDGET_S = 5.0


def _fake_aws_env() -> None:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_SESSION_TOKEN": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
    }.items():
        os.environ[key] = value
    os.environ.pop("AWS_ENDPOINT_URL", None)
    os.environ.pop("AWS_PROFILE", None)


def _atomic_moto() -> None:
    """moto's backends are not thread-safe; AWS requests are atomic. Serialise moto's request processing."""
    from moto.core.botocore_stubber import BotocoreStubber

    lock = threading.RLock()
    original = BotocoreStubber.process_request

    def locked(self: Any, *args: Any, **kwargs: Any) -> Any:
        with lock:
            return original(self, *args, **kwargs)

    BotocoreStubber.process_request = locked  # type: ignore[method-assign]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def seed(resources: Any, batch_id: str, inputs: int, group_size: int) -> list[str]:
    """Batch + group items as ingestion writes them; returns the rollout message bodies."""
    from rollout_pipeline.feed.messages import bodies_of

    return bodies_of(seed_groups(resources, batch_id, inputs, group_size))


def seed_groups(resources: Any, batch_id: str, inputs: int, group_size: int) -> list[Any]:
    """Batch + group items as ingestion writes them; returns the groups as queued (`feed.messages.QueuedGroup`)."""
    from rollout_pipeline.adapters import clients
    from rollout_pipeline.contracts import FileOptions
    from rollout_pipeline.feed.messages import QueuedGroup
    from rollout_pipeline.ledger import keys

    config = resources.config
    ddb = clients.client("dynamodb")
    now = datetime.now(UTC)
    options = FileOptions.defaults(config)
    ddb.put_item(
        TableName=resources.table_name,
        Item={
            **keys.batch_key(batch_id),
            "exp_id": {"S": config.name},
            "batch_id": {"S": batch_id},
            "status": {"S": "accepted"},
            "options": {"S": options.model_dump_json()},
            "created_at": {"S": now.isoformat()},
            "rollouts_total": {"N": str(inputs * group_size)},
        },
    )
    groups: list[QueuedGroup] = []
    for i in range(inputs):
        input_id = f"row-{i}"
        payload = {"question": f"What is {i} + {i}?", "answer": str(2 * i)}
        ddb.put_item(
            TableName=resources.table_name,
            Item={
                **keys.group_key(batch_id, input_id),
                "exp_id": {"S": config.name},
                "batch_id": {"S": batch_id},
                "input_id": {"S": input_id},
                "line": {"N": str(i + 1)},
                "group_size": {"N": str(group_size)},
                "payload": {"S": json.dumps(payload)},
                "overrides": {"S": "{}"},
                "terminal": {"N": "0"},
                "rewards": {"M": {}},
                "failures": {"M": {}},
            },
        )
        groups.append(QueuedGroup(config.name, batch_id, input_id, i + 1, group_size, now, payload=payload))
    return groups


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=1500)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--tps", type=int, default=50)
    parser.add_argument("--max-sessions", type=int, default=100)
    parser.add_argument("--dispatchers", type=int, default=4, help="concurrent dispatcher 'Lambdas'")
    parser.add_argument("--completers", type=int, default=6, help="concurrent completion 'Lambdas'")
    parser.add_argument("--min-delay", type=float, default=0.5, help="agent time before the result (s)")
    parser.add_argument("--max-delay", type=float, default=3.0)
    parser.add_argument("--max-seconds", type=float, default=360.0, help="stop after this long, whatever is left")
    parser.add_argument("--queue-depth", type=int, default=150, help="keep at most this many queued messages")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--aws-profile", choices=["faithful", "moto"], default="faithful")
    parser.add_argument("--conflict-rate", type=float, default=0.0, help="faithful: hot-item conflict probability")
    args = parser.parse_args(argv)
    if args.rollouts < 1 or args.rollouts > 20_000:
        parser.error("--rollouts must be within 1..20000")

    _fake_aws_env()
    from moto import mock_aws

    from rollout_pipeline.fakes import faithful
    from rollout_pipeline.local.moto_server import cheap_moto_transactions

    _atomic_moto()
    cheap_moto_transactions()
    if args.aws_profile == "moto":
        with mock_aws():
            return run(args)
    profile = faithful.FaithfulProfile(seed=args.seed, conflict_rate=args.conflict_rate)
    with faithful.activate(profile), mock_aws():
        return run(args)


def run(args: argparse.Namespace) -> int:  # noqa: C901 (one run's harness: its threads share the run's state through closures)
    from harness import lifecycle_deps
    from lambda_consumers import KeptMetrics, lambda_consumer, quiet_handlers

    from rollout_pipeline.adapters import clients
    from rollout_pipeline.adapters.s3 import S3ObjectStore
    from rollout_pipeline.config import ExperimentConfig
    from rollout_pipeline.fakes.acr import AgentBehaviour, FakeAgentRuntime
    from rollout_pipeline.ledger.ledger import Ledger
    from rollout_pipeline.local.resources import create_resources
    from rollout_pipeline.metric_names import NOTIFICATION_LATENCY

    quiet_handlers()
    import lambdas.completion
    import lambdas.dispatch

    clients.reset()
    calls: Counter[str] = Counter()
    calls_lock = threading.Lock()

    def count_call(event_name: str = "", **_kwargs: Any) -> None:
        if threading.current_thread().name.startswith(COUNTED_THREADS):
            _, service, operation = event_name.split(".", 2)
            with calls_lock:
                calls[f"{service}.{operation}"] += 1

    clients.register_hook("before-call", count_call)

    group_size = args.group_size
    inputs = max(1, args.rollouts // group_size)
    total = inputs * group_size
    config = ExperimentConfig(
        name="bench",
        tps_limit=args.tps,
        max_sessions=args.max_sessions,
        group_size=group_size,
        rollout_timeout_s=900,
    )
    resources = create_resources(config, region="us-east-1", client=clients.client)
    settings = resources.settings()
    rng = random.Random(args.seed)
    rng_lock = threading.Lock()

    def behaviour(_inv: Any) -> AgentBehaviour:
        with rng_lock:
            return AgentBehaviour(rewards=rng.random(), delay_s=rng.uniform(args.min_delay, args.max_delay))

    fake = FakeAgentRuntime(store=S3ObjectStore(), behaviour=behaviour)
    recorder = KeptMetrics()
    ledger = Ledger.open(settings.table_name)
    deps = lifecycle_deps(settings, fake, pooled=False, metrics=recorder)
    batch_id = "bench-000000000001"
    bodies = seed(resources, batch_id, inputs, group_size)
    sqs = clients.client("sqs")
    ledger = Ledger.open(settings.table_name)
    stop = threading.Event()
    in_flight_samples: list[int] = []

    def feeder() -> None:
        sent = 0
        while sent < len(bodies) and not stop.is_set():
            attrs = sqs.get_queue_attributes(
                QueueUrl=resources.rollout_queue_url, AttributeNames=["ApproximateNumberOfMessages"]
            )["Attributes"]
            room = args.queue_depth - int(attrs["ApproximateNumberOfMessages"])
            chunk = bodies[sent : sent + max(0, min(room, 100))]
            for start in range(0, len(chunk), 10):
                sqs.send_message_batch(
                    QueueUrl=resources.rollout_queue_url,
                    Entries=[{"Id": str(i), "MessageBody": b} for i, b in enumerate(chunk[start : start + 10])],
                )
            sent += len(chunk)
            time.sleep(0.2)

    consumers = [
        lambda_consumer(
            "lc-dispatch",
            resources.rollout_queue_url,
            lambdas.dispatch.function.bind(deps),
            workers=args.dispatchers,
            wait_budget_s=WAIT_BUDGET_S,
        ),
        lambda_consumer(
            "lc-complete",
            resources.completion_queue_url,
            lambdas.completion.function.bind(deps),
            workers=args.completers,
            wait_budget_s=WAIT_BUDGET_S,
            idle_s=0.05,
        ),
        # The trainer's queue must stay shallow too: a consumer that takes every event.
        lambda_consumer(
            "bench-trainer", resources.trainer_queue_url, lambda _event, _context: {}, workers=1, wait_budget_s=1
        ),
    ]
    feeder_thread = threading.Thread(target=feeder, name="bench-feeder", daemon=True)
    print(
        f"bench: {total} rollouts ({inputs} inputs x {group_size}), tps_limit={args.tps}, "
        f"max_sessions={args.max_sessions}, agent delay {args.min_delay}-{args.max_delay} s, "
        f"{args.dispatchers} dispatcher workers x 10 threads, {args.completers} completion workers",
        flush=True,
    )
    started = time.monotonic()
    feeder_thread.start()
    for running in consumers:
        running.start()
    terminal = 0
    last_report = started
    while time.monotonic() - started < args.max_seconds:
        batch = ledger.batches.read_batch(batch_id)
        terminal = batch.terminal if batch is not None else 0
        in_flight_samples.append(ledger.limits.in_flight())
        if terminal >= total:
            break
        if time.monotonic() - last_report > 15:
            last_report = time.monotonic()
            print(f"  {time.monotonic() - started:6.1f} s: {terminal}/{total} terminal", flush=True)
        time.sleep(0.5)
    elapsed = time.monotonic() - started
    stop.set()
    feeder_thread.join(timeout=15)
    for running in consumers:
        running.stop(timeout=15)
    fake.close()

    # ------------------------------------------------------------------------------------------------ report
    per_second = fake.calls_per_second()
    busy = [per_second.get(s, 0) for s in range(min(per_second), max(per_second) + 1)] if per_second else []
    invokes = sorted(c.at for c in fake.invocations("started"))
    stops = sorted(c.at for c in fake.stops())
    refill = [inv - st for st, inv in zip(stops, invokes[args.max_sessions :], strict=False) if inv >= st]
    recorder.drain()
    latency = recorder.kept_samples.get(NOTIFICATION_LATENCY, [])
    failed_messages = sum(c.stats.failed for c in consumers[:2])
    handler_errors = sum(c.stats.handler_errors for c in consumers[:2])
    print()
    print(f"terminal rollouts         {terminal}/{total} in {elapsed:.1f} s ({terminal / elapsed:.1f}/s)")
    print(
        f"ACR calls per second      max {max(busy) if busy else 0} / limit {args.tps}; "
        f"mean {statistics.fmean(busy) if busy else 0:.1f} over {len(busy)} s "
        f"({len(invokes)} invokes + {len(stops)} stops)"
    )
    print(
        f"sessions in flight        max {fake.max_running} / limit {args.max_sessions} "
        f"(ledger counter max {max(in_flight_samples, default=0)}, final {ledger.limits.in_flight()})"
    )
    print(
        f"slot refill delay         p50 {percentile(refill, 0.5) * 1000:.0f} ms, "
        f"p95 {percentile(refill, 0.95) * 1000:.0f} ms, max {max(refill, default=float('nan')) * 1000:.0f} ms "
        f"({len(refill)} refills at saturation)"
    )
    print(
        f"notification latency      p50 {percentile(latency, 0.5):.0f} ms, p95 {percentile(latency, 0.95):.0f} ms "
        "(result written -> event published)"
    )
    print(f"errors                    {failed_messages} messages failed, {handler_errors} invocations raised")
    print(f"AWS calls per rollout     (lifecycle only, {terminal} rollouts)")
    by_service: Counter[str] = Counter()
    for name, count in calls.items():
        by_service[name.split(".")[0]] += count
    denominator = max(terminal, 1)
    for service, count in sorted(by_service.items()):
        print(f"  {service:<12} {count / denominator:6.2f}")
        for name, op_count in sorted(calls.items()):
            if name.startswith(service + "."):
                print(f"      {name.split('.', 1)[1]:<28} {op_count / denominator:6.2f}")
    print(f"  {'total':<12} {sum(calls.values()) / denominator:6.2f}")
    print_conflicts_and_write_rates(terminal, elapsed)
    ok = terminal == total and fake.max_running <= args.max_sessions and (max(busy) if busy else 0) <= args.tps
    return 0 if ok else 1


def print_conflicts_and_write_rates(terminal: int, elapsed: float) -> None:
    """Conflict retries per 1,000 rollouts and the busiest ledger items' write rates (faithful profile only)."""
    from rollout_pipeline.fakes import faithful
    from rollout_pipeline.ledger import retry

    profile = faithful.active()
    if profile is None:
        return
    per_k = 1000 / max(terminal, 1)
    stats = profile.stats
    print(
        f"conflict retries          {retry.stats.total * per_k:.1f} per 1,000 rollouts "
        f"({retry.stats.plain} plain writes, {retry.stats.transactions} transactions; injected: "
        f"{stats.plain_conflicts} TransactionConflictException, {stats.transaction_conflicts} TransactionConflict)"
    )
    items = profile.plain_writes + profile.transaction_writes
    print("busiest ledger items      writes/s (WCU/s: transactional writes cost 2)")
    for item, count in items.most_common(5):
        key = json.loads(item)
        label = f"{key['pk']['S'][:24]}/{key['sk']['S'][:28]}"
        wcu = profile.plain_writes[item] + 2 * profile.transaction_writes[item]
        print(f"  {label:<54} {count / elapsed:7.1f}  ({wcu / elapsed:.1f} WCU/s)")


if __name__ == "__main__":
    raise SystemExit(main())
