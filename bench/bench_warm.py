"""Warm start: one GRPO step's batch submitted after a pause, with the warm pool on and off, in one run.

The scenario: a synchronous GRPO trainer's step submits B x G rollouts at once (SageMaker's default 128 x 8 = 1,024)
after its training phase (`--pause`, 120 s). One fake AgentCore account (25 new sessions/s, the realistic profile's
5% cold starts answering 424 and 2% failing stops, plus `--cold-start-s` (1.3 s) on every session's first invoke:
its microVM's cold start; every session ended at the experiment's `max_lifetime_s`, busy or idle). `warm`: the
experiment keeps `warm_sessions` = the batch's size, filled during the pause by the sweeper (the stack's schedule:
once a minute, ticking the pool for `warm_loop_s` of it) and taken through the warm queue of offers; `cold`: the
pool off. Each side gets its own in-process moto and fake account, one after the other, the same seeds.

The clock is `bench_scale`'s dilated clock (one virtual second lasts k wall seconds: the pipeline's rates are
AgentCore's, in virtual time, on two shared cores), which can also jump ahead over a phase in which nothing runs:
the rest of the pause once the pool is full (the cold side: all of it) and the idle time before the pool halts
(`warm_idle_stop_s`). Nothing is in flight across a jump (no rollout, no warm-up, no tick between its reads).

Printed for each side (`--json`: one object): `admit_s` (submit to the last rollout's first invoke that started
it), `first_group_s`, `step_s` (submit to the last `Group Completed`), `cold_starts_on_path` (424s met by
rollouts), `take_collisions` (takes whose session another had taken), `rollouts_lost_to_lifetime_ends` (rollouts
still running when AgentCore ended their session at its maximum lifetime), `warm_idle_gb_s` and its cost (warm
sessions' memory while they waited: warm-up to rollout, or to their stop; `costs.PriceBook.memory_gb_s` at the
experiment's `PriceBook`, `--session-gb` a session), `sessions_never_stopped` (once the experiment went idle and the
pool halted), `requests_per_rollout` (AWS requests of the pipeline and AgentCore data-plane calls per rollout: the
step with the fill before it; with the tail: the refill after the step and the halt's stops) and
`dynamodb_sqs_per_rollout` (DynamoDB and SQS requests alone, the warm queue's included), beside the time saved and
the trainer's hourly cost at which the pool's idle memory costs what the saved time is worth, and the warm side's
`targets` (docs/benchmarks.md, "Warm start").

Usage: python bench/bench_warm.py [--rollouts 1024] [--group-size 8] [--pause 120] [--account-pool]
[--rollout-timeout-s 900] [--max-lifetime-s S] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from bench_scale import (  # noqa: E402
    _REAL_MONOTONIC,
    _REAL_SLEEP,
    Counters,
    DilatedClock,
    LatenessProbe,
    install_latency,
)
from harness import gather_batch, lifecycle_deps  # noqa: E402

SIDES = ("warm", "cold")
#: Held by every tick of the warm pool (`ticked_one_at_a_time`) and by a jump of the clock: none spans a jump.
TICKING = threading.Lock()


def ticked_one_at_a_time() -> None:
    from rollout_pipeline.lifecycle.warm_pool import TickResult, WarmPool

    original = WarmPool.tick

    def tick(self: WarmPool, *, budget_s: float = 20.0) -> TickResult:
        with TICKING:
            return original(self, budget_s=budget_s)

    WarmPool.tick = tick  # type: ignore[method-assign]


class Timeline:
    """Where admission time goes: per rollout of the step, when its message was first sent to the rollout queue
    (a release), when a dispatcher received it (its SQS batch handed to `dispatch_records`), when its dispatch began
    (`dispatch_body`), when its dispatch transaction committed, and (from the fake) its first invoke; and each release
    (time, rollouts). Installed once (class and module patches); `reset` per side. Virtual seconds."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.on = False
        self.sent: dict[tuple[str, int], float] = {}
        self.received: dict[tuple[str, int], float] = {}
        self.entered: dict[tuple[str, int], float] = {}
        self.begun: dict[tuple[str, int], float] = {}
        self.releases: list[tuple[float, int]] = []
        #: Per SQS batch a dispatcher handled: (dispatcher, received, handled, rollouts).
        self.sqs_batches: list[tuple[str, float, float, int]] = []
        self.rollout_queue_url = ""

    def reset(self, on: bool, rollout_queue_url: str = "") -> None:
        with self.lock:
            self.on = on
            self.rollout_queue_url = rollout_queue_url
            for record in (self.sent, self.received, self.entered, self.begun):
                record.clear()
            self.releases.clear()
            self.sqs_batches.clear()

    @staticmethod
    def _key(body: str) -> tuple[str, int] | None:
        try:
            message = json.loads(body)
            return str(message["input_id"]), int(message["index"])
        except Exception:
            return None

    def _note(self, record: dict[tuple[str, int], float], keys: list[tuple[str, int] | None]) -> None:
        now = time.time()
        with self.lock:
            if self.on:
                for key in keys:
                    if key is not None:
                        record.setdefault(key, now)

    def install(self) -> None:
        from rollout_pipeline.adapters.sqs import SqsQueue
        from rollout_pipeline.feed.feed import Feed
        from rollout_pipeline.ledger.rollouts import DispatchStart, RolloutLedger
        from rollout_pipeline.lifecycle import dispatch

        timeline = self
        send_in_order = Feed._send_in_order

        def sent_in_order(feed: Feed, bodies: list[str]) -> None:
            send_in_order(feed, bodies)
            timeline._note(timeline.sent, [timeline._key(b) for b in bodies])
            with timeline.lock:
                if timeline.on:
                    timeline.releases.append((time.time(), len(bodies)))

        Feed._send_in_order = sent_in_order  # type: ignore[method-assign]
        send_all = SqsQueue.send_all

        def sent_all(queue: SqsQueue, queue_url: str, bodies: Any, delay_seconds: int = 0) -> None:
            send_all(queue, queue_url, bodies, delay_seconds)
            if queue_url == timeline.rollout_queue_url:
                timeline._note(timeline.sent, [timeline._key(b) for b in bodies])

        SqsQueue.send_all = sent_all  # type: ignore[method-assign]
        dispatch_records, dispatch_body = dispatch.dispatch_records, dispatch.dispatch_body

        def records(rs: Any, deps: Any, *, wait_until: float) -> Any:
            timeline._note(timeline.received, [timeline._key(str(r["body"])) for r in rs])
            received = time.time()
            try:
                return dispatch_records(rs, deps, wait_until=wait_until)
            finally:
                with timeline.lock:
                    if timeline.on:
                        timeline.sqs_batches.append((threading.current_thread().name, received, time.time(), len(rs)))

        def body(text: str, deps: Any, **kwargs: Any) -> Any:
            timeline._note(timeline.entered, [timeline._key(text)])
            return dispatch_body(text, deps, **kwargs)

        dispatch.dispatch_records = records  # type: ignore[assignment]
        dispatch.dispatch_body = body  # type: ignore[assignment]
        begin = RolloutLedger.begin_dispatch

        def begin_dispatch(ledger: RolloutLedger, **kwargs: Any) -> Any:
            start = begin(ledger, **kwargs)
            if start is DispatchStart.STARTED:
                timeline._note(timeline.begun, [(str(kwargs["input_id"]), int(kwargs["index"]))])
            return start

        RolloutLedger.begin_dispatch = begin_dispatch  # type: ignore[method-assign]

    def summary(self, submitted: float, invoked: dict[tuple[str, int], float], calls: list[Any]) -> dict[str, Any]:
        """Per stage of admission, seconds from the submit (min, p50, p90, max) and between stages; the last
        rollout's path; the releases (when, how many) and the SQS batches the dispatchers received, with how they
        spent admission (`dispatcher_turnover`); AgentCore's calls during admission by kind (what shared the `tps`
        budget with the rollouts' invokes); the rollouts' first invokes per half second."""
        admitted = max(invoked.values(), default=submitted)
        during: Counter[str] = Counter(
            f"{c.op} {c.outcome}" + (" (warm pool)" if c.warmup else "") for c in calls if submitted <= c.at <= admitted
        )
        with self.lock:
            stages = {
                "sent": dict(self.sent),
                "received": dict(self.received),
                "entered": dict(self.entered),
                "begun": dict(self.begun),
                "invoked": dict(invoked),
            }
            releases, batches = list(self.releases), list(self.sqs_batches)
        names = list(stages)
        since_submit = {n: quantiles([t - submitted for t in stages[n].values()]) for n in names}
        gaps: dict[str, dict[str, float]] = {}
        for a, b in itertools.pairwise(names):
            both = [k for k in stages[b] if k in stages[a]]
            gaps[f"{a}->{b}"] = quantiles([stages[b][k] - stages[a][k] for k in both])
        last = max(invoked, key=lambda k: invoked[k]) if invoked else None
        path = {n: round(stages[n][last] - submitted, 3) for n in names if last is not None and last in stages[n]}
        return {
            "since_submit_s": since_submit,
            "stage_gaps_s": gaps,
            "last_rollout": {"key": list(last) if last else None, **path},
            "releases": len(releases),
            "released_rollouts": sum(n for _t, n in releases),
            "last_release_s": max((t for t, _n in releases), default=submitted) - submitted,
            "release_sizes": sorted({n for _t, n in releases}),
            "release_at_s": [[round(t - submitted, 3), n] for t, n in releases],
            "sqs_batches": len(batches),
            "mean_sqs_batch": (sum(n for *_t, n in batches) / len(batches)) if batches else 0.0,
            **dispatcher_turnover(batches, submitted, admitted),
            "acr_calls_during_admission": dict(during.most_common()),
            # The rollouts' first invokes per half second since the submit: where the takes ran below the schedule.
            "invokes_per_half_second": per_half_second([t - submitted for t in invoked.values()]),
            "invokes_per_s_p10_p90": (
                (0.8 * len(invoked)) / (pct(list(invoked.values()), 0.9) - pct(list(invoked.values()), 0.1))
                if len(invoked) >= 10
                else float("nan")
            ),
        }


