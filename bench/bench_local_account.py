"""Local mode's account pool: weighted experiments and an outside consumer on ONE small local account.

What runs: `LocalPipeline` with several experiments on one local account (`LocalSettings.also`, their weights through
`LocalSettings.per_experiment`), one moto server, every experiment's own Lambdas (queue consumers, the sweeper), and
ONE fake AgentCore for the account (`AcrProfile(account_new_sessions_per_s=--quota)`: it refuses a new session beyond
the quota in any sliding second with ThrottlingException, as AgentCore does). The pool leaves `--reserve` of the
quota unused; a consumer outside the pipeline (a production agent of the account) starts one new session every
`--outside-every-s` seconds straight into the fake AgentCore, inside that reserve. Every experiment submits a backlog
of `--rows` x `--group-size` rollouts at once; no model, no agent processes (the fake agent answers after
`--delay-s`). Wall clock, no dilation: local mode's own pace.

Printed (`--json`: one object), with the targets of the account schedule in brackets:
- wait_max_s: the longest a backlogged experiment waited for a new session: from its submission to its first start,
  and between consecutive starts until its last (<= 5 s); and each experiment's own.
- share_error_max: the largest relative gap between an experiment's share of the starts and its weight's share, from
  submission until the first experiment started its last rollout, while all are backlogged (<= 0.15); the shares.
- outside_throttled of outside_calls (0); busiest_second: the most new sessions of the account, the pipeline's and
  the outside consumer's, in any sliding second (<= the quota); throttles_pipeline (AgentCore's refusals of the
  pipeline's invokes); rollouts_completed of expected; wall time; the load and how late the machine woke sleepers.

Usage: python bench/bench_local_account.py [--rows 20] [--group-size 4] [--quota 4] [--reserve 0.1] [--weights 1,1,2]
       [--outside-every-s 3] [--delay-s 0.3] [--max-seconds 150] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from harness import LatenessProbe, pct, sliding_max  # noqa: E402

#: The outside consumer's session ids (the pipeline's start with their batch id).
OUTSIDE_PREFIX = "outside-session-"
#: The targets the figures are read against (the account schedule's: one local account at 4 new sessions/s).
WAIT_TARGET_S = 5.0
SHARE_TARGET = 0.15
#: Each experiment's limits in the run, as the integration test of the same scenario sets them
#: (tests/integration/limits/test_local_account.py): sessions never bind (the agent answers in `--delay-s`).
MAX_SESSIONS = 40
DISPATCH_CONCURRENCY = 3
#: How often the bench reads the batches' status while it waits (s).
POLL_S = 1.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--rows",
        type=int,
        default=20,
        help="rows each experiment submits (20: under 2 minutes here; the pipeline starts ~2.3 sessions/s on one core)",
    )
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--quota", type=float, default=4.0, help="the local account's new sessions/s")
    parser.add_argument("--reserve", type=float, default=0.1, help="the share of the quota the pool leaves unused")
    parser.add_argument("--weights", default="1,1,2", help="one experiment per weight (`capacity_weight`)")
    parser.add_argument(
        "--outside-every-s", type=float, default=3.0, help="the outside consumer's new session every ... s (0: none)"
    )
    parser.add_argument("--delay-s", type=float, default=0.3, help="the fake agent's time before its result")
    parser.add_argument("--max-seconds", type=float, default=150.0, help="wall seconds the batches may take (bound)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    try:
        weights = [float(w) for w in args.weights.split(",") if w.strip()]
    except ValueError:
        parser.error(f"--weights: numbers separated by commas, not {args.weights!r}")
    if not 1 <= len(weights) <= 6 or any(w <= 0 for w in weights):
        parser.error("--weights: 1 to 6 positive numbers")
    if not 1 <= args.rows <= 2000 or not 1 <= args.group_size <= 64:
        parser.error("--rows 1..2000, --group-size 1..64")
    if not 0 < args.quota <= 100 or not 0 <= args.reserve < 1 or not 0 < args.max_seconds <= 1800:
        parser.error("--quota 0..100, --reserve 0..1, --max-seconds 0..1800")
    if args.outside_every_s < 0 or not 0 <= args.delay_s <= 60:
        parser.error("--outside-every-s >= 0, --delay-s 0..60")
    names = [f"exp-{chr(ord('a') + i)}" for i in range(len(weights))]
    result = run(args, dict(zip(names, weights, strict=True)))
    if args.json:
        print(json.dumps(result, indent=1, sort_keys=True))
    else:
        print_report(result)
    return 0 if result["ok"] else 1


class Outside:
    """A consumer of the account the pipeline knows nothing of: one new session every `every_s` seconds, stopped
    once it answered; records (when, throttled) of each."""

    def __init__(self, fake: Any, every_s: float) -> None:
        self.fake, self.every_s = fake, every_s
        self.calls: list[tuple[float, bool]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        from rollout_pipeline.ports import RuntimeThrottled

        for n in range(1_000_000):
            if self.stop.wait(self.every_s):
                return
            session = f"{OUTSIDE_PREFIX}{n:026d}"
            at = time.time()
            try:
                self.fake.invoke(session, {})
            except RuntimeThrottled:
                self.calls.append((at, True))
                continue
            self.calls.append((at, False))
            with contextlib.suppress(Exception):
                self.fake.stop(session)


def run(args: argparse.Namespace, weights: dict[str, float]) -> dict[str, Any]:
    """One run: the pipeline up, the backlogs submitted at once, waited for (bounded), then the figures."""
    from rollout_pipeline.fakes.acr import AcrProfile, AgentBehaviour, FakeAgentRuntime
    from rollout_pipeline.local.pipeline import LocalPipeline, LocalSettings

    fakes: list[FakeAgentRuntime] = []

    def account(_resources: Any) -> FakeAgentRuntime:
        fake = FakeAgentRuntime(
            behaviour=AgentBehaviour(rewards=1.0, delay_s=args.delay_s),
            profile=AcrProfile(account_new_sessions_per_s=args.quota, max_active_sessions=1000),
        )
        fakes.append(fake)
        return fake

    first, *others = list(weights)
    load = {"start": os.getloadavg()[0], "peak": os.getloadavg()[0]}
    probe = LatenessProbe()
    with tempfile.TemporaryDirectory(prefix="bench-local-account-") as work:
        settings = LocalSettings(
            experiment=first,
            also=tuple(others),
            per_experiment={name: {"capacity_weight": weight} for name, weight in weights.items()},
            account_new_sessions_per_s=args.quota,
            capacity_reserve=args.reserve,
            group_size=args.group_size,
            max_sessions=MAX_SESSIONS,
            model_url="http://127.0.0.1:9/v1",
            runtime_factory=account,
            dispatch_concurrency=DISPATCH_CONCURRENCY,
            work_dir=Path(work),
        )
        up_at = time.monotonic()
        with LocalPipeline(settings) as pipeline:
            setup_s = time.monotonic() - up_at
            (fake,) = fakes
            outside = Outside(fake, args.outside_every_s)
            helpers = [threading.Thread(target=probe.run, name="bench-probe", daemon=True)]
            if args.outside_every_s > 0:
                helpers.append(threading.Thread(target=outside.run, name="bench-outside", daemon=True))
            for thread in helpers:
                thread.start()
            rows = [{"id": f"r{i}", "x": i} for i in range(args.rows)]
            submitted, batches = {}, {}
            for name, local in pipeline.experiments.items():
                submitted[name] = time.time()
                batches[name] = local.sdk.submit(rows)
            statuses, wall_s = wait_for(pipeline, batches, args.max_seconds, load)
            ended_at = time.time()
            outside.stop.set()
            probe.stop.set()
            for thread in helpers:
                thread.join(10)
    load["end"] = os.getloadavg()[0]
    result = figures(fake, outside.calls, submitted, ended_at, weights, args)
    result.update(
        rollouts_completed=sum(s["succeeded"] for s in statuses.values()),
        rollouts_failed=sum(s["failed"] for s in statuses.values()),
        rollouts_expected=len(weights) * args.rows * args.group_size,
        batches=statuses,
        wall_s=wall_s,
        setup_s=setup_s,
        machine={
            "cpus": os.cpu_count(),
            "load_start": load["start"],
            "load_peak": load["peak"],
            "load_end": load["end"],
            "sleep_lateness_ms_p50": pct(probe.late_ms, 0.5),
            "sleep_lateness_ms_p99": pct(probe.late_ms, 0.99),
        },
        config={k: v for k, v in vars(args).items() if k != "json"},
    )
    result["ok"] = result["rollouts_completed"] == result["rollouts_expected"]
    return result


def wait_for(
    pipeline: Any, batches: dict[str, str], max_seconds: float, load: dict[str, float]
) -> tuple[dict[str, dict[str, int]], float]:
    """Read every batch's status until all are done or `max_seconds` passed; the last statuses and the seconds from
    the first submission."""
    started = time.monotonic()
    statuses: dict[str, dict[str, int]] = {}
    for _ in range(int(max_seconds / POLL_S) + 2):
        load["peak"] = max(load["peak"], os.getloadavg()[0])
        done = True
        for name, batch in batches.items():
            status = pipeline.experiments[name].sdk.status(batch)
            statuses[name] = {"succeeded": status.succeeded, "failed": status.failed, "total": status.rollouts_total}
            done = done and status.done
        if done or time.monotonic() - started >= max_seconds:
            break
        time.sleep(POLL_S)
    return statuses, time.monotonic() - started


def figures(
    fake: Any,
    outside: list[tuple[float, bool]],
    submitted: dict[str, float],
    ended_at: float,
    weights: dict[str, float],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """The figures of one run from the fake AgentCore's calls (when each new session started, whose it was)."""
    starts: dict[str, list[float]] = {name: [] for name in weights}
    seen: set[str] = set()
    throttles_pipeline = 0
    for call in fake.invocations():
        if call.session_id.startswith(OUTSIDE_PREFIX):
            continue
        if call.outcome in ("throttled", "quota_exceeded"):
            throttles_pipeline += 1
        elif call.outcome == "started" and call.session_id not in seen:
            seen.add(call.session_id)
            exp = str((fake.payloads.get(call.session_id) or {}).get("_rollout", {}).get("exp_id"))
            if exp in starts:
                starts[exp].append(call.at)
    for times in starts.values():
        times.sort()
    expected = args.rows * args.group_size
    waits = {name: waits_of(times, submitted[name], expected, ended_at) for name, times in starts.items()}
    counts, until = backlogged_counts(starts)
    shares = {name: count / max(1, sum(counts.values())) for name, count in counts.items()}
    total_weight = sum(weights.values())
    share_errors = {
        name: abs(share - weights[name] / total_weight) / (weights[name] / total_weight)
        for name, share in shares.items()
    }
    outside_ok = [at for at, throttled in outside if not throttled]
    pipeline_starts = [t for times in starts.values() for t in times]
    return {
        "wait_max_s": max((max(w, default=float("inf")) for w in waits.values()), default=float("inf")),
        "wait_max_s_by_experiment": {name: max(w, default=float("inf")) for name, w in waits.items()},
        "wait_p95_s_by_experiment": {name: pct(w, 0.95) for name, w in waits.items()},
        "first_start_s_by_experiment": {name: w[0] if w else float("inf") for name, w in waits.items()},
        "share_error_max": max(share_errors.values(), default=float("nan")),
        "shares": shares,
        "weighted_shares": {name: weight / total_weight for name, weight in weights.items()},
        "starts_by_experiment": {name: len(times) for name, times in starts.items()},
        "outside_calls": len(outside),
        "outside_throttled": len(outside) - len(outside_ok),
        "busiest_second": sliding_max(pipeline_starts + outside_ok),
        "busiest_second_pipeline": sliding_max(pipeline_starts),
        "throttles_pipeline": throttles_pipeline,
        "pipeline_sessions_per_s": rate_of(pipeline_starts),
        "pipeline_sessions_per_s_backlogged": sum(counts.values()) / max(1e-9, until - min(submitted.values())),
        "budget_sessions_per_s": args.quota * (1 - args.reserve),
    }


