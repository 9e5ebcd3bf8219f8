"""The dilated-clock harness the scale benches share (`bench_scale.py`, `bench_capacity.py`).

Why dilation: moto costs 1-2 ms per request in process (far more on a loaded machine) and serialises DynamoDB, so
two shared cores cannot run the lifecycle at AgentCore's rates in wall-clock time. Instead the whole process runs
on a clock k times slower than the wall clock (`DilatedClock`): `time.time`, `time.monotonic` and `time.sleep` and
the pipeline's `utcnow` are replaced before the pipeline is imported, so ONE virtual second lasts k wall seconds.
Every rate the pipeline and the fake AgentCore enforce is then k times slower in wall time, every hold, latency,
poll interval, heartbeat, settle time and agent delay k times longer, while moto's own processing and the Python
code's CPU time shrink k times in virtual time. Realistic DynamoDB latencies are injected (`install_latency`) and
the faithful conflict model holds each transaction's items for its `hold_ms` (virtual).

What is NOT dilated (wall clock): lock, Event and Condition timeouts (they only bound waits that a notify ends);
moto's own clock (SQS visibility timeouts: `Rig.receive` multiplies them by k); `threading.Timer` (the agent's delay
is given to it multiplied by k); and the machine's scheduling lateness, which shrinks k times in virtual time.

Here: the clock, the request counters (a botocore hook: DynamoDB requests by operation, item kind, stage and
caller, request units, other services), the injected latencies, the lateness probe, the moto sandbox
(`aws_sandbox`), the transaction log of the faithful profile, and `Rig`: one experiment's Lambdas played by
threads (a feeder into the rollout queue, dispatchers, completers, the sweeper every minute, a trainer reading
`Group Completed`), all running the pipeline's real handlers.

The API a bench uses (bench_capacity.py is the fullest example):

    clock = DilatedClock(k); clock.install()            # first, before anything imports the pipeline
    with aws_sandbox(seed=1, hold_ms=15.0) as profile:   # in-process moto under the faithful profile
        counters = Counters()                             # DynamoDB requests by operation, item, stage, caller:
        clients.register_hook("before-parameter-build", counters.before_build)
        install_latency(clients, random.Random(1))        # realistic DynamoDB latencies (virtual)
        log = TransactionLog(profile)                     # when each item's transactions went through
        rig = Rig(resources, make_deps, counters, clock, RigOptions(dispatchers=5),
                  stop=stop, stop_dispatch=stop_dispatch, errors=errors)
        rig.release(rig_batch) / rig.seed(batch_id, inputs, group_size)   # the experiment's work
        threads = rig.threads()                           # feeder, dispatchers, completers, sweeper, trainer
        rig.pause() / rig.resume()                        # the experiment has no work for a while, then has
    probe = LatenessProbe()                               # run it in a thread: how late the clock wakes sleepers

- `DilatedClock(k)`: `time()`, `monotonic()`, `sleep(s)` (virtual), `wall_s(virtual_s)`, `install()`.
- `Rig(resources, make_deps, counters, clock, options, *, stop, stop_dispatch, errors)`: `make_deps(settings)`
  builds the experiment's `LifecycleDeps` (each dispatcher "Lambda" gets its own copy: slot gate, board entry,
  pool lease); `deps`, `dispatch_deps`, `group_done` (group -> virtual s), `receive`/`ack` (the Lambda service's
  poller, not counted), `seed`, `release`, `pause`, `resume`, `threads(releasing=...)`.
- Figures: `sliding_max(times)` (busiest sliding second), `steady_rate`, `pct`, `slot_phase`, `slot_turnover`,
  `explain_unstopped`, `all_in_extras` (Lambda, S3, SQS, EventBridge costs), `Counters` (requests, request
  units; `harness.on` marks the harness's own calls), `TransactionLog.conflicts_by_item`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _datetime
import itertools
import json
import math
import random
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
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
        defaults such as `Clocks.wall = time.time` bind at import)."""
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
        start = str((values.get(":from") or {}).get("S", ""))
        if start.startswith("P#"):  # the release window's look ahead over the pending groups (`ledger.release`)
            return ["query pending P#*"]
        if start.startswith(("SESSIONS#", "PACE#")):  # a slot gate's poll: the counters, the board (and schedules)
            return ["query LIMIT slots+board"]
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
        self.units_by_caller: Counter[str] = Counter()  # WRU + RRU by the ledger method that made the request
        self.callers: Counter[str] = Counter()  # requests by the ledger method that made them, and operation
        self.caller_items: Counter[str] = Counter()  # the same, and the item kinds each request touched
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
            wru, rru = request_units(operation, touched)
            self.wru += wru
            self.rru += rru
            per_item = 2 if operation == "TransactWriteItems" else 1
            if wru:
                for category in touched:
                    self.wru_items[category] += per_item
            caller = f"{ledger_caller()} {operation}"
            self.units_by_caller[caller] += wru + rru
            self.callers[caller] += 1
            self.caller_items[f"{caller} {'+'.join(sorted(set(touched)))}"] += 1


