"""Benchmark the lifecycle against AgentCore as it really behaves (the fake's realistic AcrProfile).

What runs: as `bench_lifecycle.py` (in-process moto made atomic, the real lifecycle code and boto3 adapters, a
feeder keeping the rollout queue shallow, the Lambdas' own handlers behind local mode's queue consumers: one per
dispatcher "Lambda", a pool of completers) plus the sweeper's handler on a 3 s schedule, and the fake ACR with
AgentCore's quotas and failure modes: 400 new sessions/min per endpoint, 25 new sessions/s per account, a shared
data-plane rate, active sessions counted until stopped or idle, `--cold-start` of first invokes answering
RuntimeClientError (424) and `--stop-fail` of stops failing (NotFound while running, Conflict, throttle).

Printed:
- new sessions per second vs `session_rate_limit` x endpoints over every sliding one-second window (busiest, and
  the mean over the busy period), per endpoint too; ACR calls per second vs `tps_limit` (how saturated the call
  budget was); ACR throttles received (goal 0);
- active sessions at peak vs `max_sessions` and the account quota; stops pending at the end and sessions never
  stopped (goal 0 both); cold starts retried, failed stops retried;
- result written -> event published (p50/p95): it must not depend on the call budget;
- time to the first `Group Completed` and the mean group completion time vs an ideal group-ordered schedule
  (groups admitted whole, in submission order, at the session rate, with the same agent delays).

Usage: python bench/bench_acr_quotas.py [--rollouts 2000] [--endpoints 1] [--session-rate 5] [--max-seconds 900]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_lifecycle import _atomic_moto, _fake_aws_env, percentile, seed  # noqa: E402
from harness import lifecycle_deps  # noqa: E402

from rollout_pipeline.limits.pacing import LATENESS_S  # noqa: E402
from rollout_pipeline.local.moto_server import (  # noqa: E402
    atomic_moto_receives,
    cheap_moto_transactions,
    is_dynamodb_request,
)


def busiest_window(times: list[float], width: float = 1.0) -> int:
    """The most events in any window [t, t + width) (windows starting at events suffice)."""
    ordered = sorted(times)
    best, j = 0, 0
    for i, start in enumerate(ordered):
        j = max(j, i)
        while j < len(ordered) and ordered[j] < start + width:
            j += 1
        best = max(best, j - i)
    return best


def ideal_group_schedule(delays: list[list[float]], rate: float, max_sessions: int) -> list[float]:
    """Group completion times (s from start) if groups were admitted whole, in order, one new session every 1/rate
    s, at most `max_sessions` at once (a slot frees when its rollout ends), with the given agent delays."""
    ends: list[float] = []  # end times of running sessions
    clock = 0.0
    done: list[float] = []
    for group in delays:
        group_end = 0.0
        for delay in group:
            ends.sort()
            if len(ends) >= max_sessions:
                clock = max(clock, ends.pop(0))
            end = clock + delay
            ends.append(end)
            group_end = max(group_end, end)
            clock += 1.0 / rate
        done.append(group_end)
    return done


class StageTrace:
    """Where result-to-event time goes, per session (wall clock, s): the agent's S3 PutObject started and returned
    (moto delivers the S3 -> EventBridge -> SQS notification inside it), a completer took the record, the terminal
    transaction committed, PutEvents of the rollout's event returned."""

    STAGES = ("put_start", "written", "received", "recorded", "published")

    def __init__(self) -> None:
        self.at: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()

    def mark(self, session_id: str, stage: str) -> None:
        now = time.time()
        with self._lock:
            self.at.setdefault(session_id, {}).setdefault(stage, now)

    def install(self, fake: Any, deps: Any) -> None:
        """Wrap the fake's store, the completion handler, the ledger's terminal transition and the publisher."""
        from rollout_pipeline.lifecycle import completion

        store, put = fake.store, fake.store.put_bytes

        def put_bytes(bucket: str, key: str, body: bytes, *args: Any, **kwargs: Any) -> Any:
            sid = key.rsplit("/", 1)[-1].removesuffix(".json")
            self.mark(sid, "put_start")
            try:
                return put(bucket, key, body, *args, **kwargs)
            finally:
                self.mark(sid, "written")

        store.put_bytes = put_bytes
        handle = completion.handle_result_event

        def handle_result_event(event: Any, *args: Any, **kwargs: Any) -> Any:
            key = str(((event.get("detail") or {}).get("object") or {}).get("key") or "")
            self.mark(key.rsplit("/", 1)[-1].removesuffix(".json"), "received")
            return handle(event, *args, **kwargs)

        completion.handle_result_event = handle_result_event  # type: ignore[assignment]
        finish = deps.ledger.rollouts.finish

        def finished(*args: Any, **kwargs: Any) -> Any:
            done = finish(*args, **kwargs)
            if done and kwargs.get("session_id"):
                self.mark(str(kwargs["session_id"]), "recorded")
            return done

        deps.ledger.rollouts.finish = finished
        publish = deps.publisher.publish

        def published(details: Any) -> None:
            publish(details)
            for detail in details:
                sid = getattr(detail, "session_id", None)
                if sid and hasattr(detail, "rollout_id"):
                    self.mark(str(sid), "published")

        deps.publisher.publish = published

    def report(self) -> list[str]:
        """p50/p95 of each stage and of written -> published, over the sessions that went through them all."""
        full = [t for t in self.at.values() if all(stage in t for stage in self.STAGES)]
        lines = [f"result -> event stages     over {len(full)} results (p50 / p95, ms)"]
        pairs = [*zip(self.STAGES, self.STAGES[1:], strict=False), ("written", "published")]
        names = {
            ("put_start", "written"): "S3 put (+ moto's S3 -> EB -> SQS)",
            ("written", "received"): "completion queue wait",
            ("received", "recorded"): "read result + terminal txn",
            ("recorded", "published"): "events built + PutEvents",
            ("written", "published"): "written -> published",
        }
        for a, b in pairs:
            values = [(t[b] - t[a]) * 1000 for t in full]
            lines.append(f"  {names[(a, b)]:34s} {percentile(values, 0.5):7.0f} / {percentile(values, 0.95):7.0f}")
        return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--endpoints", type=int, default=1)
    parser.add_argument("--session-rate", type=float, default=5.0, help="session_rate_limit (per endpoint)")
    parser.add_argument("--tps", type=int, default=25)
    parser.add_argument("--max-sessions", type=int, default=100)
    parser.add_argument("--active-quota", type=int, default=1000, help="the fake account's active sessions")
    parser.add_argument("--cold-start", type=float, default=0.05)
    parser.add_argument("--stop-fail", type=float, default=0.02)
    parser.add_argument("--dispatchers", type=int, default=2)
    parser.add_argument("--completers", type=int, default=3)
    parser.add_argument("--threads", type=int, default=5, help="threads per dispatcher/completer 'Lambda'")
    parser.add_argument("--wait", type=float, default=60.0, help="a dispatcher 'Lambda's wait budget (s)")
    parser.add_argument("--min-delay", type=float, default=1.0, help="agent time before the result (s)")
    parser.add_argument("--max-delay", type=float, default=4.0)
    parser.add_argument("--max-seconds", type=float, default=900.0)
    parser.add_argument("--queue-depth", type=int, default=150)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--one-lock",
        action="store_true",
        help="serialise EVERY moto request under one lock (the earlier harness) instead of DynamoDB's only, as local "
        "mode's server does (AWS services are independent: SQS, S3 and EventBridge do not queue behind DynamoDB)",
    )
    parser.add_argument(
        "--no-group-admission",
        action="store_true",
        help="order slot waiters only within each dispatcher process (no admission board): the before figure",
    )
    args = parser.parse_args(argv)
    _fake_aws_env()
    from moto import mock_aws

    _time_moto("inner")
    if args.one_lock:
        _atomic_moto()
    else:
        _serialise_dynamodb()
    _time_moto("outer")
    cheap_moto_transactions()
    atomic_moto_receives()
    with mock_aws():
        return run(args)


