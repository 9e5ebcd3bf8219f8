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
import datetime as _datetime
import itertools
import json
import math
import os
import random
import resource
import statistics
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
from prices import PRICES  # noqa: E402

_REAL_TIME: Callable[[], float] = time.time
_REAL_MONOTONIC: Callable[[], float] = time.monotonic
_REAL_SLEEP: Callable[[float], None] = time.sleep
_REAL_DATETIME = _datetime.datetime

#: Injected DynamoDB latencies (median, seconds) per operation; log-normal around the median (sigma 0.35, so the
#: p99 is ~2.3x the median). AWS publishes "single-digit millisecond" latency for item reads and writes
#: (https://aws.amazon.com/dynamodb/) and no figure for transactions; TransactWriteItems is taken as ~2.5x a write
#: (it is a two-phase write: https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/transaction-apis.html)
#: and equals the faithful profile's default hold (`FaithfulProfile.hold_ms`).
DYNAMODB_LATENCY_S: dict[str, float] = {
    "GetItem": 0.004,
    "BatchGetItem": 0.006,
    "Query": 0.006,
    "PutItem": 0.006,
    "UpdateItem": 0.006,
    "DeleteItem": 0.006,
    "BatchWriteItem": 0.010,
    "TransactGetItems": 0.010,
    "TransactWriteItems": 0.015,
}
LATENCY_SIGMA = 0.35

#: USD per million of each counted request or unit (`prices.py`: us-east-1 list prices, with their sources).
PRICE_PER_MILLION = {
    name: PRICES[key] * 1e6
    for name, key in {
        "WRU": "dynamodb_wru",
        "RRU": "dynamodb_rru",
        "sqs": "sqs_request",
        "s3_get": "s3_get",
        "s3_put": "s3_put",
        "event": "eventbridge_custom_event",
        "lambda_request": "lambda_request",
        "lambda_gb_s": "lambda_gb_s_arm",
    }.items()
}


class DilatedClock:
    """A process-wide clock k times slower than the wall clock: virtual = origin + (real - origin) / k."""

    def __init__(
        self,
        k: float,
        real_time: Callable[[], float] = _REAL_TIME,
        real_monotonic: Callable[[], float] = _REAL_MONOTONIC,
        real_sleep: Callable[[float], None] = _REAL_SLEEP,
    ) -> None:
        if k < 1:
            raise ValueError("dilation must be >= 1")
        self.k = k
        self._real_time = real_time
        self._real_monotonic = real_monotonic
        self._real_sleep = real_sleep
        self._t0 = real_time()
        self._m0 = real_monotonic()

    def time(self) -> float:
        return self._t0 + (self._real_time() - self._t0) / self.k

    def monotonic(self) -> float:
        return self._m0 + (self._real_monotonic() - self._m0) / self.k

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._real_sleep(seconds * self.k)

    def wall_s(self, virtual_s: float) -> float:
        """Wall seconds that `virtual_s` virtual seconds last."""
        return virtual_s * self.k

    def install(self) -> None:
        """Replace `time.time/monotonic/sleep` and the pipeline's `utcnow` (call BEFORE importing the pipeline:
        default arguments such as `Pacer(wall=time.time)` bind at import)."""
        time.time = self.time
        time.monotonic = self.monotonic
        time.sleep = self.sleep
        clock = self

        class VirtualDatetime(_REAL_DATETIME):
            @classmethod
            def now(cls, tz: Any = None) -> Any:  # type: ignore[override]
                return _REAL_DATETIME.fromtimestamp(clock.time(), tz)

        from rollout_pipeline.contracts import common

        common.datetime = VirtualDatetime  # type: ignore[misc]