def request_units(operation: str, touched: list[str]) -> tuple[float, float]:
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


#: The latency hook's random source; the hook is registered once per process (a second bench mode in the same
#: process only replaces the source: registered twice, every call would sleep twice).
_latency: dict[str, random.Random] = {}
_latency_lock = threading.Lock()


def install_latency(clients: Any, rng: random.Random) -> None:
    """Sleep a sampled DynamoDB latency (virtual seconds) after every DynamoDB call, conflicts included. Called again
    (another mode of the same run), it only takes `rng`."""

    def after_call(model: Any, **_: Any) -> None:
        median = DYNAMODB_LATENCY_S.get(model.name, 0.006)
        with _latency_lock:
            latency = median * math.exp(_latency["rng"].gauss(0.0, LATENCY_SIGMA))
        time.sleep(latency)

    with _latency_lock:
        first = "rng" not in _latency
        _latency["rng"] = rng
    if first:
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


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextlib.contextmanager
def aws_sandbox(*, seed: int, hold_ms: float, conflict_rate: float = 0.0) -> Iterator[Any]:
    """In-process moto as the scale benches run it (DynamoDB serialised as local mode's server does, the moto
    patches of local mode, moto's time measured) under the faithful profile; yields the profile. Install the
    dilated clock first."""
    from bench_acr_quotas import _serialise_dynamodb, _time_moto
    from bench_lifecycle import _fake_aws_env
    from moto import mock_aws

    from rollout_pipeline.fakes import faithful
    from rollout_pipeline.local.moto_server import patch_moto

    _fake_aws_env()
    _time_moto("inner")
    _serialise_dynamodb()
    patch_moto()  # transactions and queries cost O(the items they touch), not O(the table): flat at any size
    profile = faithful.FaithfulProfile(seed=seed, hold_ms=hold_ms, conflict_rate=conflict_rate)
    with faithful.activate(profile), mock_aws():
        yield profile


def gather_batch(sqs: Any, queue_url: str, n: int, visibility_s: int) -> list[dict[str, Any]]:
    """Up to `n` messages of `queue_url` as Lambda's SQS records, gathered as Lambda's poller gathers a batch (a
    batching window lets it pass SQS's 10 per receive): receives of at most 10 while they come full."""
    messages: list[dict[str, Any]] = []
    for _ in range(math.ceil(n / 10)):
        got = (
            sqs.receive_message(
                QueueUrl=queue_url,
                MaxNumberOfMessages=min(10, n - len(messages)),
                WaitTimeSeconds=0,
                VisibilityTimeout=min(43_200, visibility_s),
            ).get("Messages")
            or []
        )
        messages += got
        if len(got) < 10 or len(messages) >= n:
            break
    return [{"messageId": m["MessageId"], "body": m["Body"], "receiptHandle": m["ReceiptHandle"]} for m in messages]


class TransactionLog:
    """The faithful profile's transactions as the benches read them: when each item's went through (virtual s),
    and the item kind each cancelled one met a held item on."""

    def __init__(self, profile: Any) -> None:
        self.tx_times: dict[str, list[float]] = {}
        self.conflicts_by_item: Counter[str] = Counter()
        begin = profile.begin_transaction

        def begin_transaction(touched: list[tuple[str, str]]) -> int | None:
            conflict = begin(touched)
            if conflict is None:
                now = time.monotonic()
                for _table, item in touched:
                    self.tx_times.setdefault(item, []).append(now)
            else:
                self.conflicts_by_item[_category_of_item(touched[conflict][1])] += 1
            return conflict

        profile.begin_transaction = begin_transaction