#: moto request time (s) and count: "inner" = moto's own processing, "outer" = with the wait for the lock that
#: serialises moto's backends (the difference is queueing for the one in-process "AWS"); "dynamodb" = DynamoDB's
#: requests' own processing (the serialised part unless `--one-lock`).
MOTO_TIME: dict[str, list[float]] = {"inner": [0.0, 0], "outer": [0.0, 0], "dynamodb": [0.0, 0]}


def _serialise_dynamodb() -> None:
    """As local mode's server: DynamoDB requests one at a time (`local.moto_server.serialised_dynamodb_requests`),
    other services concurrent (moto's SQS receives are made atomic by `local.moto_server.atomic_moto_receives`, part
    of `patch_moto`)."""
    from moto.core.botocore_stubber import BotocoreStubber

    from rollout_pipeline.local.moto_server import serialised_dynamodb_requests

    BotocoreStubber.process_request = serialised_dynamodb_requests(BotocoreStubber.process_request)  # type: ignore[method-assign]


def _time_moto(which: str) -> None:
    from moto.core.botocore_stubber import BotocoreStubber

    original = BotocoreStubber.process_request
    lock = threading.Lock()

    def timed(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(self, request, *args, **kwargs)
        finally:
            took = time.perf_counter() - started
            with lock:
                MOTO_TIME[which][0] += took
                MOTO_TIME[which][1] += 1
                if which == "inner" and is_dynamodb_request(request):
                    MOTO_TIME["dynamodb"][0] += took
                    MOTO_TIME["dynamodb"][1] += 1

    BotocoreStubber.process_request = timed  # type: ignore[method-assign]


def run(args: argparse.Namespace) -> int:  # noqa: C901 (one run's harness: its threads share the run's state through closures)
    from lambda_consumers import KeptMetrics, lambda_consumer, quiet_handlers

    from rollout_pipeline import ids
    from rollout_pipeline.adapters import clients
    from rollout_pipeline.adapters.s3 import S3ObjectStore
    from rollout_pipeline.config import ExperimentConfig
    from rollout_pipeline.fakes.acr import AcrProfile, AgentBehaviour, FakeAgentRuntime
    from rollout_pipeline.ledger.ledger import Ledger
    from rollout_pipeline.local.lambda_runtime import Schedule
    from rollout_pipeline.local.resources import create_resources
    from rollout_pipeline.metric_names import COLD_START_RETRIED, NOTIFICATION_LATENCY, STOP_FAILED

    quiet_handlers()
    import lambdas.completion
    import lambdas.dispatch
    import lambdas.sweeper

    clients.reset()
    group_size = args.group_size
    inputs = max(1, args.rollouts // group_size)
    total = inputs * group_size
    config = ExperimentConfig(
        name="bench",
        tps_limit=args.tps,
        session_rate_limit=args.session_rate,
        endpoints=args.endpoints,
        max_sessions=args.max_sessions,
        group_size=group_size,
        rollout_timeout_s=900,
    )
    resources = create_resources(config, region="us-east-1", client=clients.client)
    settings = resources.settings()
    rng = random.Random(args.seed)
    delays = [[rng.uniform(args.min_delay, args.max_delay) for _ in range(group_size)] for _ in range(inputs)]

    def behaviour(inv: Any) -> AgentBehaviour:
        rollout = inv.payload.get("_rollout") or {}
        row = int(str(rollout.get("input_id", "row-0")).split("-")[-1])
        return AgentBehaviour(rewards=1.0, delay_s=delays[row][int(rollout.get("index") or 0)])

    profile = AcrProfile.realistic(
        cold_start_share=args.cold_start,
        stop_failure_share=args.stop_fail,
        endpoints=args.endpoints,
        max_active_sessions=args.active_quota,
        seed=args.seed,
    )
    fake = FakeAgentRuntime(store=S3ObjectStore(), behaviour=behaviour, profile=profile)
    deps = lifecycle_deps(
        settings,
        fake,
        pooled=False,
        outbox_age_s=2.0,
        dispatch_threads=args.threads,
        group_admission=not args.no_group_admission,
        metrics=KeptMetrics(),
    )
    trace = StageTrace()
    trace.install(fake, deps)
    # Each dispatcher "Lambda" is its own process: its own slot gate and admission board entry (same ledger,
    # ports and metrics).
    dispatch_deps = [deps.for_another_process() for _ in range(args.dispatchers)]
    batch_id = "bench-000000000001"
    bodies = seed(resources, batch_id, inputs, group_size)
    sqs = clients.client("sqs")
    ledger = Ledger.open(settings.table_name)
    stop = threading.Event()
    group_done: dict[str, float] = {}

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

    started_wall = time.time()

    def trainer(event: dict[str, Any], _context: Any) -> dict[str, Any]:
        import json

        for record in event.get("Records") or []:
            detail = json.loads(record["body"])
            if detail.get("detail-type") == "Group Completed":
                group_done.setdefault(detail["detail"]["input_id"], time.time() - started_wall)
        return {}

    # Each dispatcher "Lambda" is its own process (its own deps: slot gate, admission board entry): one poller each.
    dispatchers = [
        lambda_consumer(
            f"dispatcher-{i}",
            resources.rollout_queue_url,
            lambdas.dispatch.function.bind(d),
            workers=1,
            wait_budget_s=args.wait,
        )
        for i, d in enumerate(dispatch_deps)
    ]
    others = [
        lambda_consumer(
            "completer",
            resources.completion_queue_url,
            lambdas.completion.function.bind(deps),
            workers=args.completers,
            wait_budget_s=30.0,
            idle_s=0.05,
        ),
        lambda_consumer("trainer", resources.trainer_queue_url, trainer, workers=1, wait_budget_s=1.0),
    ]
    sweeper = Schedule("sweeper", lambdas.sweeper.function.bind(deps), interval_s=3.0, timeout_s=25.0)
    feeder_thread = threading.Thread(target=feeder, daemon=True)
    print(
        f"bench: {total} rollouts ({inputs} groups x {group_size}), session_rate_limit={args.session_rate}/s x "
        f"{args.endpoints} endpoint(s), tps_limit={args.tps}, max_sessions={args.max_sessions}, "
        f"cold starts {args.cold_start:.0%}, failing stops {args.stop_fail:.0%}, agent {args.min_delay}-"
        f"{args.max_delay} s, group admission {'per process' if args.no_group_admission else 'across dispatchers'}",
        flush=True,
    )
    started = time.monotonic()
    feeder_thread.start()
    for consumer in (*dispatchers, *others):
        consumer.start()
    sweeper.start()
    terminal = 0
    last = started
    while time.monotonic() - started < args.max_seconds:
        terminal = view.terminal if (view := ledger.batches.read_batch(batch_id)) is not None else 0
        if terminal >= total:
            break
        if time.monotonic() - last > 20:
            last = time.monotonic()
            print(f"  {time.monotonic() - started:6.1f} s: {terminal}/{total} terminal", flush=True)
        time.sleep(0.5)
    elapsed = time.monotonic() - started
    for consumer in dispatchers:  # the backlog window is over: finish what runs, start nothing new
        consumer.stop(timeout=args.wait + 30)
    settle = time.monotonic() + 150  # running rollouts finish; failed stops are retried (backoff 2, 4, 8... s)
    while time.monotonic() < settle and ledger.limits.in_flight() > 0:
        time.sleep(1.0)
    stop.set()
    feeder_thread.join(timeout=15)
    for consumer in others:
        consumer.stop(timeout=15)
    sweeper.stop(timeout=15)
    fake.close()

    # ------------------------------------------------------------------------------------------------ report
    calls = list(fake.calls)
    new_sessions = [c for c in calls if c.op == "invoke" and c.outcome in ("started", "cold_start")]
    new_sessions = list({c.session_id: c for c in reversed(new_sessions)}.values())  # first call per session
    times = [c.at for c in new_sessions]
    per_endpoint = {e: [c.at for c in new_sessions if c.endpoint == e] for e in range(args.endpoints)}
    span = (max(times) - min(times)) if len(times) > 1 else 1.0
    throttles = Counter(c.outcome for c in calls if c.outcome in ("throttled", "quota_exceeded") and c.op == "invoke")
    stop_faults = Counter(c.outcome for c in calls if c.op == "stop" and c.outcome not in ("stopped", "unknown"))
    invoked = {c.session_id for c in calls if c.op == "invoke" and c.outcome not in ("throttled", "quota_exceeded")}
    never_stopped = sorted(invoked - fake.stopped)
    pending = ledger.limits.in_flight()
    deps.metrics.drain()
    assert isinstance(deps.metrics, KeptMetrics)
    counts, samples = deps.metrics.kept_counts, deps.metrics.kept_samples
    latency = samples.get(NOTIFICATION_LATENCY, [])
    actual = sorted(group_done.values())
    # The ideal schedule of as many groups as completed: the first ones, admitted whole and in order.
    ideal = ideal_group_schedule(delays[: max(1, len(actual))], args.session_rate * args.endpoints, args.max_sessions)
    limit = args.session_rate * args.endpoints
    print()
    terminal = view.terminal if (view := ledger.batches.read_batch(batch_id)) is not None else 0
    failed = sum(c.stats.failed + c.stats.handler_errors for c in (*dispatchers, *others))
    print(f"terminal rollouts          {terminal}/{total} (backlog window {elapsed:.1f} s); errors {failed}")
    print(
        f"new sessions per second    busiest sliding 1-s window {busiest_window(times)} / limit "
        f"{limit:g} ({args.session_rate:g} x {args.endpoints}); mean {len(times) / span:.2f}/s over {span:.0f} s"
    )
    for endpoint, at in per_endpoint.items():
        print(f"  endpoint {endpoint} ({ids.endpoint_name(endpoint)}) busiest {busiest_window(at)}, {len(at)} sessions")
    # The `tps` budget's use: how saturated the call budget was (a pacer starts at most limit / (1 + LATENESS_S)).
    data_plane = [c.at for c in calls if c.op in ("invoke", "stop")]
    paced_max = args.tps / (1 + LATENESS_S)
    print(
        f"ACR calls per second       busiest sliding 1-s window {busiest_window(data_plane)} / tps_limit {args.tps}; "
        f"mean {len(data_plane) / span:.2f}/s = {len(data_plane) / span / paced_max:.0%} of the paced maximum"
    )
    print(f"ACR throttles received     {sum(throttles.values())} {dict(throttles)}")
    print(
        f"active sessions at peak    {fake.max_active} / max_sessions {args.max_sessions} / account quota "
        f"{args.active_quota}"
    )
    print(
        f"cold starts                {sum(1 for c in calls if c.outcome == 'cold_start')} answered 424, "
        f"{counts.get(COLD_START_RETRIED, 0)} retries on the same session"
    )
    print(f"failed stops               {dict(stop_faults)}; StopFailed metric {counts.get(STOP_FAILED, 0)}")
    print(f"stops pending at the end   {pending} (session slots still held)")
    print(f"sessions never stopped     {len(never_stopped)}")
    print(
        f"result -> event            p50 {percentile(latency, 0.5):.0f} ms, p95 {percentile(latency, 0.95):.0f} ms "
        "(the NotificationLatency metric: from the S3 event's time, which has one-second resolution)"
    )
    for line in trace.report():
        print(line)
    (inner_s, n), (outer_s, _n) = MOTO_TIME["inner"], MOTO_TIME["outer"]
    ddb_s, ddb_n = MOTO_TIME["dynamodb"]
    wall = time.monotonic() - started
    serialised = ("every request under one lock", inner_s) if args.one_lock else ("DynamoDB serialised", ddb_s)
    print(
        f"moto (the in-process AWS) {n} requests ({ddb_n} DynamoDB), {serialised[0]}: processing "
        f"{1000 * inner_s / max(n, 1):.1f} ms each, {1000 * outer_s / max(n, 1):.1f} ms with the wait for the lock; "
        f"the lock busy {serialised[1] / wall:.0%} of {wall:.0f} s"
    )
    if actual:
        print(
            f"first Group Completed      {actual[0]:.1f} s (ideal group-ordered {min(ideal):.1f} s); "
            f"mean group completion {statistics.fmean(actual):.1f} s (ideal {statistics.fmean(ideal):.1f} s); "
            f"{len(actual)}/{inputs} groups"
        )
        # Order: each group's rank by completion time vs its line (0 = exactly in submission order).
        ranks = sorted(group_done, key=lambda g: group_done[g])
        shift = [abs(rank - int(g.rsplit("-", 1)[-1])) for rank, g in enumerate(ranks)]
        print(
            f"  completion order vs submission order: mean displacement {statistics.fmean(shift):.1f} places, "
            f"max {max(shift)}"
        )
        # The same ideal at the session rate this run achieved: what is left is ordering, not throughput.
        achieved = len(times) / span
        at_rate = ideal_group_schedule(delays[: len(actual)], max(achieved, 1e-3), args.max_sessions)
        print(
            f"  ideal at the achieved {achieved:.2f} sessions/s: first {min(at_rate):.1f} s, "
            f"mean {statistics.fmean(at_rate):.1f} s"
        )
    ok = not never_stopped and pending == 0 and busiest_window(times) <= limit
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