def item_category(pk: str, sk: str) -> str:
    """A ledger item's kind for the request counts: LIMIT/SESSIONS, LIMIT/PACE#tps, LIMIT/WAIT#*, BATCH, ..."""
    if pk == "LIMIT":
        for prefix in ("WAIT#", "TPS#", "SESSIONS#"):
            if sk.startswith(prefix):
                return f"LIMIT/{prefix}*"
        return f"LIMIT/{sk}"
    if pk.startswith("B#"):
        if sk.startswith("BATCH#COUNT#"):
            return "BATCH#COUNT#*"
        if sk in ("BATCH", "BATCH#CONTROL"):
            return sk
        if sk.startswith("BATCH#CONTROL#"):
            return "BATCH#CONTROL#*"
        if sk.startswith("P#"):
            return "pending P#*"
        if sk.startswith("G#"):
            return "group G#*"
        if sk.startswith("R#"):
            return "rollout R#*"
    return f"{pk.split('#', 1)[0]}/{sk.split('#', 1)[0]}"


def _category_of_item(text: str) -> str:
    """The kind of an item as the faithful profile names it (`faithful.key_text`)."""
    key = json.loads(text)
    return item_category(str((key.get("pk") or {}).get("S", "")), str((key.get("sk") or {}).get("S", "")))


def _key_of(key: Any) -> tuple[str, str]:
    key = key or {}
    return str((key.get("pk") or {}).get("S", "")), str((key.get("sk") or {}).get("S", ""))


def request_items(operation: str, params: dict[str, Any]) -> list[str]:
    """The categories of the items one DynamoDB request touches (one entry per item; a Query: its index or pk)."""
    if operation in ("GetItem", "UpdateItem", "DeleteItem"):
        return [item_category(*_key_of(params.get("Key")))]
    if operation == "PutItem":
        return [item_category(*_key_of(params.get("Item")))]
    if operation == "TransactWriteItems":
        out = []
        for entry in params.get("TransactItems") or []:
            for op, body in entry.items():
                out.append(item_category(*_key_of(body.get("Item") if op == "Put" else body.get("Key"))))
        return out
    if operation == "TransactGetItems":
        return [item_category(*_key_of(e.get("Get", {}).get("Key"))) for e in params.get("TransactItems") or []]
    if operation == "Query":
        if params.get("IndexName"):
            return [f"index {params['IndexName']}"]
        values = params.get("ExpressionAttributeValues") or {}
        if ":to" in values:  # the release window's look ahead over the pending groups (`ledger.release`)
            return ["query pending P#*"]
        pks = [str(v.get("S", "")) for v in values.values() if isinstance(v, dict)]
        return [f"query {pks[0].split('#', 1)[0] if pks else '?'}"]
    if operation in ("BatchGetItem", "BatchWriteItem"):
        out = []
        for requests in (params.get("RequestItems") or {}).values():
            entries = requests.get("Keys", []) if isinstance(requests, dict) else requests
            for entry in entries:
                key = entry.get("PutRequest", {}).get("Item") or entry.get("DeleteRequest", {}).get("Key") or entry
                out.append(item_category(*_key_of(key)))
        return out
    return ["other"]


def stage_of(thread_name: str) -> str:
    """The pipeline stage a thread plays (dispatcher/completer/sweeper 'Lambdas' and their worker pools)."""
    if thread_name.startswith(("lc-dispatcher", "dispatch")):
        return "dispatch"
    if thread_name.startswith(("lc-completer", "complet", "stop")):
        return "completion"
    if thread_name.startswith("lc-sweeper"):
        return "sweeper"
    return "other"


def sliding_max(times: list[float], width: float = 1.0) -> int:
    """The most events in any window [t, t + width) (`bench_acr_quotas.busiest_window`, imported only once the
    virtual clock is installed, as every pipeline import here)."""
    from bench_acr_quotas import busiest_window

    return busiest_window(times, width)


def steady_rate(times: list[float], trim: float = 0.1) -> float:
    """Events per second over the middle (1 - 2 x trim) of the events: the sustained rate without ramp-up/down."""
    ordered = sorted(times)
    if len(ordered) < 10:
        return float("nan")
    lo, hi = int(len(ordered) * trim), int(len(ordered) * (1 - trim)) - 1
    span = ordered[hi] - ordered[lo]
    return (hi - lo) / span if span > 0 else float("nan")