def waits_of(times: Sequence[float], submitted: float, expected: int, ended_at: float) -> list[float]:
    """An experiment's waits for a new session: submission -> first start, then between consecutive starts (every
    start before its last leaves it rollouts to start), and, if it started fewer than `expected` sessions by the
    run's end (the bound), from its last start to then."""
    waits = [b - a for a, b in zip([submitted, *times], times, strict=False)]
    if len(times) < expected:
        waits.append(ended_at - (times[-1] if times else submitted))
    return waits


def backlogged_counts(starts: dict[str, list[float]]) -> tuple[dict[str, int], float]:
    """Each experiment's starts from submission until the first of them started its last rollout (while all are
    backlogged), and that moment."""
    if not all(starts.values()):
        return dict.fromkeys(starts, 0), 0.0
    until = min(times[-1] for times in starts.values())
    return {name: sum(1 for t in times if t <= until) for name, times in starts.items()}, until


def rate_of(times: list[float]) -> float:
    """New sessions per second from the first of `times` to the last."""
    ordered = sorted(times)
    return (len(ordered) - 1) / (ordered[-1] - ordered[0]) if len(ordered) > 1 and ordered[-1] > ordered[0] else 0.0


def print_report(r: dict[str, Any]) -> None:
    m, c = r["machine"], r["config"]

    def by_exp(values: dict[str, float], fmt: str = ".2f") -> str:
        return ", ".join(f"{name} {value:{fmt}}" for name, value in values.items())

    print(
        f"bench_local_account: {len(r['shares'])} experiments (weights {c['weights']}) x {c['rows']} rows x "
        f"{c['group_size']} on one local account of {c['quota']:g} new sessions/s, reserve {c['reserve']:g}, outside "
        f"consumer every {c['outside_every_s']:g} s, agent delay {c['delay_s']:g} s"
    )
    print(
        f"machine                 {m['cpus']} cpus, load {m['load_start']:.1f} -> {m['load_end']:.1f} (peak "
        f"{m['load_peak']:.1f}); sleeps woke late p50 {m['sleep_lateness_ms_p50']:.1f} / p99 "
        f"{m['sleep_lateness_ms_p99']:.1f} ms"
    )
    print(f"wait_max_s              {r['wait_max_s']:.2f}  (target <= {WAIT_TARGET_S:g})")
    print(f"  by experiment         {by_exp(r['wait_max_s_by_experiment'])}")
    print(f"  p95 by experiment     {by_exp(r['wait_p95_s_by_experiment'])}")
    print(f"  first start after     {by_exp(r['first_start_s_by_experiment'])} s")
    print(f"share_error_max         {r['share_error_max']:.3f}  (target <= {SHARE_TARGET:g})")
    print(f"  shares                {by_exp(r['shares'], '.3f')} (weighted {by_exp(r['weighted_shares'], '.3f')})")
    print(f"outside_throttled       {r['outside_throttled']} of outside_calls {r['outside_calls']}  (target 0)")
    print(
        f"busiest_second          {r['busiest_second']} new sessions (pipeline alone {r['busiest_second_pipeline']}; "
        f"target <= {c['quota']:g})"
    )
    print(f"throttles_pipeline      {r['throttles_pipeline']}")
    print(
        f"pipeline sessions/s     {r['pipeline_sessions_per_s_backlogged']:.2f} from submission while all are "
        f"backlogged, {r['pipeline_sessions_per_s']:.2f} first start to last (the pool less the reserve: "
        f"{r['budget_sessions_per_s']:g}); starts {r['starts_by_experiment']}"
    )
    print(
        f"rollouts_completed      {r['rollouts_completed']} / {r['rollouts_expected']} (failed {r['rollouts_failed']})"
    )
    print(f"wall                    {r['wall_s']:.1f} s from submission (+ {r['setup_s']:.1f} s to start the pipeline)")
    print(f"ok                      {r['ok']}")


if __name__ == "__main__":
    raise SystemExit(main())