def lifecycle_deps(settings: Any, runtime: Any, *, pooled: bool = True, **fields: Any) -> Any:
    """One process's `LifecycleDeps` over the in-process AWS (moto) and `runtime`, with the experiment's limits:
    through the account pool when `pooled` and the settings name one, else on its own settings. `fields`: other
    `LifecycleDeps` fields (`metrics`, `dispatch_threads`, ...); `group_admission` goes to the limits."""
    from rollout_pipeline.adapters.eventbridge import EventBridgePublisher
    from rollout_pipeline.adapters.s3 import S3ObjectStore
    from rollout_pipeline.adapters.sqs import SqsQueue
    from rollout_pipeline.feed.feed import Feed
    from rollout_pipeline.ledger.ledger import Ledger
    from rollout_pipeline.ledger.pool import PoolLedger
    from rollout_pipeline.lifecycle.deps import LifecycleDeps
    from rollout_pipeline.limits.facade import Limits
    from rollout_pipeline.metric_names import MetricsRecorder

    ledger, queue = Ledger.open(settings.table_name), SqsQueue()
    pool = PoolLedger.open(settings.pool_table_name) if pooled and settings.pool_table_name else None
    metrics = fields.pop("metrics", None) or MetricsRecorder()
    ordered = fields.pop("group_admission", True)
    limits = Limits(ledger.limits, settings.experiment, runtime, pool=pool, metrics=metrics, group_admission=ordered)
    return LifecycleDeps(
        settings=settings,
        ledger=ledger,
        runtime=runtime,
        store=S3ObjectStore(),
        queue=queue,
        publisher=EventBridgePublisher(settings.bus_name),
        feed=Feed(ledger, queue, settings),
        limits=limits,
        metrics=metrics,
        **fields,
    )


@dataclasses.dataclass(frozen=True)
class RigOptions:
    """How an experiment's Lambdas are played: dispatcher 'Lambdas' (each its own process: its own slot gate,
    board entry and pool lease), completer 'Lambdas' (one process), threads per Lambda, a dispatcher's wait budget
    (virtual s), the rollout queue's depth the feeder keeps, and its order."""

    dispatchers: int = 5
    completers: int = 3
    threads: int = 10
    wait_s: float = 60.0
    queue_depth: int = 150
    shuffle: bool = False
    shuffle_window: int = 0
    seed: int = 1