def per_half_second(offsets: list[float]) -> list[int]:
    """How many of `offsets` (s) fall in each half second from 0."""
    counts = [0] * (int(max(offsets, default=0.0) * 2) + 1)
    for offset in offsets:
        counts[max(0, int(offset * 2))] += 1
    return counts


def dispatcher_turnover(
    batches: list[tuple[str, float, float, int]], submitted: float, admitted: float
) -> dict[str, Any]:
    """How the dispatchers spent admission (virtual s): an SQS batch's handling (`dispatch_records`: its dispatches,
    the offers settled, the release after it), the gap from one batch's end to the same dispatcher's next, and the
    share of dispatcher time spent handling a batch between the submit and the last rollout's first invoke."""
    by_dispatcher: dict[str, list[tuple[float, float]]] = {}
    for name, received, handled, _n in sorted(batches, key=lambda b: b[1]):
        by_dispatcher.setdefault(name, []).append((received, handled))
    gaps = [b[0] - a[1] for spans in by_dispatcher.values() for a, b in itertools.pairwise(spans)]
    busy = sum(max(0.0, min(h, admitted) - max(r, submitted)) for spans in by_dispatcher.values() for r, h in spans)
    span = max(admitted - submitted, 1e-9) * max(1, len(by_dispatcher))
    return {
        "sqs_batch_handling_s": quantiles([h - r for _name, r, h, _n in batches]),
        "dispatcher_gap_s": quantiles(gaps),
        "dispatchers_busy_share": round(busy / span, 3),
    }


#: Where each side's admission time went (`Timeline.summary` in the figures' `admission`).
TIMELINE = Timeline()


def quantiles(values: list[float]) -> dict[str, float]:
    return {
        "min": round(min(values, default=float("nan")), 3),
        "p50": round(pct(values, 0.5), 3),
        "p90": round(pct(values, 0.9), 3),
        "max": round(max(values, default=float("nan")), 3),
        "n": len(values),
    }


