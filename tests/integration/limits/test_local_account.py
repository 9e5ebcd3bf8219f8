"""Several experiments on ONE local account (`LocalSettings.also`, `rollouts local up --experiment a --experiment b`):
one moto endpoint, one account pool, one AgentCore whose new-session quota is the account's. Both experiments have
a backlog bigger than the quota starts in a second: the account pool keeps them both within it (AgentCore refuses
nothing) and both batches complete; each on its own limits, as before the pool, they ask for more than the account
has and AgentCore throttles."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rollout_pipeline.contracts import DetailType
from rollout_pipeline.fakes.acr import AcrProfile, AgentBehaviour, FakeAgentRuntime
from rollout_pipeline.local.pipeline import LocalPipeline, LocalSettings
from rollout_pipeline.ports import RuntimeThrottled

pytestmark = pytest.mark.timing

QUOTA = 4.0  # new sessions/s of the local account
ROWS = 6
GROUP_SIZE = 4
WAIT_S = 240.0  # bounded; about 15 s on an idle machine


def _run(
    tmp_path: Path, *, account_pool: bool, limits: dict[str, Any]
) -> tuple[FakeAgentRuntime, dict[str, int], set[str]]:
    """Both experiments' batches submitted at once; returns the account's fake AgentCore, the rollouts completed by
    experiment, and the experiments whose batch ended."""
    fakes: list[FakeAgentRuntime] = []

    def account(_resources: Any) -> FakeAgentRuntime:
        fake = FakeAgentRuntime(
            behaviour=AgentBehaviour(rewards=1.0, delay_s=0.3),
            profile=AcrProfile(account_new_sessions_per_s=QUOTA, max_active_sessions=1000),
        )
        fakes.append(fake)
        return fake

    settings = LocalSettings(
        experiment="exp-a",
        also=("exp-b",),
        account_new_sessions_per_s=QUOTA,
        account_pool=account_pool,
        group_size=GROUP_SIZE,
        max_sessions=40,
        model_url="http://127.0.0.1:9/v1",
        runtime_factory=account,
        experiment_settings=limits,
        dispatch_concurrency=3,
        work_dir=tmp_path,
    )
    completed: dict[str, int] = {}
    ended: set[str] = set()
    with LocalPipeline(settings) as pipeline:
        assert set(pipeline.experiments) == {"exp-a", "exp-b"}
        assert len(fakes) == 1, "one AgentCore for the account"
        rows = [{"id": f"r{i}", "x": i} for i in range(ROWS)]
        batches = {name: local.sdk.submit(rows) for name, local in pipeline.experiments.items()}
        for name, batch in batches.items():
            done = 0
            for event in pipeline.experiments[name].sdk.events(batch_id=batch, timeout=WAIT_S):
                if event.detail_type is DetailType.ROLLOUT_COMPLETED:
                    done += 1
                if event.detail_type is DetailType.BATCH_COMPLETED:
                    ended.add(name)
                    break
            completed[name] = done
    return fakes[0], completed, ended


def _throttled(fake: FakeAgentRuntime) -> int:
    return sum(1 for call in fake.invocations() if call.outcome in ("throttled", "quota_exceeded"))


def test_two_experiments_share_the_accounts_quota_without_a_throttle(tmp_path: Path) -> None:
    fake, completed, ended = _run(tmp_path, account_pool=True, limits={})
    assert ended == {"exp-a", "exp-b"}
    assert completed == {"exp-a": ROWS * GROUP_SIZE, "exp-b": ROWS * GROUP_SIZE}
    assert _throttled(fake) == 0
    starts = sorted(c.at for c in fake.invocations() if c.outcome in ("started", "cold_start"))
    assert len(starts) == 2 * ROWS * GROUP_SIZE
    busiest = max(sum(1 for t in starts[i:] if t < start + 1.0) for i, start in enumerate(starts))
    assert busiest <= QUOTA  # every sliding second, both experiments together


def test_each_on_its_own_limits_they_ask_for_more_than_the_account_has(tmp_path: Path) -> None:
    """The same run as before the account pool: each experiment paces itself at 3/s, as if it owned the account
    (4/s): together 6/s, and AgentCore throttles (the throttled rollouts are requeued; one throttled too often
    fails as `throttled`, so not every rollout need complete)."""
    fake, completed, ended = _run(tmp_path, account_pool=False, limits={"session_rate_limit": 3.0})
    assert ended == {"exp-a", "exp-b"}
    assert sum(completed.values()) > ROWS * GROUP_SIZE
    assert _throttled(fake) > 0


WEIGHTS = {"exp-a": 1.0, "exp-b": 1.0, "exp-c": 2.0}
RESERVE = 0.1
#: Each experiment's share of the starts while all are backlogged, within this of its weight's: about 45 starts, 11 of
#: them a weight-1 experiment's, on a machine that may be loaded: a dispatcher starved of CPU does not keep its
#: experiment at the gate (beside two busy loops, 6 of 40 for one weight-1 experiment, 10 for the other), and one
#: start is 9% of its share. The leases' .45/.00/.55 fails it by far; the 15% of a longer run on a quiet machine is
#: measured by bench/bench_local_account.py.
SHARE_TOLERANCE = 1 / 2
#: At most this many new sessions of the others between two of a backlogged experiment's own (its fair share: 3):
#: the issue's 5 s at the quota (its dispatcher's local poll, slower on a loaded machine, is counted in; the account
#: pool with leases let one wait 40-90).
STARVED_AFTER = int(5 * QUOTA)
#: An outside consumer (a production agent of the account) inside the reserve: one new session every 3 s.
OUTSIDE_EVERY_S = 3.0


def test_three_weighted_experiments_and_an_outside_consumer_share_one_small_account(tmp_path: Path) -> None:
    """Three experiments of weights 1, 1, 2 on one local account of 4 new sessions/s with a 10% reserve, and a
    consumer outside the pipeline inside the reserve: every sliding second holds at most 4 new sessions, the outside
    consumer is never throttled, no backlogged experiment waits behind the others, and while all three are
    backlogged each gets its weighted share (the leases starved one for 13-30 s: shares .45/.00/.55)."""
    fakes: list[FakeAgentRuntime] = []

    def account(_resources: Any) -> FakeAgentRuntime:
        fake = FakeAgentRuntime(
            behaviour=AgentBehaviour(rewards=1.0, delay_s=0.3),
            profile=AcrProfile(account_new_sessions_per_s=QUOTA, max_active_sessions=1000),
        )
        fakes.append(fake)
        return fake

    settings = LocalSettings(
        experiment="exp-a",
        also=("exp-b", "exp-c"),
        per_experiment={name: {"capacity_weight": weight} for name, weight in WEIGHTS.items()},
        account_new_sessions_per_s=QUOTA,
        capacity_reserve=RESERVE,
        group_size=GROUP_SIZE,
        max_sessions=40,
        model_url="http://127.0.0.1:9/v1",
        runtime_factory=account,
        dispatch_concurrency=3,
        work_dir=tmp_path,
    )
    rows = [{"id": f"r{i}", "x": i} for i in range(ROWS)]
    outside: list[tuple[float, bool]] = []
    with LocalPipeline(settings) as pipeline:
        (fake,) = fakes
        stop = threading.Event()

        def outside_consumer() -> None:  # new sessions of the account the pipeline knows nothing of
            n = 0
            while not stop.wait(OUTSIDE_EVERY_S):
                try:
                    fake.invoke(f"outside-session-{n:026d}", {})
                    outside.append((time.time(), True))
                except RuntimeThrottled:
                    outside.append((time.time(), False))
                n += 1

        consumer = threading.Thread(target=outside_consumer, daemon=True)
        consumer.start()
        batches: dict[str, str] = {}
        backlogged_at: dict[str, float] = {}  # its rollouts are in its queue: `submit` returned
        for name, local in pipeline.experiments.items():
            batches[name] = local.sdk.submit(rows)
            backlogged_at[name] = time.time()
        for name, batch in batches.items():
            for event in pipeline.experiments[name].sdk.events(batch_id=batch, timeout=WAIT_S):
                if event.detail_type is DetailType.BATCH_COMPLETED:
                    break
        stop.set()
        consumer.join(10)
    starts: dict[str, list[float]] = {name: [] for name in WEIGHTS}
    for call in fake.invocations():
        if call.outcome in ("started", "cold_start") and not call.session_id.startswith("outside"):
            starts[str(fake.payloads[call.session_id]["_rollout"]["exp_id"])].append(call.at)
    assert {name: len(times) for name, times in starts.items()} == dict.fromkeys(WEIGHTS, ROWS * GROUP_SIZE)
    every = sorted([t for times in starts.values() for t in times] + [t for t, ok in outside if ok])
    assert max(sum(1 for t in every[i:] if t < start + 1.0) for i, start in enumerate(every)) <= QUOTA
    assert outside, "the outside consumer ran"
    assert all(ok for _t, ok in outside), "the outside consumer, inside the reserve, was throttled"
    # No backlogged experiment waits behind the others: between two of its starts (and before its first, from its
    # submission's return: the three are submitted one after another, seconds apart on a loaded machine), the account
    # starts at most `STARVED_AFTER` other sessions. Counted in starts, not seconds, so a loaded machine's slower
    # pipeline changes nothing (in seconds: bench/bench_local_account.py; the leases let one wait 13-30 s, ~40-90
    # starts of the others).
    ours = sorted((t, name) for name, times in starts.items() for t in times)
    for name in WEIGHTS:
        last = max(starts[name])
        between, worst = 0, 0
        for _t, whose in ours:
            if whose == name:
                worst, between = max(worst, between), 0
            elif backlogged_at[name] <= _t < last:
                between += 1
        assert worst <= STARVED_AFTER, (name, worst, "".join(w[-1] for _t, w in ours))
    # Shares while all three are backlogged: from the first start of the last one to start (the test submits the
    # three batches one after another: on a loaded machine seconds apart) until the first of them has started its
    # last rollout.
    since, until = max(min(times) for times in starts.values()), min(max(times) for times in starts.values())
    counts = {name: sum(1 for t in times if since <= t <= until) for name, times in starts.items()}
    total_weight = sum(WEIGHTS.values())
    for name, weight in WEIGHTS.items():
        share, fair = counts[name] / sum(counts.values()), weight / total_weight
        assert abs(share - fair) <= SHARE_TOLERANCE * fair, (name, share, fair, counts)
    assert counts["exp-c"] > max(counts["exp-a"], counts["exp-b"]), ("weight 2 starts more than weight 1", counts)
