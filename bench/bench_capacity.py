"""Several experiments on ONE AgentCore account: the account pool's shares, its reserve and backoff, side by side with
each experiment on its own limits (`--before`, how every experiment ran before the pool).

On the dilated-clock harness of `bench_scale.py` (`harness.py`: one virtual second lasts k wall seconds; injected
DynamoDB latencies, the faithful profile's transaction holds), every experiment has its own resources in one
in-process moto and its own Lambdas (`harness.Rig`: dispatchers, completers, the sweeper, a trainer, all running the
pipeline's real handlers), and all of them call ONE fake AgentCore account (`AcrProfile.realistic`: new sessions
25/s per account over any sliding second, data plane 1,000/s, 5,000 active sessions, cold starts, failing stops).

The default run: experiments of weights 1, 1, 2 with a backlog each (`--rollouts` per experiment), all leasing from
one account pool (10% reserve). Halfway, the first experiment has no work for `--idle-s` (its feed stops, then
resumes): the others take its share and give it back (`rebalance_s`). `--outside` instead starts an outside consumer
(`--outside-rate` new sessions/s, more than the reserve) halfway for `--outside-s`: the pipeline backs off and climbs
back when it stops. `--before` then runs the same experiments as before the pool: each on its own limits, set the
way docs/deploy.md recommended to reach the quota (4 endpoints x 6/s, `tps_limit` 50).

Printed (`--json`: one object with `after` and, with `--before`, `before`): throttles_pipeline (AgentCore's refusals
of the pipeline's invokes), throttles_outside, share_error_max (the largest relative gap between an experiment's
share of new sessions and its weighted share, over 10 s windows while all are backlogged), pool_use (the pipeline's
new sessions/s over the pool less the reserve, while all are backlogged), rebalance_s, backoff_s and climb_back_s
(`--outside`), requests_per_rollout (DynamoDB, every experiment's and the pool's), conflict_retries_per_rollout,
sessions_never_stopped, every sliding second against each budget, the pool item's writes/s, and how far to trust the
run (load, the clock's lateness, moto's lock).

Usage: python bench/bench_capacity.py [--weights 1,1,2] [--rollouts 400] [--dilation 8] [--outside] [--before]
       [--outside-s 20] [--json] [--max-seconds 560]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from harness import (  # noqa: E402
    _REAL_MONOTONIC,
    _REAL_SLEEP,
    Counters,
    DilatedClock,
    LatenessProbe,
    Rig,
    RigOptions,
    TransactionLog,
    aws_sandbox,
    install_latency,
    lifecycle_deps,
    pct,
    sliding_max,
)

#: The account (`AcrProfile` and the pool's settings): AgentCore's documented quotas.
QUOTA_SESSIONS = 25.0
QUOTA_CALLS = 1000.0
QUOTA_ACTIVE = 5000
#: How every experiment was set up to reach the quota before the account pool (each on its own limits).
BEFORE_ENDPOINTS = 4
BEFORE_SESSION_RATE = 6.0
BEFORE_TPS = 50
#: ... with main's dispatchers then: 5 Lambdas (its default) of 10 rollouts (its SQS batch then).
BEFORE_DISPATCHERS = 5
BEFORE_BATCH = 10
#: The windows share errors are measured over while every experiment is backlogged (virtual s).
SHARE_WINDOW_S = 10.0
#: Rates are read over this sliding width (virtual s) for the rebalance, backoff and climb figures.
RATE_WIDTH_S = 2.0


def parser() -> argparse.ArgumentParser:
    """The bench's options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--weights", default="1,1,2", help="one experiment per weight")
    parser.add_argument(
        "--rollouts",
        type=int,
        default=400,
        help="backlog of each experiment (400: the default run fits 10 minutes here; 1000: the full case, ~25 min)",
    )
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument(
        "--dilation",
        type=float,
        default=8.0,
        help="k: one virtual second lasts k wall seconds (8: three experiments' Lambdas keep their pace here; at 4 "
        "the machine, not the pipeline, sets the rate)",
    )
    parser.add_argument(
        "--dispatchers",
        type=int,
        default=None,
        help="dispatcher 'Lambdas' per experiment (default: what synth derives, `config.derived_dispatch_concurrency`)",
    )
    parser.add_argument("--completers", type=int, default=2, help="completer 'Lambdas' per experiment")
    parser.add_argument(
        "--threads", type=int, default=None, help="rollouts per dispatcher (default: its SQS batch, `DISPATCH_BATCH`)"
    )
    parser.add_argument("--max-sessions", type=int, default=200)
    parser.add_argument("--min-delay", type=float, default=2.0, help="agent time before the result (virtual s)")
    parser.add_argument("--max-delay", type=float, default=6.0)
    parser.add_argument("--reserve", type=float, default=0.1)
    parser.add_argument(
        "--idle-s",
        type=float,
        default=30.0,
        help="the first experiment's pause halfway (0: none); its dispatchers first finish the ~100 rollouts they"
        " hold (rate x IN_HAND_S), ~18 s at its share of 5.6/s",
    )
    parser.add_argument("--outside", action="store_true", help="an outside consumer starts halfway (no pause then)")
    parser.add_argument("--outside-rate", type=float, default=6.0, help="its new sessions/s")
    parser.add_argument(
        "--outside-s",
        type=float,
        default=20.0,
        help="how long it runs (virtual s; it must end while the backlog lasts, for the climb back)",
    )
    parser.add_argument("--before", action="store_true", help="also run the experiments on their own limits")
    parser.add_argument(
        "--members", type=int, default=0, help="more experiments in the pool, idle (their entries renewed every second)"
    )
    parser.add_argument(
        "--acr-active",
        type=int,
        default=0,
        help="AgentCore holds at most this many active sessions although the pool's quota says 5,000 (the fake "
        "answers ServiceQuotaExceededException beyond it; 0: the quota)",
    )
    parser.add_argument("--hold-ms", type=float, default=15.0)
    parser.add_argument("--no-latency", action="store_true")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-seconds", type=float, default=560.0, help="WALL seconds per mode (bounded)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--json-out", default="")
    return parser