class JumpClock(DilatedClock):
    """The dilated clock, which can also jump ahead (virtual time passes at once: only while nothing runs) and change
    its dilation between phases (a light phase runs less dilated than a burst)."""

    def __init__(self, k: float) -> None:
        super().__init__(k)
        #: (virtual time, real time, virtual monotonic, real monotonic) at the last jump or change of dilation.
        self._anchor = (self._real_time(), self._real_time(), self._real_monotonic(), self._real_monotonic())

    def time(self) -> float:
        virtual, real, _, _ = self._anchor
        return virtual + (self._real_time() - real) / self.k

    def monotonic(self) -> float:
        _, _, virtual, real = self._anchor
        return virtual + (self._real_monotonic() - real) / self.k

    def _reanchor(self, k: float, ahead_s: float) -> None:
        virtual_t, virtual_m = self.time() + ahead_s, self.monotonic() + ahead_s
        self._anchor, self.k = (virtual_t, self._real_time(), virtual_m, self._real_monotonic()), k

    def jump(self, seconds: float) -> None:
        self._reanchor(self.k, max(0.0, seconds))

    def set_dilation(self, k: float) -> None:
        self._reanchor(k, 0.0)

    def install(self) -> None:
        """`DilatedClock.install`, and the lifecycle's `SystemClock` too (the warm pool's wall clock)."""
        super().install()
        from rollout_pipeline import ports
        from rollout_pipeline.contracts import common

        ports.datetime = common.datetime  # type: ignore[attr-defined]


class CountersSwitch:
    """The botocore hooks stay registered across sides (`clients.reset` keeps them): each side counts its own."""

    def __init__(self) -> None:
        self.current = Counters()

    def before_build(self, **kwargs: Any) -> None:
        self.current.before_build(**kwargs)


class Lambdas:
    """One experiment's dispatcher, completer and sweeper Lambdas played by threads running the real handlers, and a
    trainer reading `Group Completed` (bench_scale's harness, minus its feeder)."""

    def __init__(self, resources: Any, deps: Any, counters: Counters, clock: JumpClock, args: argparse.Namespace):
        from rollout_pipeline.adapters import clients

        self.resources, self.deps, self.counters, self.clock, self.args = resources, deps, counters, clock, args
        self.sqs = clients.client("sqs")
        self.visibility = {
            url: int(
                self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])["Attributes"][
                    "VisibilityTimeout"
                ]
            )
            for url in (resources.rollout_queue_url, resources.completion_queue_url, resources.trainer_queue_url)
        }
        self.stop = threading.Event()
        self.kick = threading.Event()  # the sweeper's next scheduled run comes now (after a jump)
        self.errors: list[str] = []
        self.group_done: dict[str, float] = {}

    def receive(self, queue_url: str, n: int = 10) -> list[dict[str, Any]]:
        """Up to `n` messages, as Lambda's poller gathers a batch (`harness.gather_batch`)."""
        self.counters.harness.on = True  # Lambda's poller, not the pipeline
        try:
            return gather_batch(self.sqs, queue_url, n, int(self.clock.wall_s(self.visibility[queue_url])))
        finally:
            self.counters.harness.on = False

    def ack(self, queue_url: str, records: list[dict[str, Any]], failures: dict[str, str]) -> None:
        entries = [
            {"Id": str(i), "ReceiptHandle": r["receiptHandle"]}
            for i, r in enumerate(records)
            if r["messageId"] not in failures
        ]
        for start in range(0, len(entries), 10):  # DeleteMessageBatch takes 10 at most
            self.counters.harness.on = True
            try:
                self.sqs.delete_message_batch(QueueUrl=queue_url, Entries=entries[start : start + 10])
            finally:
                self.counters.harness.on = False

    def loop(self, name: str, queue_url: str, handle: Callable[[list[dict[str, Any]]], Any], batch: int) -> None:
        """One Lambda: batches of up to `batch` messages (its event source's batch size), one at a time."""
        for _ in range(10_000_000):
            if self.stop.is_set():
                return
            try:
                records = self.receive(queue_url, batch)
                if not records:
                    time.sleep(0.1)
                    continue
                result = handle(records)
                self.ack(queue_url, records, result.failures)
                self.errors.extend(result.failures.values())
            except Exception as exc:
                self.errors.append(f"{name}: {exc!r}")

    def sweeper(self) -> None:
        """What the sweeper Lambda runs (`lambdas/sweeper.py`) on the stack's schedule, once a minute: the sweep,
        then the warm pool ticked for `warm_loop_s`. The first run at once (the pause begins as a step ends)."""
        from rollout_pipeline.lifecycle.sweeper import sweep
        from rollout_pipeline.lifecycle.warm_pool import run_pool

        for _ in range(100_000):
            started = time.monotonic()
            try:
                sweep(self.deps, wait_until=started + 30)
                run_pool(self.deps, until=started + self.deps.warm_loop_s)
            except Exception as exc:
                self.errors.append(f"sweeper: {exc!r}")
            for _slice in range(1_000_000):  # until a minute of virtual time passed (the dilation may change)
                if self.kick.is_set() or self.stop.is_set() or time.monotonic() >= started + 60:
                    break
                self.kick.wait(0.5)
            self.kick.clear()
            if self.stop.is_set():
                return

    def trainer(self) -> None:
        for _ in range(10_000_000):
            if self.stop.is_set():
                return
            records = self.receive(self.resources.trainer_queue_url)
            for r in records:
                event = json.loads(r["body"])
                if event.get("detail-type") == "Group Completed":
                    self.group_done.setdefault(event["detail"]["input_id"], time.time())
            if records:
                self.ack(self.resources.trainer_queue_url, records, {})
            else:
                time.sleep(0.05)

    def threads(self) -> list[threading.Thread]:
        from rollout_pipeline.lifecycle.completion import complete_records
        from rollout_pipeline.lifecycle.dispatch import dispatch_records
        from rollout_pipeline.topology import FUNCTIONS

        args, res = self.args, self.resources
        dispatch_deps = [self.deps.for_another_process() for _ in range(args.dispatchers)]  # one slot gate each
        self.dispatch_deps = dispatch_deps
        threads = [
            threading.Thread(target=self.trainer, name="bench-trainer", daemon=True),
            threading.Thread(target=self.sweeper, name="lc-sweeper", daemon=True),
        ]
        threads += [
            threading.Thread(
                target=self.loop,
                name=f"lc-dispatcher-{i}",
                args=(
                    "dispatcher",
                    res.rollout_queue_url,
                    lambda rs, d=d: dispatch_records(rs, d, wait_until=time.monotonic() + 60.0),
                    FUNCTIONS["dispatch"].batch_size or 1,
                ),
                daemon=True,
            )
            for i, d in enumerate(dispatch_deps)
        ]
        threads += [
            threading.Thread(
                target=self.loop,
                name=f"lc-completer-{i}",
                args=(
                    "completer",
                    res.completion_queue_url,
                    lambda rs: complete_records(rs, self.deps, wait_until=time.monotonic() + 30.0),
                    FUNCTIONS["completion"].batch_size or 1,
                ),
                daemon=True,
            )
            for i in range(args.completers)
        ]
        return threads