class Counters:
    """DynamoDB (and other AWS) requests made by the pipeline, from botocore hooks; harness calls are excluded."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ops: Counter[str] = Counter()
        self.items: Counter[str] = Counter()  # requests touching each item kind
        self.stages: Counter[str] = Counter()
        self.other: Counter[str] = Counter()
        self.wru = 0.0
        self.rru = 0.0
        self.wru_items: Counter[str] = Counter()  # WRU by item kind (a transaction's 2 per item, to each item)
        self.capacity_callers: Counter[str] = Counter()  # WRU + RRU by the ledger method that made the request
        self.harness = threading.local()
        # Billed outside the pipeline's own calls (the all-in cost): SQS requests of Lambda's pollers and the
        # trainer (receives that return messages, delete batches; empty polls are a per-hour cost, not a rollout's),
        # messages EventBridge rules deliver into SQS, and each "Lambda"'s invocations and virtual seconds.
        self.poller_sqs = 0
        self.event_entries = 0
        self.delivered: Counter[str] = Counter()
        self.lambda_calls: Counter[str] = Counter()
        self.lambda_s: Counter[str] = Counter()

    def invoked(self, function: str, started: float) -> None:
        """One invocation of `function` (a `topology.FUNCTIONS` name) that began at `started` (monotonic)."""
        with self.lock:
            self.lambda_calls[function] += 1
            self.lambda_s[function] += time.monotonic() - started

    def before_build(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        if getattr(self.harness, "on", False) or threading.current_thread().name.startswith(("bench-", "Main")):
            return
        operation = model.name
        service = model.service_model.service_name
        if service != "dynamodb":
            with self.lock:
                self.other[f"{service}.{operation}"] += 1
                if operation == "PutEvents":  # EventBridge bills each entry, not each call
                    self.event_entries += len(params.get("Entries") or [])
            return
        touched = request_items(operation, params)
        with self.lock:
            self.ops[operation] += 1
            self.stages[stage_of(threading.current_thread().name)] += 1
            for category in set(touched):
                self.items[category] += 1
            wru, rru = capacity_units(operation, touched)
            self.wru += wru
            self.rru += rru
            per_item = 2 if operation == "TransactWriteItems" else 1
            if wru:
                for category in touched:
                    self.wru_items[category] += per_item
            self.capacity_callers[f"{ledger_caller()} {operation}"] += wru + rru


def capacity_units(operation: str, touched: list[str]) -> tuple[float, float]:
    """(WRU, RRU) of one request, items under 1 KB: 1 WRU per plain write, 2 per item of a transaction (cancelled
    ones included), 1 RRU per strongly consistent GetItem / Query page (under 4 KB), 2 per item of TransactGet."""
    if operation in ("PutItem", "UpdateItem", "DeleteItem"):
        return 1.0, 0.0
    if operation == "TransactWriteItems":
        return 2.0 * len(touched), 0.0
    if operation == "BatchWriteItem":
        return float(len(touched)), 0.0
    if operation == "TransactGetItems":
        return 0.0, 2.0 * len(touched)
    if operation == "BatchGetItem":
        return 0.0, float(len(touched))
    return 0.0, 1.0


def ledger_caller() -> str:
    """Who made the request now being built: the innermost pipeline frame on this thread's stack that is not the
    table gateway or the retry loop (a ledger method), and the first frame outside `ledger/` that called it."""

    def name(frame: Any) -> str:
        module = frame.f_code.co_filename.rsplit("rollout_pipeline/", 1)[-1].removesuffix(".py").replace("/", ".")
        return f"{module}.{frame.f_code.co_name}"

    frame = sys._getframe(2)
    inner = ""
    while frame is not None:
        path = frame.f_code.co_filename
        if "rollout_pipeline/" in path and path.rsplit("/", 1)[-1] not in ("table.py", "retry.py", "attributes.py"):
            if not inner:
                inner = name(frame)
                if "rollout_pipeline/ledger/" not in path:
                    return inner
            elif "rollout_pipeline/ledger/" not in path:
                return f"{inner}<-{name(frame)}"
        frame = frame.f_back
    return inner or "?"


def slot_phase(calls: list[Any], max_sessions: int, share: float = 0.95) -> dict[str, float]:
    """The sessions running over time, replayed from the fake's calls (a first invoke starts a session, a
    successful stop ends it), once they first reach `share` x `max_sessions`: new sessions/s and the running
    sessions' time-weighted mean and minimum from then to the last new session. {} if they never do."""
    ordered = sorted(calls, key=lambda c: c.at)
    running: set[str] = set()
    started: set[str] = set()
    phase_start: float | None = None
    last_start = 0.0
    trace: list[tuple[float, int]] = []  # (time, running after the call) from the phase's start on
    new_in_phase = 0
    for call in ordered:
        if call.op == "invoke" and call.outcome in ("started", "cold_start", "reinvoked"):
            if call.session_id not in started:
                started.add(call.session_id)
                last_start = call.at
                new_in_phase += phase_start is not None
            running.add(call.session_id)
        elif call.op == "stop" and call.outcome == "stopped":
            running.discard(call.session_id)
        if phase_start is None and len(running) >= share * max_sessions:
            phase_start = call.at
        if phase_start is not None:
            trace.append((call.at, len(running)))
    if phase_start is None or last_start <= phase_start:
        return {}
    span = last_start - phase_start
    weighted = sum(
        count * (min(nxt, last_start) - at) for (at, count), (nxt, _n) in itertools.pairwise(trace) if at < last_start
    )
    in_phase = [count for at, count in trace if at <= last_start]
    return {
        "from_s": phase_start - ordered[0].at,
        "to_s": last_start - ordered[0].at,
        "new_sessions_per_s": new_in_phase / span,
        "mean_running": weighted / span,
        "mean_running_vs_max_sessions": weighted / span / max_sessions,
        "min_running": min(in_phase),
    }