def main(argv: list[str] | None = None) -> int:
    options = parser()
    args = options.parse_args(argv)
    weights = [float(w) for w in args.weights.split(",") if w.strip()]
    if not weights or any(w <= 0 for w in weights) or len(weights) > 8:
        options.error("--weights: 1 to 8 positive numbers")
    if not 8 <= args.rollouts <= 20_000 or not 1 <= args.dilation <= 100 or args.max_seconds > 7200:
        options.error("--rollouts 8..20000, --dilation 1..100, --max-seconds at most 7200")

    clock = DilatedClock(args.dilation)
    clock.install()  # before anything imports the pipeline
    result: dict[str, Any] = {"config": {k: v for k, v in vars(args).items() if k not in ("json", "json_out")}}
    for mode in ("after", "before") if args.before else ("after",):
        with aws_sandbox(seed=args.seed, hold_ms=args.hold_ms) as profile:
            result[mode] = run(args, weights, clock, profile, pooled=mode == "after")
        if not args.json:
            print_report(mode, result[mode])
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1, sort_keys=True))
    if args.json:
        print(json.dumps(result, indent=1, sort_keys=True))
    return 0 if result["after"]["ok"] else 1


def run(  # noqa: C901 (one run's harness: the experiments' Lambdas, the outside consumer, the pause, the figures)
    args: argparse.Namespace, weights: Sequence[float], clock: DilatedClock, profile: Any, *, pooled: bool
) -> dict[str, Any]:
    from bench_acr_quotas import MOTO_TIME

    from rollout_pipeline.adapters import clients
    from rollout_pipeline.adapters.s3 import S3ObjectStore
    from rollout_pipeline.config import DISPATCH_BATCH, ExperimentConfig
    from rollout_pipeline.fakes.acr import AcrProfile, AgentBehaviour, FakeAgentRuntime
    from rollout_pipeline.ledger import retry
    from rollout_pipeline.ledger.pool import PoolLedger
    from rollout_pipeline.local.resources import create_resources
    from rollout_pipeline.quotas import AccountQuotas, PoolSettings

    load_start = os.getloadavg()
    clients.reset()
    counters = Counters()
    clients.register_hook("before-parameter-build", counters.before_build)
    if not args.no_latency:
        install_latency(clients, random.Random(args.seed + 7))
    settings = PoolSettings(
        AccountQuotas(new_sessions_per_s=QUOTA_SESSIONS, data_plane_per_s=QUOTA_CALLS, active_sessions=QUOTA_ACTIVE),
        reserve=args.reserve,
    )
    group_size = args.group_size
    inputs = max(1, args.rollouts // group_size)
    names = [f"exp-{chr(ord('a') + i)}" for i in range(len(weights))]
    rng = random.Random(args.seed)
    delays = {name: [rng.uniform(args.min_delay, args.max_delay) for _ in range(inputs * group_size)] for name in names}

    def behaviour(inv: Any) -> AgentBehaviour:
        rollout = inv.payload.get("_rollout") or {}
        if str(rollout.get("exp_id")) not in delays:  # the outside consumer's session: no result, stopped by it
            return AgentBehaviour(rewards=1.0, delay_s=clock.wall_s(1.0))
        row = int(str(rollout.get("input_id", "row-0")).split("-")[-1])
        delay = delays[str(rollout.get("exp_id"))][row * group_size + int(rollout.get("index") or 0)]
        return AgentBehaviour(rewards=1.0, delay_s=clock.wall_s(delay))  # threading.Timer: wall clock

    fake = FakeAgentRuntime(
        store=S3ObjectStore(),
        behaviour=behaviour,
        profile=AcrProfile.realistic(
            account_new_sessions_per_s=QUOTA_SESSIONS,
            data_plane_tps=QUOTA_CALLS,
            max_active_sessions=args.acr_active or QUOTA_ACTIVE,
            endpoints=1 if pooled else BEFORE_ENDPOINTS,
            seed=args.seed,
        ),
    )
    stop, stop_dispatch, errors = threading.Event(), threading.Event(), []
    rigs: dict[str, Rig] = {}
    for name, weight in zip(names, weights, strict=True):
        own = (
            {}
            if pooled
            else {
                "endpoints": BEFORE_ENDPOINTS,
                "session_rate_limit": BEFORE_SESSION_RATE,
                "tps_limit": BEFORE_TPS,
                **({"dispatch_concurrency": BEFORE_DISPATCHERS} if args.dispatchers is None else {}),
            }
        )
        config = ExperimentConfig(
            name=name,
            capacity_weight=weight,
            max_sessions=args.max_sessions,
            group_size=group_size,
            rollout_timeout_s=900,
            **({} if args.dispatchers is None else {"dispatch_concurrency": max(2, args.dispatchers)}),
            **own,
        )
        dispatchers = config.dispatch_concurrency
        threads = args.threads or (DISPATCH_BATCH if pooled else BEFORE_BATCH)
        resources = create_resources(
            config, region="us-east-1", client=clients.client, pool=settings if pooled else False
        )

        def make_deps(s: Any, threads: int = threads) -> Any:
            return lifecycle_deps(s, fake, dispatch_threads=threads)

        options = RigOptions(
            dispatchers=dispatchers,
            completers=args.completers,
            threads=threads,
            queue_depth=150,
            seed=args.seed,
        )
        rigs[name] = Rig(
            resources, make_deps, counters, clock, options, stop=stop, stop_dispatch=stop_dispatch, errors=errors
        )
    for name, rig in rigs.items():
        rig.seed(batch_of(name), inputs, group_size)
    retry.stats.plain = retry.stats.transactions = 0
    log = TransactionLog(profile)
    pool_writes: list[float] = []
    item_sizes: list[int] = []
    if pooled:
        _count_pool_writes(pool_writes, item_sizes)
        _add_members(PoolLedger.open(topology_pool_table()), args.members, stop)
    probe = LatenessProbe()
    grants: list[tuple[float, dict[str, tuple[float, float]]]] = []
    if pooled:
        pool_reader = PoolLedger.open(topology_pool_table())

        def sample_grants() -> None:
            for _ in range(100_000):
                if stop.is_set():
                    return
                counters.harness.on = True
                try:
                    view, members = pool_reader.snapshot()
                finally:
                    counters.harness.on = False
                now = time.time()
                grants.append((now - started_at, _grants_row(view, members, now)))
                time.sleep(1.0)

    def releasing(rig: Rig, batch: str) -> Any:
        return lambda: rig.release(batch)

    threads = [t for name, rig in rigs.items() for t in rig.threads(releasing=releasing(rig, batch_of(name)))]
    threads.append(threading.Thread(target=probe.run, name="bench-probe", daemon=True))
    if pooled:
        threads.append(threading.Thread(target=sample_grants, name="bench-grants", daemon=True))
    ideal_s = len(names) * inputs * group_size / (QUOTA_SESSIONS * (1 - args.reserve))
    events: dict[str, float] = {}
    outside = Outside(fake, args.outside_rate, hold_wall_s=clock.wall_s(1.0))
    started_wall, started_at = _REAL_MONOTONIC(), time.time()
    if not args.json:
        print(
            f"bench_capacity ({'account pool' if pooled else 'own limits, before the pool'}): k={args.dilation:g}, "
            f"{len(names)} experiments (weights {args.weights}) x {inputs * group_size} rollouts, "
            f"{dispatchers} dispatchers each; load {load_start[0]:.1f}",
            flush=True,
        )
    for t in threads:
        t.start()
    total = len(names) * inputs * group_size
    half = started_at + ideal_s / 2
    peak_load = load_start[0]
    last_print = started_wall
    while _REAL_MONOTONIC() - started_wall < args.max_seconds:
        peak_load = max(peak_load, os.getloadavg()[0])
        now = time.time()
        if args.outside and "outside_start" not in events and now >= half:
            events["outside_start"] = now
            outside.start()
        if (
            "outside_start" in events
            and "outside_stop" not in events
            and now >= events["outside_start"] + args.outside_s
        ):
            events["outside_stop"] = now
            outside.stop()
        first = rigs[names[0]]
        if not args.outside and args.idle_s > 0 and "idle_start" not in events and now >= half:
            events["idle_start"] = now
            first.pause()  # no work for a while: its queue is taken back, its dispatchers finish what they hold
        if "idle_start" in events and "idle_end" not in events and now >= events["idle_start"] + args.idle_s:
            events["idle_end"] = now
            first.resume()
        counters.harness.on = True
        terminal = sum(_terminal(rig, batch_of(name)) for name, rig in rigs.items())
        counters.harness.on = False
        if terminal >= total:
            break
        if _REAL_MONOTONIC() - last_print > 30 and not args.json:
            last_print = _REAL_MONOTONIC()
            print(
                f"  {last_print - started_wall:6.0f} s wall, {now - started_at:6.1f} s virtual: {terminal}/{total} "
                f"terminal, {len(fake.running)} sessions running",
                flush=True,
            )
        _REAL_SLEEP(1.0)
    outside.stop()
    stop_dispatch.set()
    joined_by = _REAL_MONOTONIC() + min(clock.wall_s(60.0), 120.0) + 10  # bounded whatever k is
    for t in threads:
        if t.name.startswith("lc-dispatcher"):
            t.join(timeout=max(0.0, joined_by - _REAL_MONOTONIC()))
    settle = _REAL_MONOTONIC() + 60  # running rollouts finish, stops are retried (bounded)
    counters.harness.on = True
    while _REAL_MONOTONIC() < settle and any(r.deps.ledger.limits.in_flight() for r in rigs.values()):
        _REAL_SLEEP(1.0)
    terminal = sum(_terminal(rig, batch_of(name)) for name, rig in rigs.items())
    counters.harness.on = False
    stop.set()
    probe.stop.set()
    for t in threads:
        t.join(timeout=15)
    fake.close()
    wall_s = _REAL_MONOTONIC() - started_wall
    return figures(
        args=args,
        weights=dict(zip(names, weights, strict=True)),
        rigs=rigs,
        fake=fake,
        outside=outside,
        events=events,
        started_at=started_at,
        counters=counters,
        log=log,
        profile=profile,
        pool_writes=pool_writes,
        item_sizes=item_sizes,
        terminal=terminal,
        total=total,
        errors=errors,
        machine={
            "load_start": load_start,
            "load_end": os.getloadavg(),
            "load_peak": peak_load,
            "wall_s": wall_s,
            "virtual_s": time.time() - started_at,
            "clock_lateness_ms_p50": pct(probe.late_ms, 0.5),
            "clock_lateness_ms_p95": pct(probe.late_ms, 0.95),
            "moto_dynamodb_lock_busy": MOTO_TIME["dynamodb"][0] / max(wall_s, 1e-9),
        },
        retries=retry.stats.total,
        grants=grants,
        pooled=pooled,
        budget=settings.budget("sessions"),
    )


def _grants_row(view: Any, members: list[Any], now: float) -> dict[str, tuple[float, float]]:
    """One sample of the pool: each experiment's share of new sessions/s and its demand as its last renewal wrote
    them, and the account schedule's backoff factor."""
    from rollout_pipeline.limits.pacing import backoff_factor

    row = {m.name: (m.share, m.demand) for m in members}
    return row | {"backoff-sessions": (backoff_factor(view.factor, view.factor_at, now), 0.0)}


def _renewals(rigs: dict[str, Rig]) -> dict[str, int]:
    """What the experiments' processes did in the pool: share renewals written and lost, backoff decreases and climb
    steps written, active-session caps learned."""
    out: Counter[str] = Counter()
    for rig in rigs.values():
        for deps in (rig.deps, *rig.dispatch_deps):
            limits = deps.limits
            if limits.membership is not None:
                out["renewals"] += limits.membership.renewals
                out["renewals_lost"] += limits.membership.lost
            if limits.account is not None:
                out["decreases"] += limits.account.decreases
                out["climbs"] += limits.account.climbs
                out["caps_learned"] += limits.account.caps_learned
    return dict(out)


def _add_members(pool: Any, count: int, stop: threading.Event) -> None:
    """`count` more experiments in the pool, idle (live entries asking for nothing): the account's item does not
    grow with them, and the shares leave them out."""
    from rollout_pipeline.ledger.pool import MemberEntry

    if count <= 0:
        return

    def renew() -> None:
        while not stop.is_set():
            now = time.time()
            for i in range(count):
                pool.put_member(MemberEntry(f"idle-{i:03d}", demand=0.0, renewed_at=now), now=now)
            stop.wait(1.0)

    threading.Thread(target=renew, name="bench-members", daemon=True).start()


def topology_pool_table() -> str:
    from rollout_pipeline.topology import POOL_TABLE_NAME

    return POOL_TABLE_NAME


def _terminal(rig: Rig, batch_id: str) -> int:
    view = rig.deps.ledger.batches.read_batch(batch_id)
    return view.terminal if view is not None else 0


def _count_pool_writes(writes: list[float], sizes: list[int]) -> None:
    """Record when the account's schedule item is written (every new session of every experiment books its start
    there: how hot is it?) and how big the item is after each write (its write cost: 1 WCU per KB)."""
    import json as _json

    from rollout_pipeline.ledger import pace
    from rollout_pipeline.ledger.pool_schema import POOL_PK, POOL_SK

    original = pace._write

    def counted(table: Any, key: Any, *a: Any, **kw: Any) -> Any:
        reserved, seen = original(table, key, *a, **kw)
        if key["pk"]["S"] == POOL_PK and key["sk"]["S"] == POOL_SK:
            writes.append(time.time())
            if reserved is not None:
                sizes.append(len(_json.dumps(dict(reserved.values), default=str).encode()))
        return reserved, seen

    pace._write = counted  # type: ignore[assignment]


class Outside:
    """A consumer of the account outside the pipeline: new sessions at `rate`/s, evenly spaced, each stopped a
    second later; counts AgentCore's throttles of its calls."""

    def __init__(self, fake: Any, rate: float, *, hold_wall_s: float = 1.0) -> None:
        self.fake = fake
        self.rate = rate
        #: How long each of its sessions lives, in WALL seconds (`threading.Timer` is not dilated).
        self.hold_wall_s = hold_wall_s
        self.calls: list[tuple[float, bool]] = []  # (time asked, throttled)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="bench-outside", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        next_at = time.time()
        for n in range(10_000_000):
            if self._stop.is_set():
                return
            pause = next_at - time.time()
            if pause > 0:
                time.sleep(pause)
            next_at += 1.0 / self.rate
            session = f"outside-consumer-session-{n:08d}-xxxxxxxxxxxxxxxx"
            # Each call in its own thread: an invoke lasts as long as AgentCore's answer (a cold start, seconds),
            # and a consumer that waited for it would start far fewer than `rate` sessions/s.
            threading.Thread(target=self._call, args=(session, n), name="bench-outside-call", daemon=True).start()

    def _call(self, session: str, n: int) -> None:
        from rollout_pipeline.ports import RuntimeThrottled

        at = time.time()
        try:
            self.fake.invoke(session, {"work": n})  # no `_rollout` trio: it writes no result
        except RuntimeThrottled:
            with self._lock:
                self.calls.append((at, True))
            return
        except Exception:  # another answer of AgentCore (a failed start): not a throttle, not counted
            return
        with self._lock:
            self.calls.append((at, False))
        threading.Timer(self.hold_wall_s, self._end, args=(session,)).start()

    def _end(self, session: str) -> None:
        from contextlib import suppress

        with suppress(Exception):
            self.fake.stop(session)


def figures(**kw: Any) -> dict[str, Any]:
    """Every figure of one mode's run."""
    rigs, fake, events = kw["rigs"], kw["fake"], kw["events"]
    weights: dict[str, float] = kw["weights"]
    t0, budget, n = kw["started_at"], kw["budget"], max(kw["terminal"], 1)
    calls = list(fake.calls)
    pipeline = [c for c in calls if not c.session_id.startswith("outside-")]
    # A session starts at its first invoke let through (a 424's retries reach the same microVM: no new session).
    account_starts: dict[str, Any] = {}
    for c in calls:
        if c.op == "invoke" and c.outcome in ("started", "cold_start"):
            account_starts.setdefault(c.session_id, c)
    starts = {sid: c for sid, c in account_starts.items() if not sid.startswith("outside-")}
    by_exp: dict[str, list[float]] = {name: [] for name in rigs}
    for c in starts.values():
        exp = _experiment_of(c.session_id, rigs)
        if exp:
            by_exp[exp].append(c.at - t0)
    all_starts = sorted(t for ts in by_exp.values() for t in ts)
    throttled = Counter(
        c.outcome for c in pipeline if c.op == "invoke" and c.outcome in ("throttled", "quota_exceeded")
    )
    # The period when every experiment has a backlog: from the latest first start (+5 s of ramp) to the earliest
    # last start (-5 s), leaving out the first experiment's pause.
    lo = max(min(ts) for ts in by_exp.values() if ts) + 5.0 if all(by_exp.values()) else 0.0
    hi = min(max(ts) for ts in by_exp.values() if ts) - 5.0 if all(by_exp.values()) else 0.0
    gaps = []
    if "idle_start" in events:
        gaps.append((events["idle_start"] - t0, events.get("idle_end", events["idle_start"]) - t0 + 15.0))
    if "outside_start" in events:
        gaps.append((events["outside_start"] - t0, events.get("outside_stop", events["outside_start"]) - t0 + 20.0))
    share_errors, rates = [], []
    t = lo
    while t + SHARE_WINDOW_S <= hi:
        if not any(a < t + SHARE_WINDOW_S and t < b for a, b in gaps):
            counts = {e: sum(1 for s in ts if t <= s < t + SHARE_WINDOW_S) for e, ts in by_exp.items()}
            total = sum(counts.values())
            if total:
                rates.append(total / SHARE_WINDOW_S)
                for e, c in counts.items():
                    target = weights[e] / sum(weights.values())
                    share_errors.append(abs(c / total - target) / target)
        t += SHARE_WINDOW_S
    steady = statistics.fmean(rates) if rates else float("nan")
    out: dict[str, Any] = {
        "pooled": kw["pooled"],
        "terminal": kw["terminal"],
        "total": kw["total"],
        "errors": len(kw["errors"]),
        "first_errors": kw["errors"][:3],
        "throttles_pipeline": sum(throttled.values()),
        "throttles_pipeline_by_kind": dict(throttled),
        "share_error_max": max(share_errors) if share_errors else float("nan"),
        "share_windows": len(share_errors) // max(1, len(rigs)),
        "rates_backlogged": {e: sum(1 for s in ts if lo <= s < hi) / max(1e-9, hi - lo) for e, ts in by_exp.items()},
        "backlogged_window_s": [lo, hi],
        "shares": {e: len(ts) for e, ts in by_exp.items()},
        "pool_use": steady / budget,
        "pipeline_sessions_per_s": steady,
        "budget_sessions_per_s": budget,
        "busiest_sliding_second_pipeline": sliding_max([c.at for c in starts.values()]),
        "busiest_sliding_second_account": sliding_max([c.at for c in account_starts.values()]),
        "busiest_data_plane_second": sliding_max([c.at for c in calls if c.op in ("invoke", "stop")]),
        "peak_active": fake.max_active,
        "requests_per_rollout": sum(kw["counters"].ops.values()) / n,
        "requests_by_item": {k: v / n for k, v in kw["counters"].items.most_common(14)},
        "requests_by_operation": {k: v / n for k, v in kw["counters"].ops.most_common()},
        "request_units_by_caller": {
            k: v / n for k, v in kw["counters"].units_by_caller.most_common(16) if v / n >= 0.05
        },
        "requests_by_caller": {k: v / n for k, v in kw["counters"].caller_items.most_common(24) if v / n >= 0.02},
        "conflict_retries_per_rollout": kw["retries"] / n,
        "conflicts_by_item": dict(kw["log"].conflicts_by_item.most_common()),
        "sessions_never_stopped": len(
            {c.session_id for c in pipeline if c.op == "invoke" and c.outcome not in ("throttled", "quota_exceeded")}
            - fake.stopped
        ),
        "pool_writes_per_s": _busiest_rate(kw["pool_writes"]),
        "account_item_bytes_max": max(kw["item_sizes"], default=0),
        "account_item_wcu_per_start": math.ceil(max(kw["item_sizes"], default=0) / 1024),
        "renewals": _renewals(rigs),
        "busiest_items": _busiest_items(kw["profile"], kw["log"], all_starts),
        "machine": kw["machine"],
        "events_s": {k: v - t0 for k, v in events.items()},
        "grants_sampled": [(round(at, 1), {n: (round(r, 2), d) for n, (r, d) in g.items()}) for at, g in kw["grants"]],
    }
    out.update(_rebalance(by_exp, events, t0, steady, weights))
    out.update(_active_cap(calls, t0, kw))
    throttled_at = [c.at - t0 for c in calls if c.op == "invoke" and c.outcome in ("throttled", "quota_exceeded")]
    out.update(_backoff(all_starts, kw["outside"], events, t0, steady, throttled_at))
    outside_ran = "outside_start" not in events or out.get("outside_calls", 0) > 0
    out["ok"] = bool(kw["terminal"] == kw["total"] and out["sessions_never_stopped"] == 0 and outside_ran)
    return out


def batch_of(name: str) -> str:
    """Each experiment's batch id: its sessions' ids start with it (`ids.session_id`), so the fake's calls say whose
    they are."""
    return f"bench-{name}-0001"


def _experiment_of(session_id: str, rigs: dict[str, Rig]) -> str | None:
    return next((name for name in rigs if session_id.startswith(batch_of(name) + "-")), None)


def _rate_at(times: Sequence[float], t: float, width: float = RATE_WIDTH_S) -> float:
    return sum(1 for s in times if t <= s < t + width) / width


def _rebalance(
    by_exp: dict[str, list[float]],
    events: dict[str, float],
    t0: float,
    steady: float,
    weights: dict[str, float],
) -> dict[str, Any]:
    """Seconds from the first experiment's last start before its pause until the others' rate reaches 90% of the
    steady total, and from its resume until its own rate reaches 90% of its weighted share."""
    if "idle_start" not in events or math.isnan(steady):
        return {"rebalance_s": None}
    first, *others = list(by_exp)
    mine = sorted(by_exp[first])
    pause, resume = events["idle_start"] - t0, events.get("idle_end", events["idle_start"]) - t0
    last = max((s for s in mine if s <= resume), default=pause)
    rest = sorted(s for e in others for s in by_exp[e])
    out_s = next((t - last for t in _ticks(last, resume) if _rate_at(rest, t) >= 0.9 * steady), float("inf"))
    share = steady * weights[first] / sum(weights.values())
    back_s = next((t - resume for t in _ticks(resume, resume + 60) if _rate_at(mine, t) >= 0.9 * share), float("inf"))
    return {"rebalance_s": max(out_s, back_s), "rebalance_away_s": out_s, "rebalance_back_s": back_s}


def _backoff(
    starts: list[float],
    outside: Outside,
    events: dict[str, float],
    t0: float,
    steady: float,
    throttled_at: list[float],
) -> dict[str, Any]:
    """With an outside consumer: seconds until the pipeline's rate leaves it room (quota - its rate), its throttles
    after that, when AgentCore last throttled anyone (`throttled_at`: every throttle, virtual s from the start)
    after it started, and seconds after it stops until the pipeline is back at 90% of its steady rate."""
    if "outside_start" not in events:
        return {"throttles_outside": None}
    begin = events["outside_start"] - t0
    end = events.get("outside_stop", events["outside_start"]) - t0
    room = QUOTA_SESSIONS - outside.rate
    backoff_s = next((t - begin for t in _ticks(begin, end) if _rate_at(starts, t) <= room), float("inf"))
    after = begin + (backoff_s if math.isfinite(backoff_s) else 0.0)
    later = [(at - t0, throttled) for at, throttled in outside.calls if at - t0 >= after]
    climb_s = next((t - end for t in _ticks(end, end + 120) if _rate_at(starts, t) >= 0.9 * steady), float("inf"))
    return {
        "throttles_outside": sum(1 for _at, th in outside.calls if th),
        "outside_calls": len(outside.calls),
        "backoff_s": backoff_s,
        "throttles_outside_after_backoff": sum(1 for _at, th in later if th),
        "outside_calls_after_backoff": len(later),
        "throttles_outside_after_backoff_share": sum(1 for _at, th in later if th) / max(1, len(later)),
        "pipeline_sessions_per_s_with_outside": len([s for s in starts if after <= s < end]) / max(1e-9, end - after),
        "climb_back_s": climb_s,
        "last_throttle_after_outside_start_s": max((t - begin for t in throttled_at if t >= begin), default=0.0),
        "throttles_after_outside_start_s": [round(t - begin, 2) for t in sorted(throttled_at) if t >= begin][:60],
        "outsider_throttled_at_s": sorted(round(at - t0 - begin, 2) for at, throttled in outside.calls if throttled),
    }


def _active_cap(calls: list[Any], t0: float, kw: dict[str, Any]) -> dict[str, Any]:
    """With AgentCore holding fewer active sessions than the quota says (`--acr-active`): its refusals
    (ServiceQuotaExceeded), when the last came, the busiest second of them (a storm: retries arriving together),
    and the rollouts that failed."""
    refused = sorted(c.at - t0 for c in calls if c.op == "invoke" and c.outcome == "quota_exceeded")
    failed = sum(r.deps.ledger.batches.read_batch(batch_of(name)).failed for name, r in kw["rigs"].items())  # type: ignore[union-attr]
    return {
        "quota_exceeded": len(refused),
        "quota_exceeded_last_s": refused[-1] if refused else None,
        "quota_exceeded_span_s": refused[-1] - refused[0] if refused else None,
        "quota_exceeded_busiest_second": sliding_max(refused),
        "quota_exceeded_first_10s": sum(1 for t in refused if t < (refused[0] + 10.0 if refused else 0.0)),
        "rollouts_failed": failed,
    }


def _ticks(start: float, end: float, step: float = 0.25) -> list[float]:
    return [start + i * step for i in range(max(0, int((end - start) / step)) + 1)]


def _busiest_rate(times: list[float]) -> dict[str, float]:
    if len(times) < 2:
        return {"mean": 0.0, "busiest_second": float(len(times))}
    return {"mean": len(times) / (max(times) - min(times)), "busiest_second": float(sliding_max(times))}


def _busiest_items(profile: Any, log: TransactionLog, starts: list[float]) -> list[dict[str, Any]]:
    busy_s = (max(starts) - min(starts)) if len(starts) > 1 else 1.0
    items = []
    for item, tx in (profile.transaction_writes + Counter()).most_common(4):
        key = json.loads(item)
        items.append(
            {
                "item": f"{key['pk']['S'][:20]}/{key['sk']['S'][:30]}",
                "transactions_per_s": tx / busy_s,
                "busiest_second_transactions": sliding_max(log.tx_times.get(item, [])),
            }
        )
    for item, writes in profile.plain_writes.most_common(3):
        key = json.loads(item)
        items.append({"item": f"{key['pk']['S'][:20]}/{key['sk']['S'][:30]}", "plain_writes_per_s": writes / busy_s})
    return items


def print_report(mode: str, r: dict[str, Any]) -> None:
    m = r["machine"]
    print()
    print(f"== {mode}: {'account pool' if r['pooled'] else 'each experiment on its own limits'}")
    print(
        f"machine                  load {m['load_start'][0]:.1f} -> {m['load_end'][0]:.1f} "
        f"(peak {m['load_peak']:.1f}); "
        f"{m['wall_s']:.0f} s wall = {m['virtual_s']:.1f} s virtual; clock lateness p50 "
        f"{m['clock_lateness_ms_p50']:.1f} / p95 {m['clock_lateness_ms_p95']:.1f} ms virtual; moto DynamoDB lock "
        f"busy {m['moto_dynamodb_lock_busy']:.0%}"
    )
    print(f"terminal                 {r['terminal']}/{r['total']}; errors {r['errors']} {r['first_errors'][:1]}")
    keys = (
        "throttles_pipeline",
        "throttles_outside",
        "share_error_max",
        "pool_use",
        "rebalance_s",
        "requests_per_rollout",
        "conflict_retries_per_rollout",
        "sessions_never_stopped",
        "quota_exceeded",
        "quota_exceeded_last_s",
        "quota_exceeded_span_s",
        "quota_exceeded_busiest_second",
        "rollouts_failed",
    )
    for key in keys:
        value = r.get(key)
        print(f"{key:<28} {value:.3f}" if isinstance(value, float) else f"{key:<28} {value}")
    print(
        f"new sessions/s           {r['pipeline_sessions_per_s']:.2f} while all are backlogged (pool less the "
        f"reserve {r['budget_sessions_per_s']:g}); shares {r['shares']}; busiest sliding second: pipeline "
        f"{r['busiest_sliding_second_pipeline']}, account {r['busiest_sliding_second_account']} (quota "
        f"{QUOTA_SESSIONS:g}); data plane {r['busiest_data_plane_second']}; peak active {r['peak_active']}"
    )
    if r.get("rebalance_s") is not None:
        print(f"rebalance                away {r['rebalance_away_s']:.2f} s, back {r['rebalance_back_s']:.2f} s")
    if r.get("throttles_outside") is not None:
        print(
            f"outside consumer         backoff {r['backoff_s']:.2f} s; its throttles after it "
            f"{r['throttles_outside_after_backoff']}/{r['outside_calls_after_backoff']} "
            f"({r['throttles_outside_after_backoff_share']:.1%}); pipeline meanwhile "
            f"{r['pipeline_sessions_per_s_with_outside']:.2f}/s; climb back {r['climb_back_s']:.2f} s"
        )
    print(
        f"account item             writes {r['pool_writes_per_s']}; at most {r['account_item_bytes_max']} bytes "
        f"({r['account_item_wcu_per_start']} WCU a write); renewals {r.get('renewals')}"
    )
    print("busiest items            " + "; ".join(str(i) for i in r["busiest_items"]))
    print("requests by item         " + ", ".join(f"{k} {v:.2f}" for k, v in r["requests_by_item"].items()))
    print("  by operation           " + ", ".join(f"{k} {v:.2f}" for k, v in r["requests_by_operation"].items()))
    print("  units by caller        " + ", ".join(f"{k} {v:.2f}" for k, v in r["request_units_by_caller"].items()))
    print(f"ok                       {r['ok']}")


if __name__ == "__main__":
    raise SystemExit(main())