def progress(side: str, what: str, started_wall: float) -> None:
    """A phase's end on stderr (long runs): wall seconds since the side began, virtual time, the load."""
    print(
        f"  [{side}] {what}: {_REAL_MONOTONIC() - started_wall:.0f} s wall, load {os.getloadavg()[0]:.1f}",
        file=sys.stderr,
        flush=True,
    )


def wait_until(condition: Callable[[], bool], wall_s: float) -> bool:
    """Poll `condition` once a wall second until it holds or `wall_s` wall seconds passed."""
    deadline = _REAL_MONOTONIC() + wall_s
    while _REAL_MONOTONIC() < deadline:
        if condition():
            return True
        _REAL_SLEEP(1.0)
    return condition()


def run_side(
    args: argparse.Namespace, clock: JumpClock, switch: CountersSwitch, warm: bool, profile: Any
) -> dict[str, Any]:
    """One side: its own experiment, fake account and Lambdas; the pause, the step, the tail, then the figures."""
    side = Side(args, clock, switch, warm)
    side.faithful = profile
    side.start()
    side.pause()
    side.step()
    if args.no_tail:
        side.end_now()
        figures = side.figures()  # before the threads are joined (a refill in flight may take a while to end)
        side.finish()
        return figures
    side.tail()
    return side.figures()