def install_latency(clients: Any, rng: random.Random) -> None:
    """Sleep a sampled DynamoDB latency (virtual seconds) after every DynamoDB call, conflicts included."""
    lock = threading.Lock()

    def after_call(model: Any, **_: Any) -> None:
        median = DYNAMODB_LATENCY_S.get(model.name, 0.006)
        with lock:
            latency = median * math.exp(rng.gauss(0.0, LATENCY_SIGMA))
        time.sleep(latency)

    clients.register_hook("after-call.dynamodb", after_call)


class LatenessProbe:
    """How late the (virtual) clock wakes a sleeping thread: the machine's load seen in virtual time."""

    def __init__(self) -> None:
        self.late_ms: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        for _ in range(100_000):
            if self.stop.is_set():
                return
            started = time.monotonic()
            time.sleep(0.05)
            self.late_ms.append((time.monotonic() - started - 0.05) * 1000)


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

    from bench_acr_quotas import _serialise_dynamodb, _time_moto
    from bench_lifecycle import _fake_aws_env
    from moto import mock_aws

    from rollout_pipeline.fakes import faithful
    from rollout_pipeline.local.moto_server import patch_moto

    _fake_aws_env()
    _time_moto("inner")
    _serialise_dynamodb()
    patch_moto()  # transactions and queries cost O(the items they touch), not O(the table): flat at any size
    profile = faithful.FaithfulProfile(seed=args.seed, hold_ms=args.hold_ms, conflict_rate=args.conflict_rate)
    with faithful.activate(profile), mock_aws():
        result = run(args, clock, profile)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1, sort_keys=True))
    if args.json:
        print(json.dumps(result, indent=1, sort_keys=True))
    else:
        print_report(result)
    return 0 if result["ok"] else 1


