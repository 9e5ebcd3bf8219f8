"""Measure the ledger's ceiling: the real dispatch and completion code at AgentCore's own rates, under a dilated clock.

Why dilation: moto costs 1-2 ms per request in process (far more on a loaded machine) and serialises DynamoDB, so
two shared cores cannot run the lifecycle at 24 new sessions/s in wall-clock time. Instead the whole process runs
on a clock k times slower than the wall clock (`DilatedClock`): `time.time`, `time.monotonic` and `time.sleep` and
the pipeline's `utcnow` are replaced before the pipeline is imported, so ONE virtual second lasts k wall seconds.
Every rate the pipeline and the fake AgentCore enforce (`session_rate_limit`, `tps_limit`, the fake ACR's quotas,
the faithful profile's hot-item window) is then k times slower in wall time, every hold, latency, poll interval,
heartbeat, settle time and agent delay k times longer, while moto's own processing and the Python code's CPU
time shrink k times in virtual time. Realistic DynamoDB latencies are injected (a botocore `after-call` hook sleeps
a sampled latency, in virtual time) and the faithful conflict model holds each transaction's items for its
`hold_ms` (virtual), so conflicts per rollout at 24 virtual sessions/s mean what they would at 24/s on AWS.

What is NOT dilated (wall clock): lock, Event and Condition timeouts (they only bound waits that a notify ends; a
timeout k times shorter in virtual time means more wake-ups, not more requests); moto's own clock (SQS visibility
timeouts: the harness receives with the visibility timeout multiplied by k; message delays are not used on these
paths); `threading.Timer` (the agent's delay is given to it multiplied by k); and the machine's scheduling
lateness, which shrinks k times in virtual time (a thread late by 50 ms wall is 10 ms late at k = 5).

What runs: in-process moto (DynamoDB serialised as local mode's server does, other services concurrent), the
faithful profile (transaction holds: TransactionConflict on plain writes and other transactions touching a held
item), the fake ACR's realistic profile (400 new sessions/min per endpoint, 25/s per account, cold starts, failing
stops), a feeder that keeps the rollout queue shallow and may shuffle it (`--shuffle`, as SQS standard queues and
several Lambdas receiving interleaved slices do), dispatcher and completer threads playing Lambdas (the real
`dispatch_records` / `complete_records`), a sweeper every minute (the stack's schedule), and a trainer draining
its queue for `Group Completed`.

Printed (or `--json`): new sessions/s sustained vs configured and every sliding second vs each budget, ACR
throttles, peak sessions vs `max_sessions`; DynamoDB requests per rollout by operation, by ledger item and by stage
(counted by a botocore hook); conflict retries per rollout; the busiest ledger item's transactions/s and hold
fraction; first / mean group completion vs the ideal group-ordered schedule; the machine's load and the clock's
lateness, which say how far to trust the run.

Usage: python bench/bench_scale.py [--dilation 10] [--endpoints 4] [--session-rate 6] [--rollouts 480]
       [--max-sessions 200] [--shuffle] [--window N] [--max-seconds 600] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
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
from harness import (  # noqa: E402  (the dilated-clock harness: docs/benchmarks.md, "Scale")
    _REAL_MONOTONIC,
    _REAL_SLEEP,
    PRICE_PER_MILLION,
    Counters,
    DilatedClock,
    LatenessProbe,
    Rig,
    RigOptions,
    TransactionLog,
    all_in_extras,
    aws_sandbox,
    explain_unstopped,
    install_latency,
    lifecycle_deps,
    pct,
    sliding_max,
    slot_phase,
    slot_turnover,
    steady_rate,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dilation", type=float, default=10.0, help="k: one virtual second lasts k wall seconds")
    parser.add_argument("--endpoints", type=int, default=4)
    parser.add_argument("--session-rate", type=float, default=6.0, help="session_rate_limit per endpoint (virtual)")
    parser.add_argument("--tps", type=int, default=50, help="tps_limit (virtual)")
    parser.add_argument("--max-sessions", type=int, default=200)
    parser.add_argument(
        "--account-quota", type=float, default=25.0, help="the fake's new sessions/s per account (raise: ceiling runs)"
    )
    parser.add_argument("--rollouts", type=int, default=480)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--shuffle", action="store_true", help="the rollout queue delivers in a shuffled order")
    parser.add_argument("--shuffle-window", type=int, default=0, help="shuffle within windows of N (0: the whole)")
    parser.add_argument(
        "--dispatchers", type=int, default=5, help="dispatcher 'Lambdas' (the stack: dispatch_concurrency 5)"
    )
    parser.add_argument("--completers", type=int, default=3)
    parser.add_argument("--threads", type=int, default=10, help="threads per dispatcher/completer 'Lambda'")
    parser.add_argument("--wait", type=float, default=60.0, help="a dispatcher 'Lambda's wait budget (virtual s)")
    parser.add_argument("--min-delay", type=float, default=2.0, help="agent time before the result (virtual s)")
    parser.add_argument("--max-delay", type=float, default=6.0)
    parser.add_argument("--cold-start", type=float, default=0.05)
    parser.add_argument("--stop-fail", type=float, default=0.02)
    parser.add_argument("--hold-ms", type=float, default=15.0, help="faithful: a transaction holds its items (ms)")
    parser.add_argument("--conflict-rate", type=float, default=0.0, help="faithful: hot-item conflict probability")
    parser.add_argument("--no-latency", action="store_true", help="inject no DynamoDB latency")
    parser.add_argument("--queue-depth", type=int, default=150, help="messages the feeder keeps in the queue at most")
    parser.add_argument(
        "--window",
        type=int,
        default=None,
        help="release window (rollouts released and not yet terminal; default max_sessions + 10 x dispatchers); "
        "0: every message at once (before the window)",
    )
    parser.add_argument("--max-seconds", type=float, default=600.0, help="WALL seconds for the backlog (bounded)")
    parser.add_argument(
        "--poll-s",
        default="",
        help="LO:HI: the slot gate's poll interval (jittered, virtual s; default the pipeline's 0.2:1.0)",
    )
    parser.add_argument(
        "--settle-s",
        type=float,
        default=None,
        help="the board's burst settle time (virtual s; default the pipeline's 1)",
    )
    parser.add_argument(
        "--lead-poll-s",
        default="",
        help="LO:HI: the slot gate's poll interval while its waiters lead the board (virtual s; default the "
        "pipeline's `limits.LEAD_POLL_S`)",
    )
    parser.add_argument(
        "--lead-ranks", type=int, default=None, help="`limits.LEAD_RANKS` (0: no lead pace, every poll 0.2-1 s)"
    )
    parser.add_argument(
        "--pool",
        action="store_true",
        help="lease the experiment's limits from an account pool (what a deployed stack does: --session-rate and "
        "--tps are then caps, endpoints add no rate); default: its own limits (the ledger's ceiling, "
        "docs/benchmarks.md 'Scale')",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the text report")
    parser.add_argument("--json-out", default="", help="also write the JSON object to this file (long runs)")
    args = parser.parse_args(argv)
    if not 1 <= args.rollouts <= 20_000:
        parser.error("--rollouts must be within 1..20000")
    if not 1 <= args.dilation <= 100 or args.max_seconds > 7200:
        parser.error("--dilation within 1..100 and --max-seconds at most 7200")

    clock = DilatedClock(args.dilation)
    clock.install()  # before anything imports the pipeline

    with aws_sandbox(seed=args.seed, hold_ms=args.hold_ms, conflict_rate=args.conflict_rate) as profile:
        result = run(args, clock, profile)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1, sort_keys=True))
    if args.json:
        print(json.dumps(result, indent=1, sort_keys=True))
    else:
        print_report(result)
    return 0 if result["ok"] else 1


def run(args: argparse.Namespace, clock: DilatedClock, profile: Any) -> dict[str, Any]:  # noqa: C901 (one run's harness)
    from bench_acr_quotas import MOTO_TIME, ideal_group_schedule

    from rollout_pipeline.adapters import clients
    from rollout_pipeline.adapters.s3 import S3ObjectStore
    from rollout_pipeline.config import ExperimentConfig
    from rollout_pipeline.fakes.acr import AcrProfile, AgentBehaviour, FakeAgentRuntime
    from rollout_pipeline.feed.window import window_size
    from rollout_pipeline.ledger import retry
    from rollout_pipeline.ledger.ledger import Ledger
    from rollout_pipeline.lifecycle.deps import LifecycleDeps
    from rollout_pipeline.local.resources import create_resources

    if args.poll_s:
        from rollout_pipeline.limits import admission as limits

        lo, hi = (float(x) for x in args.poll_s.split(":"))
        limits.jitter_poll_s = lambda: random.uniform(lo, hi)  # type: ignore[assignment]
    if args.settle_s is not None:
        from rollout_pipeline.limits import admission as limits

        limits.BOARD_SETTLE_S = args.settle_s  # type: ignore[misc]
    if args.lead_poll_s or args.lead_ranks is not None:
        from rollout_pipeline.limits import admission as limits

        if args.lead_poll_s:
            limits.LEAD_POLL_S = tuple(float(x) for x in args.lead_poll_s.split(":"))  # type: ignore[misc]
        if args.lead_ranks is not None:
            limits.LEAD_RANKS = args.lead_ranks  # type: ignore[misc]
    load_start = os.getloadavg()
    clients.reset()
    counters = Counters()
    clients.register_hook("before-parameter-build", counters.before_build)
    if not args.no_latency:
        install_latency(clients, random.Random(args.seed + 7))

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
        release_window=args.window,
        dispatch_concurrency=max(2, args.dispatchers),
    )
    # The ledger's ceiling: the experiment on its own limits (no account pool); `--pool`: leased from one.
    resources = create_resources(config, region="us-east-1", client=clients.client, pool=args.pool)
    rng = random.Random(args.seed)
    delays = [[rng.uniform(args.min_delay, args.max_delay) for _ in range(group_size)] for _ in range(inputs)]

    session_delay: dict[str, float] = {}  # session -> its agent delay (virtual s): where slot turnover goes

    def behaviour(inv: Any) -> AgentBehaviour:
        rollout = inv.payload.get("_rollout") or {}
        row = int(str(rollout.get("input_id", "row-0")).split("-")[-1])
        session_delay[inv.session_id] = delays[row][int(rollout.get("index") or 0)]
        # threading.Timer runs on the wall clock: the virtual delay lasts k times longer in wall time.
        return AgentBehaviour(rewards=1.0, delay_s=clock.wall_s(session_delay[inv.session_id]))

    acr = AcrProfile.realistic(
        cold_start_share=args.cold_start,
        stop_failure_share=args.stop_fail,
        endpoints=args.endpoints,
        max_active_sessions=max(1000, 2 * args.max_sessions),
        account_new_sessions_per_s=args.account_quota,
        # Without the pool, also AgentCore's per-endpoint quota of the time (400/min); with it, the account's only.
        new_sessions_per_minute=None if args.pool else 400.0,
        seed=args.seed,
    )
    fake = FakeAgentRuntime(store=S3ObjectStore(), behaviour=behaviour, profile=acr)

    def make_deps(settings: Any) -> LifecycleDeps:
        return lifecycle_deps(settings, fake, dispatch_threads=args.threads)

    stop = threading.Event()
    stop_dispatch = threading.Event()
    errors: list[str] = []
    options = RigOptions(
        dispatchers=args.dispatchers,
        completers=args.completers,
        threads=args.threads,
        wait_s=args.wait,
        queue_depth=args.queue_depth,
        shuffle=args.shuffle,
        shuffle_window=args.shuffle_window,
        seed=args.seed,
    )
    rig = Rig(resources, make_deps, counters, clock, options, stop=stop, stop_dispatch=stop_dispatch, errors=errors)
    dispatch_deps, group_done = rig.dispatch_deps, rig.group_done
    batch_id = "bench-000000000001"
    bodies = rig.seed(batch_id, inputs, group_size)
    window = window_size(config)
    if window:
        bodies = []  # released by the window, as ingestion does (`ingest.core`): pending groups, then a release
    if args.shuffle and args.shuffle_window:
        for start in range(0, len(bodies), args.shuffle_window):
            part = bodies[start : start + args.shuffle_window]
            rig.shuffler.shuffle(part)
            bodies[start : start + args.shuffle_window] = part
    rig.pool.extend(bodies)  # before the window: every message at once
    ledger = Ledger.open(rig.settings.table_name)
    retry.stats.plain = retry.stats.transactions = 0
    profile.plain_writes.clear()
    profile.transaction_writes.clear()
    profile.stats.plain_conflicts = profile.stats.transaction_conflicts = 0
    log = TransactionLog(profile)
    tx_times, conflicts_by_item = log.tx_times, log.conflicts_by_item

    probe = LatenessProbe()
    threads = rig.threads(releasing=lambda: rig.release(batch_id) if window else None)
    threads.append(threading.Thread(target=probe.run, name="bench-probe", daemon=True))
    if not args.json:
        print(
            f"bench_scale: k={args.dilation:g}, {total} rollouts ({inputs} groups x {group_size}"
            f"{', shuffled' if args.shuffle else ''}; release window {window or 'off'}), {args.endpoints} endpoint(s) "
            f"x {args.session_rate:g} "
            f"sessions/s, tps {args.tps}, max_sessions {args.max_sessions}, agent {args.min_delay}-{args.max_delay} "
            f"s, {args.dispatchers} dispatchers x {args.threads} threads; load {load_start[0]:.1f}",
            flush=True,
        )
    started_wall = _REAL_MONOTONIC()
    started = time.monotonic()
    started_at = time.time()
    for t in threads:
        t.start()
    terminal, last = 0, started_wall
    peak_threads, peak_load = threading.active_count(), load_start[0]  # what grows with the run's size
    while _REAL_MONOTONIC() - started_wall < args.max_seconds:
        peak_threads, peak_load = max(peak_threads, threading.active_count()), max(peak_load, os.getloadavg()[0])
        counters.harness.on = True
        terminal = view.terminal if (view := ledger.batches.read_batch(batch_id)) is not None else 0
        counters.harness.on = False
        if terminal >= total:
            break
        if _REAL_MONOTONIC() - last > 30 and not args.json:
            last = _REAL_MONOTONIC()
            print(
                f"  {_REAL_MONOTONIC() - started_wall:6.0f} s wall: {terminal}/{total} terminal, "
                f"{len(fake.running)} sessions running, {threading.active_count()} threads",
                flush=True,
            )
        _REAL_SLEEP(1.0)
    backlog_virtual = time.monotonic() - started
    stop_dispatch.set()
    joined_by = _REAL_MONOTONIC() + min(clock.wall_s(args.wait), 120.0) + 10  # bounded whatever k is
    for t in threads:
        if t.name.startswith("lc-dispatcher"):
            t.join(timeout=max(0.0, joined_by - _REAL_MONOTONIC()))
    settle = _REAL_MONOTONIC() + 60  # running rollouts finish, stops are retried (bounded)
    counters.harness.on = True
    while _REAL_MONOTONIC() < settle and ledger.limits.in_flight() > 0:
        _REAL_SLEEP(1.0)
    terminal = view.terminal if (view := ledger.batches.read_batch(batch_id)) is not None else 0
    pending = ledger.limits.in_flight()
    counters.harness.on = False
    stop.set()
    probe.stop.set()
    for t in threads:
        t.join(timeout=15)
    fake.close()
    wall_s = _REAL_MONOTONIC() - started_wall
    virtual_s = time.monotonic() - started

    # -------------------------------------------------------------------------------------------------- figures
    calls = list(fake.calls)
    firsts = [c for c in calls if c.op == "invoke" and c.outcome in ("started", "cold_start")]
    firsts = list({c.session_id: c for c in reversed(firsts)}.values())
    times = [c.at for c in firsts]
    configured = args.session_rate * args.endpoints
    # What the slots allow: max_sessions sessions each busy for an agent delay (mean), if that binds before the rate.
    slot_bound = args.max_sessions / statistics.fmean(d for group in delays for d in group)
    bound = min(configured, slot_bound)
    binding = slot_phase(calls, args.max_sessions)
    per_endpoint = {e: sliding_max([c.at for c in firsts if c.endpoint == e]) for e in range(args.endpoints)}
    throttles = Counter(c.outcome for c in calls if c.op == "invoke" and c.outcome in ("throttled", "quota_exceeded"))
    # The realistic profile's failing stops (NotFound, Conflict, throttling in equal parts) are injected faults.
    stop_faults = Counter(c.outcome for c in calls if c.op == "stop" and c.outcome not in ("stopped", "unknown"))
    data_plane = [c.at for c in calls if c.op in ("invoke", "stop")]
    # Each refused invoke with what its endpoint had started in the second before (is it the pipeline or the fake?).
    refused = [
        {
            "at_s": c.at - min(times, default=c.at),
            "outcome": c.outcome,
            "endpoint": c.endpoint,
            "endpoint_sessions_in_previous_s": sum(
                1 for f in firsts if f.endpoint == c.endpoint and 0 <= c.at - f.at < 1
            ),
            "data_plane_calls_in_previous_s": sum(1 for at in data_plane if 0 <= c.at - at < 1),
        }
        for c in calls
        if c.op == "invoke" and c.outcome in ("throttled", "quota_exceeded")
    ][:10]
    invoked = {c.session_id for c in calls if c.op == "invoke" and c.outcome not in ("throttled", "quota_exceeded")}
    never_stopped = len(invoked - fake.stopped)
    counters.harness.on = True
    unstopped = explain_unstopped(sorted(invoked - fake.stopped), calls, ledger, batch_id, fake, min(times, default=0))
    counters.harness.on = False
    n = max(terminal, 1)
    # Hot items: transactions and plain writes per virtual second over the busy period, hold fraction.
    busy_s = (max(times) - min(times)) if len(times) > 1 else max(backlog_virtual, 1e-9)
    busy_s = max(busy_s, 1e-9)
    items = []
    for item, tx in (profile.transaction_writes + Counter()).most_common(6):
        key = json.loads(item)
        items.append(
            {
                "item": f"{key['pk']['S'][:20]}/{key['sk']['S'][:30]}",
                "transactions_per_s": tx / busy_s,
                "plain_writes_per_s": profile.plain_writes[item] / busy_s,
                "hold_fraction": min(1.0, tx * args.hold_ms / 1000 / busy_s),
                "busiest_second_transactions": sliding_max(tx_times.get(item, [])),
            }
        )
    plain_hot = [
        {"item": f"{json.loads(i)['pk']['S'][:20]}/{json.loads(i)['sk']['S'][:30]}", "writes_per_s": c / busy_s}
        for i, c in profile.plain_writes.most_common(4)
    ]
    order: dict[str, Any] = {}
    done_at = sorted(t - started_at for t in group_done.values())
    if done_at:
        ideal = ideal_group_schedule(delays[: len(done_at)], configured, args.max_sessions)
        achieved = steady_rate(times) if len(times) >= 10 else configured
        at_rate = ideal_group_schedule(
            delays[: len(done_at)], achieved if achieved == achieved else configured, args.max_sessions
        )
        ranks = sorted(group_done, key=lambda g: group_done[g])
        shift = [abs(rank - int(g.rsplit("-", 1)[-1])) for rank, g in enumerate(ranks)]
        order = {
            "groups_completed": len(done_at),
            "groups": inputs,
            "first_s": done_at[0],
            "first_ideal_s": min(ideal),
            "first_ratio": done_at[0] / min(ideal),
            "mean_s": statistics.fmean(done_at),
            "mean_ideal_s": statistics.fmean(ideal),
            "mean_ratio": statistics.fmean(done_at) / statistics.fmean(ideal),
            "first_ratio_at_achieved_rate": done_at[0] / min(at_rate),
            "mean_ratio_at_achieved_rate": statistics.fmean(done_at) / statistics.fmean(at_rate),
            "mean_displacement": statistics.fmean(shift),
            "first_session_s": min(times) - started_at if times else float("nan"),
            **slot_turnover(calls, session_delay, args.max_sessions),
            "gate_polls": sum(d.limits.gate.polls for d in dispatch_deps),
            "gate_lead_pace_polls": sum(d.limits.gate.lead_polls for d in dispatch_deps),
        }
    ddb_total = sum(counters.ops.values())
    sqs_requests = sum(v for k, v in counters.other.items() if k.startswith("sqs."))
    s3_get = sum(v for k, v in counters.other.items() if k in ("s3.GetObject", "s3.HeadObject"))
    cost = {
        "dynamodb": (counters.wru * PRICE_PER_MILLION["WRU"] + counters.rru * PRICE_PER_MILLION["RRU"]) / n,
        "sqs_sends_by_pipeline": sqs_requests * PRICE_PER_MILLION["sqs"] / n,
        "s3_reads": s3_get * PRICE_PER_MILLION["s3_get"] / n,
        "eventbridge_events": counters.event_entries * PRICE_PER_MILLION["event"] / n,
    }
    cost |= all_in_extras(counters, n)
    moto_ddb_s = MOTO_TIME["dynamodb"][0]
    steady = steady_rate(times)
    result: dict[str, Any] = {
        "config": {
            **{k: v for k, v in vars(args).items() if k not in ("json", "json_out")},
            "configured_sessions_per_s": configured,
            "total": total,
        },
        "machine": {
            "load_start": load_start,
            "load_end": os.getloadavg(),
            "load_peak": peak_load,
            "peak_threads": peak_threads,
            "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "cpus": os.cpu_count(),
            "wall_s": wall_s,
            "virtual_s": virtual_s,
            "backlog_virtual_s": backlog_virtual,
            "clock_lateness_ms_p50": pct(probe.late_ms, 0.5),
            "clock_lateness_ms_p95": pct(probe.late_ms, 0.95),
            "moto_dynamodb_lock_busy": moto_ddb_s / max(wall_s, 1e-9),
            "moto_dynamodb_ms_per_request_wall": 1000 * moto_ddb_s / max(MOTO_TIME["dynamodb"][1], 1),
        },
        "terminal": terminal,
        "errors": len(errors),
        "first_errors": errors[:3],
        "throughput": {
            "sessions": len(times),
            "steady_sessions_per_s": steady,
            "steady_vs_configured": steady / configured if steady == steady else float("nan"),
            "bound_sessions_per_s": bound,
            "steady_vs_bound": steady / bound if steady == steady else float("nan"),
            "mean_sessions_per_s": len(times) / busy_s,
            "busiest_sliding_second": sliding_max(times),
            "busiest_sliding_second_per_endpoint": per_endpoint,
            "every_second_within_budget": all(v <= args.session_rate for v in per_endpoint.values())
            and sliding_max(times) <= configured,
            "busiest_acr_calls_second": sliding_max(data_plane),
            "acr_throttles": dict(throttles),
            "injected_stop_faults": dict(stop_faults),
            "refused_invokes": refused,
            "peak_running": fake.max_running,
            "peak_active": fake.max_active,
            "slots_binding": binding,
            "max_sessions": args.max_sessions,
            "stops_pending": pending,
            "never_stopped": never_stopped,
            "never_stopped_sessions": unstopped,
        },
        "requests_per_rollout": {
            "dynamodb": ddb_total / n,
            "by_operation": {k: v / n for k, v in counters.ops.most_common()},
            "by_item": {k: v / n for k, v in counters.items.most_common()},
            "by_stage": {k: v / n for k, v in counters.stages.most_common()},
            "other_services": {k: v / n for k, v in counters.other.most_common()},
        },
        "request_units_per_rollout": {
            "wru": counters.wru / n,
            "rru": counters.rru / n,
            "wru_by_item": {k: v / n for k, v in counters.wru_items.most_common()},
            "units_by_caller": {k: v / n for k, v in counters.units_by_caller.most_common()},
        },
        "contention": {
            "conflict_retries_per_rollout": retry.stats.total / n,
            "retried_plain": retry.stats.plain,
            "retried_transactions": retry.stats.transactions,
            "conflicts_by_item": dict(conflicts_by_item.most_common()),
            "injected_plain_conflicts": profile.stats.plain_conflicts,
            "injected_transaction_conflicts": profile.stats.transaction_conflicts,
            "injected_conflicts_per_rollout": (profile.stats.plain_conflicts + profile.stats.transaction_conflicts) / n,
            "busiest_items": items,
            "busiest_plain_write_items": plain_hot,
        },
        "order": order,
        "cost_per_million_rollouts_usd": {**cost, "total_aws_side": sum(cost.values())},
    }
    result["ok"] = bool(
        terminal == total
        and result["throughput"]["every_second_within_budget"]
        and fake.max_running <= args.max_sessions
    )
    return result


def print_report(r: dict[str, Any]) -> None:
    c, m, t, q, h = r["config"], r["machine"], r["throughput"], r["requests_per_rollout"], r["contention"]
    print()
    print(
        f"machine                    load {m['load_start'][0]:.1f} -> {m['load_end'][0]:.1f} (peak "
        f"{m.get('load_peak', float('nan')):.1f}) on {m['cpus']} CPUs; {m.get('peak_threads', 0)} threads at "
        f"most, {m.get('max_rss_mb', 0):.0f} MB RSS; "
        f"{m['wall_s']:.0f} s wall = {m['virtual_s']:.1f} s virtual (k={c['dilation']:g}); clock lateness p50 "
        f"{m['clock_lateness_ms_p50']:.1f} / p95 {m['clock_lateness_ms_p95']:.1f} ms virtual; moto DynamoDB lock "
        f"busy {m['moto_dynamodb_lock_busy']:.0%} ({m['moto_dynamodb_ms_per_request_wall']:.1f} ms wall/request)"
    )
    print(f"terminal rollouts          {r['terminal']}/{c['total']}; errors {r['errors']} {r['first_errors'][:1]}")
    print(
        f"new sessions/s             steady {t['steady_sessions_per_s']:.2f} = {t['steady_vs_configured']:.0%} of "
        f"{c['configured_sessions_per_s']:g} configured (mean {t['mean_sessions_per_s']:.2f}); busiest sliding "
        f"second {t['busiest_sliding_second']} (per endpoint {t['busiest_sliding_second_per_endpoint']}, budget "
        f"{c['session_rate']:g}); within budget: {t['every_second_within_budget']}"
    )
    if "bound_sessions_per_s" in t and t["bound_sessions_per_s"] < c["configured_sessions_per_s"]:
        print(
            f"  max_sessions binds: at most {t['bound_sessions_per_s']:.2f}/s (slots / mean agent delay); steady is "
            f"{t['steady_vs_bound']:.0%} of it"
        )
    b = t.get("slots_binding") or {}
    if b:
        print(
            f"  once the slots bind      from {b['from_s']:.1f} s (running >= 95% of max_sessions) to the last new "
            f"session at {b['to_s']:.1f} s: {b['new_sessions_per_s']:.2f} new sessions/s; running mean "
            f"{b['mean_running']:.0f} ({b['mean_running_vs_max_sessions']:.1%} of max_sessions), min {b['min_running']}"
        )
    print(
        f"ACR                        invoke throttles {t['acr_throttles'] or 0} (injected stop faults "
        f"{t.get('injected_stop_faults') or 0}); busiest second "
        f"{t['busiest_acr_calls_second']} calls / tps {c['tps']}; peak running {t['peak_running']} "
        f"(active {t['peak_active']}) / max_sessions "
        f"{t['max_sessions']}; stops pending {t['stops_pending']}, never stopped {t['never_stopped']}"
    )
    for u in t.get("never_stopped_sessions") or []:
        print(f"  never stopped {u['session_id']} (attempt {u['session_attempt']}): ledger {u['ledger']}")
        print(f"    calls {u['calls']}")
    print(f"DynamoDB requests/rollout  {q['dynamodb']:.1f}")
    for title, table in (("by operation", "by_operation"), ("by item", "by_item"), ("by stage", "by_stage")):
        print(f"  {title:<12} " + ", ".join(f"{k} {v:.2f}" for k, v in q[table].items()))
    print("  other AWS    " + ", ".join(f"{k} {v:.2f}" for k, v in q["other_services"].items()))
    u = r.get("request_units_per_rollout")
    if u:
        print(f"request units/rollout     WRU {u['wru']:.2f}, RRU {u['rru']:.2f}")
        print("  WRU by item  " + ", ".join(f"{k} {v:.2f}" for k, v in u["wru_by_item"].items()))
        print("  by caller    " + ", ".join(f"{k} {v:.2f}" for k, v in u["units_by_caller"].items() if v >= 0.01))
    print(
        f"conflict retries/rollout   {h['conflict_retries_per_rollout']:.2f} ({h['retried_plain']} plain, "
        f"{h['retried_transactions']} transactions); injected conflicts/rollout "
        f"{h['injected_conflicts_per_rollout']:.2f}"
    )
    print("  met on       " + ", ".join(f"{k} {v}" for k, v in h["conflicts_by_item"].items()))
    print(
        "busiest ledger items       transactions/s, plain writes/s, hold fraction, transactions in the busiest second"
    )
    for item in h["busiest_items"]:
        print(
            f"  {item['item']:<46} {item['transactions_per_s']:6.2f} {item['plain_writes_per_s']:6.2f} "
            f"{item['hold_fraction']:6.1%} {item.get('busiest_second_transactions', '')}"
        )
    print(
        "  plain writes: " + ", ".join(f"{i['item']} {i['writes_per_s']:.2f}/s" for i in h["busiest_plain_write_items"])
    )
    o = r["order"]
    if o:
        print(
            f"group order                first {o['first_s']:.1f} s vs ideal {o['first_ideal_s']:.1f} s "
            f"({o['first_ratio']:.2f}x); mean {o['mean_s']:.1f} s vs {o['mean_ideal_s']:.1f} s "
            f"({o['mean_ratio']:.2f}x); at the achieved rate {o['first_ratio_at_achieved_rate']:.2f}x / "
            f"{o['mean_ratio_at_achieved_rate']:.2f}x; {o['groups_completed']}/{o['groups']} groups, mean "
            f"displacement {o['mean_displacement']:.1f}; first session at "
            f"{o.get('first_session_s', float('nan')):.1f} s; slot turnover (medians): agent end -> stop "
            f"{o.get('agent_end_to_stop_s_median', float('nan')):.2f} s, stop -> next session "
            f"{o.get('stop_to_next_session_s_median', float('nan')):.2f} s; slot gate polls {o.get('gate_polls')} "
            f"(at the lead pace {o.get('gate_lead_pace_polls')})"
        )
    cost = r["cost_per_million_rollouts_usd"]
    print("cost per million rollouts  " + ", ".join(f"{k} ${v:.2f}" for k, v in cost.items()))
    print(f"ok                         {r['ok']}")


if __name__ == "__main__":
    raise SystemExit(main())