class Side:
    """One side's experiment (moto), fake AgentCore account and Lambdas, and what each phase saw."""

    def __init__(self, args: argparse.Namespace, clock: JumpClock, switch: CountersSwitch, warm: bool) -> None:
        from rollout_pipeline.adapters import clients
        from rollout_pipeline.adapters.s3 import S3ObjectStore
        from rollout_pipeline.config import ExperimentConfig
        from rollout_pipeline.fakes.acr import AcrProfile, FakeAgentRuntime
        from rollout_pipeline.ledger.ledger import Ledger
        from rollout_pipeline.local.resources import create_resources
        from rollout_pipeline.quotas import AccountQuotas, PoolSettings

        clients.reset()
        self.args, self.clock, self.warm, self.name = args, clock, warm, "warm" if warm else "cold"
        self.counters = switch.current = Counters()
        self.inputs, self.group_size = max(1, args.rollouts // args.group_size), args.group_size
        self.total = self.inputs * self.group_size
        self.config = ExperimentConfig(
            name=f"bench-{self.name}",
            tps_limit=args.tps_limit,
            invoke_rate_limit=args.tps,
            # Through the account pool, its share of the account's new sessions, as deployed; else the account's.
            session_rate_limit=None if args.account_pool else args.account_quota,
            endpoints=args.endpoints,
            max_sessions=args.max_sessions or self.total,
            group_size=self.group_size,
            rollout_timeout_s=args.rollout_timeout_s,
            max_lifetime_s=args.max_lifetime_s,
            dispatch_concurrency=args.dispatchers,
            warm_sessions=(args.warm_sessions or self.total) if warm else 0,
            warm_idle_stop_s=args.idle_stop_s,
            session_memory_gb=args.session_gb,
        )
        pool_settings = PoolSettings(
            AccountQuotas(
                new_sessions_per_s=args.account_quota,
                data_plane_per_s=args.data_plane_quota,
                active_sessions=args.active_quota,
            ),
            reserve=args.reserve,
        )
        self.resources = create_resources(
            self.config, region="us-east-1", client=clients.client, pool=pool_settings if args.account_pool else False
        )
        self.settings = settings = self.resources.settings()
        rng = random.Random(args.seed)
        self.delays = {
            (f"row-{i}", j): rng.uniform(args.min_delay, args.max_delay)
            for i in range(self.inputs)
            for j in range(self.group_size)
        }
        acr = AcrProfile.realistic(
            endpoints=args.endpoints,
            max_active_sessions=args.active_quota,
            account_new_sessions_per_s=args.account_quota,
            first_invoke_s=args.cold_start_s,
            max_lifetime_s=self.config.max_lifetime_s,  # AgentCore ends every session then, busy or idle
            idle_timeout_s=self.config.idle_timeout_s,
            seed=args.seed,
        )
        self.fake = FakeAgentRuntime(store=S3ObjectStore(), behaviour=self.behaviour, profile=acr)
        deps = lifecycle_deps(settings, self.fake, pooled=args.account_pool, dispatch_threads=args.threads)
        self.ledger = deps.ledger
        self.lambdas = Lambdas(self.resources, deps, self.counters, clock, args)
        self.view_ledger = Ledger.open(settings.table_name)
        self.batch_id = "step-000000000002"
        self.target = self.config.warm_sessions if warm else 0
        self.ok: list[bool] = []
        self.requests: dict[str, int] = {}

    def behaviour(self, inv: Any) -> Any:
        from rollout_pipeline.fakes.acr import AgentBehaviour

        rollout = inv.payload.get("_rollout") or {}
        key = (str(rollout.get("input_id")), int(rollout.get("index") or 0))
        delay = self.delays.get(key, self.args.max_delay)
        return AgentBehaviour(rewards=1.0, delay_s=self.clock.wall_s(delay))  # threading.Timer: the wall clock

    def pipeline_requests(self) -> int:
        with self.counters.lock:
            aws = sum(self.counters.ops.values()) + sum(self.counters.other.values())
        return aws + sum(1 for c in list(self.fake.calls) if c.op in ("invoke", "stop"))

    def dynamodb_sqs_requests(self) -> int:
        with self.counters.lock:
            return sum(self.counters.ops.values()) + sum(
                n for kind, n in self.counters.other.items() if kind.startswith("sqs.")
            )

    def request_kinds(self) -> Counter[str]:
        """The requests counted by `pipeline_requests`, by kind: DynamoDB by the ledger method and operation, other
        AWS calls by service and operation, AgentCore calls by what they were."""
        with self.counters.lock:
            kinds = Counter(self.counters.callers) + Counter(self.counters.other)
        for c in list(self.fake.calls):
            if c.op == "invoke":
                kinds[f"acr.invoke {'warm-up/keep-alive' if c.warmup else 'rollout'}"] += 1
            elif c.op == "stop":
                kinds["acr.stop"] += 1
        return kinds

    def pool_sessions(self) -> int:
        self.counters.harness.on = True
        try:
            return len(self.view_ledger.warm.sessions())
        finally:
            self.counters.harness.on = False

    def in_flight(self) -> int:
        self.counters.harness.on = True
        try:
            return self.view_ledger.limits.in_flight()
        finally:
            self.counters.harness.on = False

    def progress(self, what: str) -> None:
        progress(self.name, what, self.started_wall)

    def start(self) -> None:
        self.load_start = os.getloadavg()
        self.clock.set_dilation(self.args.fill_dilation)
        self.started_wall = _REAL_MONOTONIC()
        self.t0 = time.time()
        self.probe = LatenessProbe()
        self.threads = [*self.lambdas.threads(), threading.Thread(target=self.probe.run, name="bench-probe")]
        for t in self.threads:
            t.daemon = True
            t.start()

    def pause(self) -> None:
        """The trainer's training phase: the pool fills; the rest of the pause passes at once."""
        args = self.args
        full = wait_until(
            lambda: self.pool_sessions() >= self.target or time.time() - self.t0 >= args.pause, args.max_seconds
        )
        self.ok.append(full and not self.lambdas.errors)
        with TICKING:  # no tick of the pool across the jump
            self.clock.jump(self.t0 + args.pause - time.time())
        self.warm_before = self.pool_sessions()
        self.requests["fill"] = self.pipeline_requests()
        self.kinds_at_submit = self.request_kinds()
        self.progress(f"pause over, {self.warm_before} warm sessions")

    def step(self) -> None:
        """The batch created and released as ingestion does (`ingest.core`, through `Feed.submit`)."""
        from bench_lifecycle import seed_groups

        from rollout_pipeline.adapters.sqs import SqsQueue
        from rollout_pipeline.feed.feed import Feed

        self.counters.harness.on = True
        groups = seed_groups(self.resources, self.batch_id, self.inputs, self.group_size)
        view = self.view_ledger.batches.read_batch(self.batch_id)
        self.counters.harness.on = False
        assert view is not None
        with TICKING:
            self.clock.set_dilation(self.args.burst_dilation if self.warm else self.args.dilation)
        TIMELINE.reset(True, self.resources.rollout_queue_url)
        self.submitted = time.time()
        feed = Feed(self.ledger, SqsQueue(), self.settings)
        for start in range(0, len(groups), 100):
            feed.submit(view, groups[start : start + 100])
        feed.submit(view)
        self.ok.append(wait_until(lambda: len(self.lambdas.group_done) >= self.inputs, self.args.max_seconds))
        self.step_end = time.time()
        self.requests["step"] = self.pipeline_requests() - self.requests["fill"]
        self.requests["ddb_sqs"] = self.dynamodb_sqs_requests()
        self.kinds_at_step_end = self.request_kinds()
        self.admission = TIMELINE.summary(self.submitted, rollout_starts(self.fake), list(self.fake.calls))
        TIMELINE.reset(False)
        self.progress(f"step over ({len(self.lambdas.group_done)} of {self.inputs} groups)")
        # The agents are done: the tail is the pool's alone. Not under TICKING: the refill's tick, begun during the
        # step, held it for up to its 50 s budget at the burst's k (~15 min of wall time); a change of dilation is
        # no jump (a sleep begun before it lasts as begun: the tail's requests, not the step's, may show it).
        self.clock.set_dilation(self.args.fill_dilation)

    def tail(self) -> None:
        """The rollouts' sessions stopped, the pool refilled for a next step that never comes, then idle."""

        def settled() -> bool:
            held = self.pool_sessions()
            refilled = held >= self.target or time.time() - self.step_end > 120
            return self.in_flight() == held and (not self.warm or refilled)

        wait_until(settled, self.args.max_seconds)
        self.refilled = self.pool_sessions()
        self.progress(f"settled: {self.refilled} warm sessions, {self.in_flight()} slots held")
        with TICKING:
            self.clock.jump(self.config.warm_idle_stop_s + 1)
        self.lambdas.kick.set()
        self.ok.append(wait_until(lambda: self.in_flight() == 0 and self.pool_sessions() == 0, self.args.max_seconds))
        self.end = time.time()
        self.progress(f"idle: {self.pool_sessions()} warm sessions, {self.in_flight()} slots held")
        self.finish()

    def end_now(self) -> None:
        """`--no-tail`: the side ends with the step (its tail figures are left out: sessions are left running). The
        pool is halted first (nothing stopped), so a refill in progress ends at its next chunk."""
        from rollout_pipeline.lifecycle.warm_pool import HALT_STOPPED, WarmPool

        self.refilled = self.pool_sessions()
        self.end = time.time()
        self.counters.harness.on = True
        try:
            WarmPool(self.lambdas.deps).halt(HALT_STOPPED, stop=False)
        finally:
            self.counters.harness.on = False
        self.requests["tail"] = 0

    def finish(self) -> None:
        self.lambdas.stop.set()
        self.lambdas.kick.set()
        self.probe.stop.set()
        for t in self.threads:
            t.join(timeout=30)
        self.fake.close()
        self.requests["tail"] = self.pipeline_requests() - self.requests["fill"] - self.requests["step"]

    def figures(self) -> dict[str, Any]:

        fake, total, submitted = self.fake, self.total, self.submitted
        prices = self.lambdas.deps.prices  # the experiment's (`LifecycleDeps.prices`)
        calls = list(fake.calls)
        started_at = rollout_starts(fake)
        done = sorted(self.lambdas.group_done.values())
        idle = warm_idle(calls, submitted, self.end)
        invoked = {c.session_id for c in calls if c.op == "invoke" and c.outcome not in ("throttled", "quota_exceeded")}
        fill, step, tail = (self.requests[k] for k in ("fill", "step", "tail"))
        errors = self.lambdas.errors
        return {
            "ok": bool(all(self.ok) and len(started_at) == total and not errors),
            "rollouts": total,
            "warm_sessions": self.config.warm_sessions,
            "warm_before_submit": self.warm_before,
            "warm_after_step": self.refilled,
            "admit_s": max(started_at.values(), default=float("nan")) - submitted,
            # What the limits allow at best: warm, every take one `tps` call (the new sessions' share set apart);
            # cold, every rollout a new session at the account's rate.
            "admit_bound_s": admit_bound_s(self.config, total, self.warm),
            # The invoke rate (`--invoke-tps`, the agent's quota) and the busiest sliding second of the side's
            # invokes (warm-ups, keep-alives and rollouts) and of all its data-plane calls: within it, and within
            # the data-plane budget.
            "invoke_rate": budgets(self.config)[0],
            "stops_share_the_takes_budget": budgets(self.config)[2],
            "busiest_second_invokes": busiest_second([c.at for c in calls if c.op == "invoke"]),
            "busiest_second_calls": busiest_second([c.at for c in calls if c.op in ("invoke", "stop")]),
            "admit_bound_with_stops_s": (
                admit_bound_with_stops_s(self.args, self.config, total) if self.warm else float("nan")
            ),
            "first_group_s": done[0] - submitted if done else float("nan"),
            "step_s": done[-1] - submitted if done else float("nan"),
            "cold_starts_on_path": sum(
                1 for c in calls if c.op == "invoke" and c.outcome == "cold_start" and not c.warmup
            ),
            "rollouts_in_warm_sessions": fake.warm_reuses,
            "warm_idle_gb_s": prices.memory_gb_s(idle["step"]),
            "warm_idle_usd": prices.memory_usd(idle["step"]),
            "tail_idle_gb_s": prices.memory_gb_s(idle["tail"]),
            "tail_idle_usd": prices.memory_usd(idle["tail"]),
            "priced_as": prices.label,
            "sessions_never_stopped": float("nan") if self.args.no_tail else len(invoked - fake.stopped),
            "requests_per_rollout": (fill + step) / total,
            # DynamoDB and SQS requests alone (the warm queue's receives, deletes and give-backs included).
            "dynamodb_sqs_per_rollout": self.requests["ddb_sqs"] / total,
            "requests_per_rollout_with_tail": float("nan") if self.args.no_tail else (fill + step + tail) / total,
            "requests": dict(self.requests),
            "left_after_idle": {
                "in_flight": self.in_flight(),
                "warm": self.pool_sessions(),
                "running": len(fake.running),
            },
            "pool": dataclasses.asdict(self.view_ledger.warm.pool()),
            "requests_by_stage": dict(self.counters.stages.most_common()),
            # The dispatchers' views of the pool: reads, sessions taken, tries that found theirs taken by another.
            # The dispatchers' warm offers: received (receives), taken, stale (deleted unread), refused (collided).
            "warm_takes": {
                name: sum(d.warm.counts[name] for d in self.lambdas.dispatch_deps)
                for name in ("received", "receives", "taken", "stale", "refused")
            },
            "take_collisions": sum(d.warm.counts["refused"] for d in self.lambdas.dispatch_deps),
            "lifetime_ends": len(fake.lifetime_ends),  # and below, the ones a rollout was running in
            "rollouts_lost_to_lifetime_ends": len(fake.lifetime_ends_busy),
            "faithful": dataclasses.asdict(self.faithful.stats),
            "admission": self.admission,
            # Per rollout, the fill and the step (what `requests_per_rollout` counts), by kind; and the fill alone.
            "requests_per_rollout_by_kind": per_rollout(self.kinds_at_step_end, total),
            "fill_requests_per_rollout_by_kind": per_rollout(self.kinds_at_submit, total),
            "errors": len(errors),
            "first_errors": errors[:3],
            "machine": {
                "load_start": self.load_start,
                "load_end": os.getloadavg(),
                "wall_s": _REAL_MONOTONIC() - self.started_wall,
                "clock_lateness_ms_p50": pct(self.probe.late_ms, 0.5),
                "clock_lateness_ms_p95": pct(self.probe.late_ms, 0.95),
            },
        }


def busiest_second(times: list[float]) -> int:
    """The most calls in any sliding second [t, t + 1) (virtual time)."""
    ordered = sorted(times)
    best, j = 0, 0
    for i, start in enumerate(ordered):
        j = max(j, i)
        while j < len(ordered) and ordered[j] < start + 1.0:
            j += 1
        best = max(best, j - i)
    return best


def per_rollout(kinds: Counter[str], rollouts: int) -> dict[str, float]:
    return {kind: round(n / rollouts, 3) for kind, n in kinds.most_common() if n}


def rollout_starts(fake: Any) -> dict[tuple[str, int], float]:
    """Each rollout's first invoke that started it (virtual time), by (input id, index)."""
    started_at: dict[tuple[str, int], float] = {}
    for c in list(fake.calls):
        if c.op == "invoke" and not c.warmup and c.outcome in ("started", "reinvoked"):
            rollout = fake.payloads.get(c.session_id, {}).get("_rollout") or {}
            started_at.setdefault((str(rollout.get("input_id")), int(rollout.get("index") or 0)), c.at)
    return started_at


def budgets(config: Any) -> tuple[float, float, bool]:
    """(invoke rate, the `tps` schedule's rate, whether stops share it) as the experiment's limits make them
    (`limits.facade.own_limits` and `limits.pacing.call_budgets`, through the pool or not): the invoke rate
    `config.invoke_rate_cap` (`--invoke-tps`), the new sessions' share (at most half of it) always set apart, stops
    on a budget of their own when `dedicated_stop_share`."""
    from rollout_pipeline.config import invoke_rate_cap
    from rollout_pipeline.limits.facade import own_limits
    from rollout_pipeline.limits.pacing import dedicated_stop_share

    data_plane, session_rate = own_limits(config)
    invoke_rate = invoke_rate_cap(config.invoke_rate_limit, data_plane)
    apart = dedicated_stop_share(data_plane, invoke_rate)
    invokes = invoke_rate if apart else min(data_plane, invoke_rate)
    return invokes, invokes - min(session_rate, invokes / 2), not apart


def admit_bound_s(config: Any, rollouts: int, warm: bool) -> float:
    """The least admission time the limits allow: warm, `rollouts` calls on the `tps` budget (its share for new
    sessions set apart, each call spaced by `LATENESS_S`); cold, `rollouts` new sessions at the session budget."""
    from rollout_pipeline.limits.facade import own_limits
    from rollout_pipeline.limits.pacing import LATENESS_S

    if not warm:
        return rollouts / own_limits(config)[1]
    _invokes, tps, _shared = budgets(config)
    return rollouts * (1 + LATENESS_S) / tps


def admit_bound_with_stops_s(args: argparse.Namespace, config: Any, rollouts: int) -> float:
    """`admit_bound_s` (warm) when the step's own stops share the `tps` budget (`budgets`; when they have their own,
    `admit_bound_s`): a rollout that started more than the agents' mean time before the end of admission is stopped
    within it, and stops go first (`pacing`). With takes spread evenly over T at rate `r` calls/s:
    r T = N + (N / T)(T - d), so T = (N + sqrt(N^2 - r N d)) / r (or N / r when admission is shorter than the agents:
    no stop falls within it)."""
    floor = admit_bound_s(config, rollouts, warm=True)
    if not budgets(config)[2]:
        return floor
    rate, mean_s = rollouts / floor, (args.min_delay + args.max_delay) / 2
    if floor <= mean_s:
        return floor
    return (rollouts + math.sqrt(rollouts * rollouts - rate * rollouts * mean_s)) / rate


def warm_idle(calls: list[Any], submitted: float, end: float) -> dict[str, float]:
    """Seconds warm sessions waited, summed: from their first warm-up to their rollout's invoke or their stop (or
    `end`). `step`: sessions warmed before `submitted` (what bought this step's start); `tail`: the ones warmed
    after (the next step's pool, stopped when the experiment went idle)."""
    warmed: dict[str, float] = {}
    ended: dict[str, float] = {}
    for c in calls:
        if c.op == "invoke" and c.warmup:
            warmed.setdefault(c.session_id, c.at)
        elif (
            c.session_id in warmed
            and c.session_id not in ended
            and ((c.op == "invoke" and not c.warmup) or (c.op == "stop" and c.outcome in ("stopped", "unknown")))
        ):
            ended[c.session_id] = c.at
    out = {"step": 0.0, "tail": 0.0}
    for sid, at in warmed.items():
        out["step" if at < submitted else "tail"] += max(0.0, ended.get(sid, end) - at)
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def compare(sides: dict[str, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The warm pool's balance: seconds saved per step against its idle memory, and the targets it aims at."""
    warm, cold = sides.get("warm"), sides.get("cold")
    if warm is None or cold is None:
        return {}
    saved_s = cold["step_s"] - warm["step_s"]
    admit_saved_s = cold["admit_s"] - warm["admit_s"]
    usd = warm["warm_idle_usd"]
    return {
        "step_s_saved": saved_s,
        "admit_s_saved": admit_saved_s,
        "idle_usd_per_step": usd,
        "session_gb": args.session_gb,
        # The trainer's cost per hour above which the saved seconds are worth more than the idle memory.
        "break_even_trainer_usd_per_hour": usd / (saved_s / 3600) if saved_s > 0 else float("inf"),
        "requests_ratio": warm["requests_per_rollout"] / cold["requests_per_rollout"],
        "requests_ratio_with_tail": warm["requests_per_rollout_with_tail"] / cold["requests_per_rollout_with_tail"],
        "targets": {
            "step_s_lower_by_admission_saved": saved_s >= admit_saved_s,
            "sessions_never_stopped_0": warm["sessions_never_stopped"] == 0 and cold["sessions_never_stopped"] == 0,
        },
    }


def warm_targets(figures: dict[str, Any]) -> dict[str, bool]:
    """The warm side's targets (docs/benchmarks.md, "Warm start")."""
    return {
        "admit_s_within_1_35x_rollouts_over_invoke_rate": (
            figures["admit_s"] <= 1.35 * figures["rollouts"] / figures["invoke_rate"]
        ),
        "cold_starts_on_path_0": figures["cold_starts_on_path"] == 0,
        "take_collisions_0": figures["take_collisions"] == 0,
        "sessions_never_stopped_0": figures["sessions_never_stopped"] == 0,
        "dynamodb_sqs_per_rollout_at_most_16": figures["dynamodb_sqs_per_rollout"] <= 16,
        "rollouts_lost_to_lifetime_ends_0": figures["rollouts_lost_to_lifetime_ends"] == 0,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dilation", type=float, default=4.0, help="the cold step's k: a virtual s lasts k wall s")
    parser.add_argument("--burst-dilation", type=float, default=20.0, help="the warm step's k (its burst)")
    parser.add_argument("--fill-dilation", type=float, default=1.5, help="k while the pool fills or stops")
    parser.add_argument("--rollouts", type=int, default=1024)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--pause", type=float, default=120.0, help="virtual s between the step's end and the next")
    parser.add_argument("--warm-sessions", type=int, default=0, help="the pool's size (default: the batch's)")
    parser.add_argument("--max-sessions", type=int, default=0, help="default: the batch's size")
    parser.add_argument("--account-quota", type=float, default=25.0, help="new sessions/s per account")
    parser.add_argument("--endpoints", type=int, default=4)
    parser.add_argument(
        "--invoke-tps",
        "--tps",
        dest="tps",
        type=int,
        default=200,
        help="AgentCore's InvokeAgentRuntime quota per agent (200 by default, adjustable), set as the experiment's "
        "invoke_rate_limit: every invoke within it; stops are on the data-plane budget (see --tps-limit)",
    )
    parser.add_argument(
        "--tps-limit",
        type=int,
        default=None,
        help="the experiment's tps_limit (its data-plane calls/s: invokes and stops); default none: the account's "
        "data-plane budget (1,000/s less the 10%% reserve), which leaves stops a budget of their own",
    )
    parser.add_argument(
        "--account-pool",
        action="store_true",
        help="run each side through the account pool's leases, as a deployed experiment does (LifecycleDeps.pool): "
        "its new sessions, data-plane calls and active sessions leased from the pool (the invoke rate still caps the "
        "invokes; stops get a leased schedule of their own while the calls granted are twice the invoke rate)",
    )
    parser.add_argument("--data-plane-quota", type=float, default=1000.0, help="with --account-pool: calls/s")
    parser.add_argument("--reserve", type=float, default=0.0, help="with --account-pool: the pool's reserve")
    parser.add_argument("--active-quota", type=int, default=5000, help="active sessions per account")
    parser.add_argument("--cold-start-s", type=float, default=1.3, help="a session's first invoke answers this late")
    parser.add_argument("--min-delay", type=float, default=2.0, help="agent time before the result (virtual s)")
    parser.add_argument("--max-delay", type=float, default=6.0)
    parser.add_argument("--idle-stop-s", type=int, default=600, help="warm_idle_stop_s")
    parser.add_argument("--rollout-timeout-s", type=int, default=900, help="rollout_timeout_s")
    parser.add_argument("--max-lifetime-s", type=int, default=None, help="max_lifetime_s, the fake's too (derived)")
    parser.add_argument(
        "--session-gb", type=float, default=8.0, help="the experiment's session_memory_gb (default: its default, 8)"
    )
    parser.add_argument(
        "--dispatchers",
        type=int,
        default=None,
        help="dispatcher Lambdas (default: what a stack derives, config.derived_dispatch_concurrency)",
    )
    parser.add_argument("--completers", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=None, help="threads per dispatcher (default: its SQS batch, DISPATCH_BATCH)"
    )
    parser.add_argument("--sides", default="warm,cold", help="which sides to run")
    parser.add_argument("--max-seconds", type=float, default=600.0, help="WALL seconds per phase at most")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--no-tail",
        action="store_true",
        help="end each side with its step (quicker; no tail figures, sessions_never_stopped not measured)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    sides = [s for s in args.sides.split(",") if s]
    if (
        not set(sides) <= set(SIDES)
        or not 8 <= args.rollouts <= 4096
        or not 1 <= min(args.dilation, args.burst_dilation, args.fill_dilation) <= 100
    ):
        parser.error("--sides of warm,cold; --rollouts within 8..4096; --dilation within 1..100")
    derive_lambdas(args)
    return args


def derive_lambdas(args: argparse.Namespace) -> None:
    """The dispatchers and their threads a deployed stack gives the bench's experiment when none are set: the
    derived dispatch concurrency (its share of the account's new sessions, the reserve set apart, and the warm
    side's takes at the invoke rate; the cold side gets the same) and one thread per rollout of a dispatcher's SQS
    batch."""
    from rollout_pipeline.config import DISPATCH_BATCH, derived_dispatch_concurrency, invoke_rate_cap
    from rollout_pipeline.quotas import DEFAULT_RESERVE

    if args.dispatchers is None:
        args.dispatchers = derived_dispatch_concurrency(
            session_rate_limit=None,
            tps_limit=args.tps_limit,
            max_sessions=args.max_sessions or args.rollouts,
            account_sessions_per_s=args.account_quota * (1 - (args.reserve if args.account_pool else DEFAULT_RESERVE)),
            warm_invoke_rate=invoke_rate_cap(args.tps, args.tps_limit),  # the warm side's (the cold side: the same)
        )
    if args.threads is None:
        args.threads = DISPATCH_BATCH


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sides = [s for s in args.sides.split(",") if s]

    clock = JumpClock(args.dilation)
    clock.install()  # before anything imports the pipeline

    from bench_acr_quotas import _serialise_dynamodb, _time_moto
    from bench_lifecycle import _fake_aws_env
    from moto import mock_aws

    from rollout_pipeline.adapters import clients
    from rollout_pipeline.fakes import faithful
    from rollout_pipeline.local.moto_server import patch_moto

    _fake_aws_env()
    _time_moto("inner")
    _serialise_dynamodb()
    patch_moto()
    switch = CountersSwitch()
    clients.register_hook("before-parameter-build", switch.before_build)
    install_latency(clients, random.Random(args.seed + 7))
    ticked_one_at_a_time()
    TIMELINE.install()
    results: dict[str, Any] = {}
    for side in sides:
        if not args.json:
            k = args.burst_dilation if side == "warm" else args.dilation
            print(f"bench_warm: {side} side, step at k={k:g}, load {os.getloadavg()[0]:.1f} ...", flush=True)
        profile = faithful.FaithfulProfile(seed=args.seed)
        with faithful.activate(profile), mock_aws():
            results[side] = run_side(args, clock, switch, warm=side == "warm", profile=profile)
    if "warm" in results:
        results["warm"]["targets"] = warm_targets(results["warm"])
    out = {
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        **results,
        "comparison": compare(results, args),
        "cpus": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(out, indent=1, sort_keys=True))
    else:
        print_report(out)
    return 0 if all(r["ok"] for r in results.values()) else 1


def print_report(out: dict[str, Any]) -> None:
    sides = [s for s in SIDES if s in out]
    rows = [
        ("admit_s", "{:.1f}"),
        ("admit_bound_s", "{:.1f}"),
        ("admit_bound_with_stops_s", "{:.1f}"),
        ("invoke_rate", "{:.0f}"),
        ("busiest_second_invokes", "{}"),
        ("busiest_second_calls", "{}"),
        ("first_group_s", "{:.1f}"),
        ("step_s", "{:.1f}"),
        ("cold_starts_on_path", "{}"),
        ("rollouts_in_warm_sessions", "{}"),
        ("warm_before_submit", "{}"),
        ("warm_idle_gb_s", "{:.0f}"),
        ("warm_idle_usd", "{:.4f}"),
        ("tail_idle_usd", "{:.4f}"),
        ("take_collisions", "{}"),
        ("rollouts_lost_to_lifetime_ends", "{}"),
        ("sessions_never_stopped", "{}"),
        ("requests_per_rollout", "{:.1f}"),
        ("dynamodb_sqs_per_rollout", "{:.1f}"),
        ("requests_per_rollout_with_tail", "{:.1f}"),
        ("errors", "{}"),
    ]
    print(f"{'':32}" + "".join(f"{s:>12}" for s in sides))
    for name, fmt in rows:
        print(f"{name:32}" + "".join(f"{fmt.format(out[s][name]):>12}" for s in sides))
    for s in sides:
        m = out[s]["machine"]
        print(
            f"{s}: wall {m['wall_s']:.0f} s, load {m['load_start'][0]:.1f} -> {m['load_end'][0]:.1f}, clock lateness "
            f"p50 {m['clock_lateness_ms_p50']:.1f} ms p95 {m['clock_lateness_ms_p95']:.1f} ms"
            + (f"; errors: {out[s]['first_errors']}" if out[s]["errors"] else "")
        )
    c = out.get("comparison") or {}
    if c:
        print(
            f"saved per step: {c['step_s_saved']:.1f} s (admission {c['admit_s_saved']:.1f} s) for "
            f"${c['idle_usd_per_step']:.4f} of idle warm-session memory at {c['session_gb']:g} GB a session: worth it "
            f"when the trainer costs more than ${c['break_even_trainer_usd_per_hour']:.2f}/hour; requests per rollout "
            f"{c['requests_ratio']:.2f}x the pool off ({c['requests_ratio_with_tail']:.2f}x with the tail)"
        )
        print("targets: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in c["targets"].items()))
    if "warm" in out:
        print("warm targets: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in out["warm"]["targets"].items()))


if __name__ == "__main__":
    raise SystemExit(main())