def run(args: argparse.Namespace, clock: DilatedClock, profile: Any) -> dict[str, Any]:  # noqa: C901 (one run's harness: its threads share the run's state through closures)
    from bench_acr_quotas import MOTO_TIME, ideal_group_schedule
    from bench_lifecycle import seed_groups

    from rollout_pipeline.adapters import clients
    from rollout_pipeline.adapters.eventbridge import EventBridgePublisher
    from rollout_pipeline.adapters.s3 import S3ObjectStore
    from rollout_pipeline.adapters.sqs import SqsQueue
    from rollout_pipeline.config import ExperimentConfig
    from rollout_pipeline.fakes.acr import AcrProfile, AgentBehaviour, FakeAgentRuntime
    from rollout_pipeline.feed.feed import Feed
    from rollout_pipeline.feed.messages import bodies_of
    from rollout_pipeline.feed.window import window_size
    from rollout_pipeline.ledger import retry
    from rollout_pipeline.ledger.ledger import Ledger
    from rollout_pipeline.lifecycle.completion import complete_records
    from rollout_pipeline.lifecycle.deps import LifecycleDeps
    from rollout_pipeline.lifecycle.dispatch import dispatch_records
    from rollout_pipeline.lifecycle.sweeper import sweep
    from rollout_pipeline.local.resources import create_resources

    if args.poll_s:
        from rollout_pipeline.lifecycle import limits

        lo, hi = (float(x) for x in args.poll_s.split(":"))
        limits.jitter_poll_s = lambda: random.uniform(lo, hi)  # type: ignore[assignment]
    if args.settle_s is not None:
        from rollout_pipeline.lifecycle import limits

        limits.BOARD_SETTLE_S = args.settle_s  # type: ignore[misc]
    if args.lead_poll_s or args.lead_ranks is not None:
        from rollout_pipeline.lifecycle import limits

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
    resources = create_resources(config, region="us-east-1", client=clients.client)
    # The pipeline sends to a staging queue; the feeder moves its messages to the rollout queue in the order SQS
    # might deliver them (`--shuffle`: a random one of every message not yet delivered), keeping the queue shallow.
    staging_url = clients.client("sqs").create_queue(QueueName="bench-staging")["QueueUrl"]
    settings = resources.settings().model_copy(update={"rollout_queue_url": staging_url})
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
        seed=args.seed,
    )
    fake = FakeAgentRuntime(store=S3ObjectStore(), behaviour=behaviour, profile=acr)
    lifecycle_ledger, lifecycle_queue = Ledger.open(settings.table_name), SqsQueue()
    deps = LifecycleDeps(
        settings=settings,
        ledger=lifecycle_ledger,
        runtime=fake,
        store=S3ObjectStore(),
        queue=lifecycle_queue,
        publisher=EventBridgePublisher(settings.bus_name),
        feed=Feed(lifecycle_ledger, lifecycle_queue, settings),
        dispatch_threads=args.threads,
    )
    import dataclasses

    dispatch_deps = [dataclasses.replace(deps) for _ in range(args.dispatchers)]  # one slot gate per "Lambda"
    batch_id = "bench-000000000001"
    counters.harness.on = True
    groups = seed_groups(resources, batch_id, inputs, group_size)
    bodies = bodies_of(groups)
    view = Ledger.open(settings.table_name).batches.read_batch(batch_id)  # what ingestion holds (`create_batch`)
    counters.harness.on = False
    window = window_size(config)
    if window:
        bodies = []  # released by the window, as ingestion does (`ingest.core`: through `Feed.submit`)
    shuffler = random.Random(args.seed + 1)
    if args.shuffle and args.shuffle_window:
        for start in range(0, len(bodies), args.shuffle_window):
            part = bodies[start : start + args.shuffle_window]
            shuffler.shuffle(part)
            bodies[start : start + args.shuffle_window] = part
    sqs = clients.client("sqs")
    ledger = Ledger.open(settings.table_name)
    visibility = {
        url: int(
            sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])["Attributes"][
                "VisibilityTimeout"
            ]
        )
        for url in (resources.rollout_queue_url, resources.completion_queue_url, resources.trainer_queue_url)
    }
    stop = threading.Event()
    stop_dispatch = threading.Event()
    errors: list[str] = []
    group_done: dict[str, float] = {}
    retry.stats.plain = retry.stats.transactions = 0
    profile.plain_writes.clear()
    profile.transaction_writes.clear()
    profile.stats.plain_conflicts = profile.stats.transaction_conflicts = 0
    tx_times: dict[str, list[float]] = {}  # item -> times of its transactions that went through (virtual s)
    begin = profile.begin_transaction

    conflicts_by_item: Counter[str] = Counter()  # the item a cancelled transaction met a held one on

    def begin_transaction(touched: list[tuple[str, str]]) -> int | None:
        conflict = begin(touched)
        if conflict is None:
            now = time.monotonic()
            for _table, item in touched:
                tx_times.setdefault(item, []).append(now)
        else:
            conflicts_by_item[_category_of_item(touched[conflict][1])] += 1
        return conflict

    profile.begin_transaction = begin_transaction

    def receive(queue_url: str, n: int = 10) -> list[dict[str, Any]]:
        counters.harness.on = True  # the Lambda service's poller, not the pipeline
        try:
            resp = sqs.receive_message(
                QueueUrl=queue_url,
                MaxNumberOfMessages=n,
                WaitTimeSeconds=0,
                VisibilityTimeout=min(43_200, int(clock.wall_s(visibility[queue_url]))),
            )
        finally:
            counters.harness.on = False
        messages = resp.get("Messages") or []
        if messages:
            with counters.lock:
                counters.poller_sqs += 1
                if queue_url != resources.rollout_queue_url:  # the pipeline itself sends to the rollout queue
                    counters.delivered[queue_url] += len(messages)
        return [{"messageId": m["MessageId"], "body": m["Body"], "receiptHandle": m["ReceiptHandle"]} for m in messages]

    def ack(queue_url: str, records: list[dict[str, Any]], failures: dict[str, str]) -> None:
        entries = [
            {"Id": str(i), "ReceiptHandle": r["receiptHandle"]}
            for i, r in enumerate(records)
            if r["messageId"] not in failures
        ]
        if entries:
            counters.harness.on = True
            with counters.lock:
                counters.poller_sqs += 1
            try:
                sqs.delete_message_batch(QueueUrl=queue_url, Entries=entries)
            finally:
                counters.harness.on = False

    def ingest() -> None:
        if not window:
            return  # every message is in the pool already
        feed = Feed(ledger, SqsQueue(), settings)
        assert view is not None
        # As `ingest.core`: each chunk of 100 rows submitted to the feed (released as far as the window has room,
        # the rest pending), then one more submission once ingestion ended.
        for start in range(0, len(groups), 100):
            feed.submit(view, groups[start : start + 100])
        feed.submit(view)

    pool: list[str] = list(bodies)  # messages sent and not yet in the rollout queue (before: every one at once)

    def feeder() -> None:
        shuffled = args.shuffle and not args.shuffle_window
        for _ in range(1_000_000):
            if stop.is_set():
                return
            for _round in range(100):  # what the pipeline sent (releases, retries, limit re-sends)
                got = sqs.receive_message(QueueUrl=staging_url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
                messages = got.get("Messages") or []
                if not messages:
                    break
                pool.extend(m["Body"] for m in messages)
                sqs.delete_message_batch(
                    QueueUrl=staging_url,
                    Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)],
                )
            attrs = sqs.get_queue_attributes(
                QueueUrl=resources.rollout_queue_url, AttributeNames=["ApproximateNumberOfMessages"]
            )["Attributes"]
            room = min(len(pool), max(0, args.queue_depth - int(attrs["ApproximateNumberOfMessages"])), 100)
            chunk = [pool.pop(shuffler.randrange(len(pool)) if shuffled else 0) for _ in range(room)]
            for start in range(0, len(chunk), 10):
                sqs.send_message_batch(
                    QueueUrl=resources.rollout_queue_url,
                    Entries=[{"Id": str(i), "MessageBody": b} for i, b in enumerate(chunk[start : start + 10])],
                )
            time.sleep(0.2)

    def loop(name: str, queue_url: str, handle: Callable[[list[dict[str, Any]]], Any], idle: float) -> None:
        done = stop_dispatch if name == "dispatcher" else stop
        for _ in range(10_000_000):
            if done.is_set():
                return
            try:
                records = receive(queue_url)
                if not records:
                    time.sleep(idle)
                    continue
                started = time.monotonic()
                try:
                    result = handle(records)
                finally:
                    counters.invoked("dispatch" if name == "dispatcher" else "completion", started)
                ack(queue_url, records, result.failures)
                errors.extend(result.failures.values())
            except Exception as exc:
                errors.append(f"{name}: {exc!r}")

    def sweeper() -> None:
        pause = 30.0  # the stack's schedule is once a minute; the first sweep falls mid-minute
        for _ in range(100_000):
            if stop.wait(clock.wall_s(pause)):
                return
            pause = 60.0
            started = time.monotonic()
            try:
                sweep(deps, wait_until=time.monotonic() + 30)
            except Exception as exc:
                errors.append(f"sweeper: {exc!r}")
            finally:
                counters.invoked("sweeper", started)

    def trainer() -> None:
        for _ in range(10_000_000):
            if stop.is_set():
                return
            records = receive(resources.trainer_queue_url)
            for r in records:
                event = json.loads(r["body"])
                if event.get("detail-type") == "Group Completed":
                    group_done.setdefault(event["detail"]["input_id"], time.time())
            if records:
                ack(resources.trainer_queue_url, records, {})
            else:
                time.sleep(0.05)

    probe = LatenessProbe()
    threads = [
        threading.Thread(target=ingest, name="ingest", daemon=True),
        threading.Thread(target=feeder, name="bench-feeder", daemon=True),
        threading.Thread(target=trainer, name="bench-trainer", daemon=True),
        threading.Thread(target=probe.run, name="bench-probe", daemon=True),
        threading.Thread(target=sweeper, name="lc-sweeper", daemon=True),
    ]
    threads += [
        threading.Thread(
            target=loop,
            name=f"lc-dispatcher-{i}",
            args=(
                "dispatcher",
                resources.rollout_queue_url,
                lambda rs, d=d: dispatch_records(rs, d, wait_until=time.monotonic() + args.wait),
                0.1,
            ),
            daemon=True,
        )
        for i, d in enumerate(dispatch_deps)
    ]
    threads += [
        threading.Thread(
            target=loop,
            name=f"lc-completer-{i}",
            args=(
                "completer",
                resources.completion_queue_url,
                lambda rs: complete_records(rs, deps, wait_until=time.monotonic() + 30.0),
                0.05,
            ),
            daemon=True,
        )
        for i in range(args.completers)
    ]
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
            "gate_polls": sum(d.slots.polls for d in dispatch_deps),
            "gate_lead_pace_polls": sum(getattr(d.slots, "lead_polls", 0) for d in dispatch_deps),
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
            "clock_lateness_ms_p50": _pct(probe.late_ms, 0.5),
            "clock_lateness_ms_p95": _pct(probe.late_ms, 0.95),
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
        "capacity_per_rollout": {
            "wru": counters.wru / n,
            "rru": counters.rru / n,
            "wru_by_item": {k: v / n for k, v in counters.wru_items.most_common()},
            "units_by_caller": {k: v / n for k, v in counters.capacity_callers.most_common()},
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


def explain_unstopped(
    sessions: list[str], calls: list[Any], ledger: Any, batch_id: str, fake: Any, t0: float
) -> list[dict[str, Any]]:
    """Each session the fake saw invoked and never stopped, with what the ledger says of its rollout (state,
    attempt, outbox, held slots, stop tries) and the fake's calls for it (virtual s since the first session, op,
    outcome): a run explains its own never-stopped sessions."""
    from rollout_pipeline import ids

    if not sessions:
        return []
    wanted = set(sessions)
    owner: dict[str, Any] = {}
    for rec in ledger.rollouts.batch_rollouts(batch_id):
        for attempt in range(1, rec.attempt + 2):
            sid = ids.session_id(rec.exp_id, batch_id, rec.input_id, rec.index, attempt)
            if sid in wanted:
                owner[sid] = (rec, attempt)
    out = []
    for sid in sessions:
        rec, attempt = owner.get(sid, (None, None))
        out.append(
            {
                "session_id": sid,
                "session_attempt": attempt,
                "reaped_by_idle_timeout": sid in fake.reaped,
                "running_in_fake": sid in fake.running,
                "ledger": None
                if rec is None
                else {
                    "rollout": f"{rec.input_id}#{rec.index}",
                    "state": str(rec.state),
                    "attempt": rec.attempt,
                    "session_id": rec.session_id,
                    "reason": rec.reason,
                    "outbox": sorted(rec.outbox),
                    "stop_sessions": sorted(rec.stop_sessions),
                    "held_slots": sorted(rec.held_slots),
                    "stop_tries": rec.stop_tries,
                    "stop_not_found": sorted(rec.stop_not_found),
                },
                "calls": [(round(c.at - t0, 3), c.op, c.outcome) for c in calls if c.session_id == sid],
            }
        )
    return out


def all_in_extras(counters: Counters, n: int) -> dict[str, float]:
    """The rest of the AWS-side cost per million rollouts (ACR compute and the model excluded), beside the
    pipeline's own counted requests: the agents' result PUTs (counted: `s3.PutObject`), the SQS requests of
    Lambda's pollers and the trainer (counted), one SQS SendMessage per message an EventBridge rule delivers into
    the completion and trainer queues (counted as received), and Lambda requests and arm64 GB-s at each function's
    memory (`topology.FUNCTIONS`), timed on the virtual clock: a dispatcher's wait for a budget is billed time."""
    from rollout_pipeline.topology import FUNCTIONS

    gb_s = sum(s * FUNCTIONS[name].memory_mb / 1024 for name, s in counters.lambda_s.items())
    return {
        "s3_result_puts": counters.other.get("s3.PutObject", 0) * PRICE_PER_MILLION["s3_put"] / n,
        "sqs_pollers_and_trainer": counters.poller_sqs * PRICE_PER_MILLION["sqs"] / n,
        "sqs_eventbridge_deliveries": sum(counters.delivered.values()) * PRICE_PER_MILLION["sqs"] / n,
        "lambda_requests": sum(counters.lambda_calls.values()) * PRICE_PER_MILLION["lambda_request"] / n,
        "lambda_compute_arm64": gb_s * PRICE_PER_MILLION["lambda_gb_s"] / n,
    }


def slot_turnover(calls: list[Any], session_delay: dict[str, float], max_sessions: int) -> dict[str, float]:
    """Where a slot's turnover goes beyond the agent's own time (medians, virtual s): from the agent's end (its
    answered invoke + its delay) to the session's first successful stop (the completion path; the slot is given back
    right after it), and, once every slot has been taken, from the n-th such stop to the (n + max_sessions)-th new
    session (the slot gate's poll, the dispatch transaction and the session pacer)."""
    answered: dict[str, float] = {}
    stopped: dict[str, float] = {}
    firsts: dict[str, float] = {}
    for c in calls:
        if c.op == "invoke" and c.outcome in ("started", "cold_start"):
            firsts.setdefault(c.session_id, c.at)
        if c.op == "invoke" and c.outcome in ("started", "reinvoked"):
            answered.setdefault(c.session_id, c.at)
        if c.op == "stop" and c.outcome == "stopped":
            stopped.setdefault(c.session_id, c.at)
    to_stop = [stopped[s] - answered[s] - session_delay[s] for s in stopped if s in answered and s in session_delay]
    starts, stops = sorted(firsts.values()), sorted(stopped.values())
    gaps = [
        starts[i] - stops[i - max_sessions] for i in range(max_sessions, min(len(starts), len(stops) + max_sessions))
    ]
    return {
        "agent_end_to_stop_s_median": statistics.median(to_stop) if to_stop else float("nan"),
        "stop_to_next_session_s_median": statistics.median(gaps) if gaps else float("nan"),
    }


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


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
    u = r.get("capacity_per_rollout")
    if u:
        print(f"capacity units/rollout     WRU {u['wru']:.2f}, RRU {u['rru']:.2f}")
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
