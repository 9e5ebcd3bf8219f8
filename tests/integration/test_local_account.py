"""Several experiments on ONE local account (`LocalSettings.also`, `rollouts local up --experiment a --experiment b`):
one moto endpoint, one account pool, one AgentCore whose new-session quota is the account's. Both experiments have
a backlog bigger than the quota starts in a second: the account pool keeps them both within it (AgentCore refuses
nothing) and both batches complete; each on its own limits, as before the pool, they ask for more than the account
has and AgentCore throttles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rollout_pipeline.contracts import DetailType
from rollout_pipeline.fakes.acr import AcrProfile, AgentBehaviour, FakeAgentRuntime
from rollout_pipeline.local.pipeline import LocalPipeline, LocalSettings

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