class Rig:
    """One experiment's Lambdas, played by threads running the pipeline's real handlers over `resources` (moto).

    The pipeline sends to a staging queue; the feeder moves its messages to the rollout queue in the order SQS
    might deliver them (`shuffle`: a random one of every message not yet delivered), keeping the queue shallow.
    Dispatchers and completers receive (as Lambda's poller: not counted as the pipeline's requests), run
    `dispatch_records` / `complete_records` and acknowledge; the sweeper runs every minute; the trainer records
    when each `Group Completed` arrives."""

    def __init__(
        self,
        resources: Any,
        make_deps: Callable[[Any], Any],
        counters: Counters,
        clock: DilatedClock,
        options: RigOptions,
        *,
        stop: threading.Event,
        stop_dispatch: threading.Event,
        errors: list[str],
    ) -> None:
        from rollout_pipeline.adapters import clients

        self.resources = resources
        self.name = resources.config.name
        self.counters = counters
        self.clock = clock
        self.options = options
        self.stop = stop
        self.stop_dispatch = stop_dispatch
        self.errors = errors
        self.sqs = clients.client("sqs")
        self.staging_url = self.sqs.create_queue(QueueName=f"{self.name}-bench-staging")["QueueUrl"]
        self.settings = resources.settings().model_copy(update={"rollout_queue_url": self.staging_url})
        self.deps = make_deps(self.settings)
        #: One slot gate, admission-board entry and pool lease per dispatcher "Lambda" (`for_another_process`).
        self.dispatch_deps = [self.deps.for_another_process() for _ in range(options.dispatchers)]
        self.visibility = {
            url: int(
                self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])["Attributes"][
                    "VisibilityTimeout"
                ]
            )
            for url in (resources.rollout_queue_url, resources.completion_queue_url, resources.trainer_queue_url)
        }
        self.pool: list[str] = []  # messages sent and not yet in the rollout queue
        self.shuffler = random.Random(options.seed + 1)
        self.group_done: dict[str, float] = {}
        self.groups: dict[str, Any] = {}
        self.views: dict[str, Any] = {}
        #: While set, nothing reaches the rollout queue (the experiment has no work: `pause`).
        self.paused = threading.Event()

    # --------------------------------------------------------------------------------------------- the queues

    def receive(self, queue_url: str, n: int = 10) -> list[dict[str, Any]]:
        """Up to `n` messages, as Lambda's poller gathers a batch (`gather_batch`)."""
        counters = self.counters
        counters.harness.on = True  # the Lambda service's poller, not the pipeline
        try:
            records = gather_batch(self.sqs, queue_url, n, int(self.clock.wall_s(self.visibility[queue_url])))
        finally:
            counters.harness.on = False
        if records:
            with counters.lock:
                counters.poller_sqs += 1
                if queue_url != self.resources.rollout_queue_url:  # the pipeline itself sends to the rollout queue
                    counters.delivered[queue_url] += len(records)
        return records

    def ack(self, queue_url: str, records: list[dict[str, Any]], failures: dict[str, str]) -> None:
        entries = [
            {"Id": str(i), "ReceiptHandle": r["receiptHandle"]}
            for i, r in enumerate(records)
            if r["messageId"] not in failures
        ]
        for start in range(0, len(entries), 10):
            self.counters.harness.on = True
            with self.counters.lock:
                self.counters.poller_sqs += 1
            try:
                self.sqs.delete_message_batch(QueueUrl=queue_url, Entries=entries[start : start + 10])
            finally:
                self.counters.harness.on = False

    # ------------------------------------------------------------------------------------------------ work

    def seed(self, batch_id: str, inputs: int, group_size: int) -> list[str]:
        """A batch and its groups as ingestion writes them (`bench_lifecycle.seed_groups`); returns the message
        bodies (what ingestion sends at once without a release window)."""
        from bench_lifecycle import seed_groups

        from rollout_pipeline.feed.messages import bodies_of

        self.counters.harness.on = True
        try:
            self.groups[batch_id] = seed_groups(self.resources, batch_id, inputs, group_size)
            self.views[batch_id] = self.deps.ledger.batches.read_batch(batch_id)  # what ingestion holds
        finally:
            self.counters.harness.on = False
        return bodies_of(self.groups[batch_id])

    def release(self, batch_id: str) -> None:
        """As `ingest.core` does with the release window: each chunk of 100 rows submitted to the feed (released
        as far as the window has room, the rest pending), then one more submission once ingestion ended."""
        from rollout_pipeline.adapters.sqs import SqsQueue
        from rollout_pipeline.feed.feed import Feed

        feed = Feed(self.deps.ledger, SqsQueue(), self.settings)
        view, groups = self.views[batch_id], self.groups[batch_id]
        assert view is not None
        for start in range(0, len(groups), 100):
            feed.submit(view, groups[start : start + 100])
        feed.submit(view)

    def pause(self) -> None:
        """The experiment has no work for a while: what waits in its rollout queue goes back to the feeder (as if it
        had not been sent yet) and nothing more is fed until `resume`; its dispatchers finish what they hold."""
        self.paused.set()
        self.counters.harness.on = True
        try:
            for _ in range(1000):
                got = self.sqs.receive_message(
                    QueueUrl=self.resources.rollout_queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0
                )
                messages = got.get("Messages") or []
                if not messages:
                    return
                self.pool[:0] = [m["Body"] for m in messages]
                self.sqs.delete_message_batch(
                    QueueUrl=self.resources.rollout_queue_url,
                    Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)],
                )
        finally:
            self.counters.harness.on = False

    def resume(self) -> None:
        self.paused.clear()

    def feeder(self) -> None:
        shuffled = self.options.shuffle and not self.options.shuffle_window
        sqs, rollout_queue = self.sqs, self.resources.rollout_queue_url
        for _ in range(1_000_000):
            if self.stop.is_set():
                return
            for _round in range(100):  # what the pipeline sent (releases, retries, limit re-sends)
                got = sqs.receive_message(QueueUrl=self.staging_url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
                messages = got.get("Messages") or []
                if not messages:
                    break
                self.pool.extend(m["Body"] for m in messages)
                sqs.delete_message_batch(
                    QueueUrl=self.staging_url,
                    Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)],
                )
            if self.paused.is_set():
                time.sleep(0.2)
                continue
            attrs = sqs.get_queue_attributes(QueueUrl=rollout_queue, AttributeNames=["ApproximateNumberOfMessages"])
            depth = int(attrs["Attributes"]["ApproximateNumberOfMessages"])
            room = min(len(self.pool), max(0, self.options.queue_depth - depth), 100)
            pool = self.pool
            chunk = [pool.pop(self.shuffler.randrange(len(pool)) if shuffled else 0) for _ in range(room)]
            for start in range(0, len(chunk), 10):
                sqs.send_message_batch(
                    QueueUrl=rollout_queue,
                    Entries=[{"Id": str(i), "MessageBody": b} for i, b in enumerate(chunk[start : start + 10])],
                )
            time.sleep(0.2)

    def loop(self, name: str, queue_url: str, handle: Callable[[list[dict[str, Any]]], Any], idle: float) -> None:
        done = self.stop_dispatch if name == "dispatcher" else self.stop
        for _ in range(10_000_000):
            if done.is_set():
                return
            try:
                records = self.receive(queue_url, self.options.threads if name == "dispatcher" else 10)
                if not records:
                    time.sleep(idle)
                    continue
                started = time.monotonic()
                try:
                    result = handle(records)
                finally:
                    self.counters.invoked("dispatch" if name == "dispatcher" else "completion", started)
                self.ack(queue_url, records, result.failures)
                self.errors.extend(result.failures.values())
            except Exception as exc:
                self.errors.append(f"{self.name} {name}: {exc!r}")

    def sweeper(self) -> None:
        from rollout_pipeline.lifecycle.sweeper import sweep

        pause = 30.0  # the stack's schedule is once a minute; the first sweep falls mid-minute
        for _ in range(100_000):
            if self.stop.wait(self.clock.wall_s(pause)):
                return
            pause = 60.0
            started = time.monotonic()
            try:
                sweep(self.deps, wait_until=time.monotonic() + 30)
            except Exception as exc:
                self.errors.append(f"{self.name} sweeper: {exc!r}")
            finally:
                self.counters.invoked("sweeper", started)

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

    def threads(self, *, releasing: Callable[[], None] | None = None) -> list[threading.Thread]:
        """Every thread of this experiment (not started); `releasing`: ingestion's release of the batch."""
        from rollout_pipeline.lifecycle.completion import complete_records
        from rollout_pipeline.lifecycle.dispatch import dispatch_records

        name, opts, res = self.name, self.options, self.resources
        threads = [
            threading.Thread(target=self.feeder, name=f"bench-feeder-{name}", daemon=True),
            threading.Thread(target=self.trainer, name=f"bench-trainer-{name}", daemon=True),
            threading.Thread(target=self.sweeper, name=f"lc-sweeper-{name}", daemon=True),
        ]
        if releasing is not None:
            threads.insert(0, threading.Thread(target=releasing, name=f"ingest-{name}", daemon=True))
        threads += [
            threading.Thread(
                target=self.loop,
                name=f"lc-dispatcher-{name}-{i}",
                args=(
                    "dispatcher",
                    res.rollout_queue_url,
                    lambda rs, d=d: dispatch_records(rs, d, wait_until=time.monotonic() + opts.wait_s),
                    0.1,
                ),
                daemon=True,
            )
            for i, d in enumerate(self.dispatch_deps)
        ]
        threads += [
            threading.Thread(
                target=self.loop,
                name=f"lc-completer-{name}-{i}",
                args=(
                    "completer",
                    res.completion_queue_url,
                    lambda rs: complete_records(rs, self.deps, wait_until=time.monotonic() + 30.0),
                    0.05,
                ),
                daemon=True,
            )
            for i in range(opts.completers)
        ]
        return threads
