"""What the budget tells: held rollouts come back together (so resuming keeps group order), each budget value has
its own event id, and an event shows the spend it decided on, unrounded."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from rollout_pipeline.contracts import BudgetExhausted, BudgetWarning, CostSummary, DetailType
from rollout_pipeline.ledger.items import BatchState, BatchView
from rollout_pipeline.lifecycle import budget


@given(
    period=st.integers(min_value=1, max_value=budget.MAX_RECHECK_S),
    start=st.floats(min_value=1.7e9, max_value=1.8e9),
    offsets=st.lists(st.floats(min_value=0.0, max_value=0.999), min_size=2, max_size=8),
)
def test_rollouts_held_within_one_period_come_back_in_the_same_second(
    period: int, start: float, offsets: list[float]
) -> None:
    tick = (int(start) // period + 1) * period  # the next multiple of the period
    held_at = [tick - period + offset * period for offset in offsets]  # anywhere in the period before it
    back = {int(t) + budget.return_delay_s(t, period) for t in held_at}
    assert back == {tick}
    # held again on its return, it waits one whole period: the group stays together
    assert budget.return_delay_s(tick + 0.3, period) == period


def test_no_recheck_period_sends_at_once_and_the_delay_stays_within_sqs() -> None:
    assert budget.return_delay_s(1.75e9, 0) == 0
    assert 1 <= budget.return_delay_s(1.75e9 + 17, 5000) <= budget.MAX_RECHECK_S


def test_every_budget_value_has_its_own_event_id() -> None:
    ids = {
        budget.budget_event_id(DetailType.BUDGET_EXHAUSTED, "exp", "", value)
        for value in (1_234_567.0, 1_234_568.0, 1_234_567.5, 0.1, 0.1000001)
    }
    assert len(ids) == 5
    # the same value, whether read back from the ledger as an int or a float, keeps its id
    assert budget.budget_event_id(DetailType.BUDGET_WARNING, "exp", "b", 5) == budget.budget_event_id(
        DetailType.BUDGET_WARNING, "exp", "b", 5.0
    )


def _announcing_deps(published: list[Any]) -> Any:
    batches = SimpleNamespace(
        claim_budget_event=lambda *_a: True,
        unclaim_budget_event=lambda *_a: None,
        read_batch=lambda _b: None,
    )
    return SimpleNamespace(
        config=SimpleNamespace(name="exp"),
        ledger=SimpleNamespace(batches=batches, experiment=SimpleNamespace()),
        publisher=SimpleNamespace(publish=published.extend),
    )


def test_a_budget_event_shows_the_spend_it_decided_on() -> None:
    spent = 0.0030004999  # at or past a budget of 0.0030004: rounded to 6 places it read 0.003, below it
    cost = CostSummary(
        usd=spent, agentcore_memory_usd=spent, agentcore_cpu_usd=0.0, pipeline_usd=0.0, rollouts=1, cpu_measured=1
    )
    batch = BatchView(exp_id="exp", batch_id="b", status=BatchState.ACCEPTED, cost=cost, budget_set_usd=0.0030004)
    published: list[Any] = []

    assert budget.check_batch(_announcing_deps(published), batch)

    warning, exhausted = published
    assert isinstance(warning, BudgetWarning)
    assert isinstance(exhausted, BudgetExhausted)
    assert exhausted.spent_usd == spent >= exhausted.budget_usd
    assert warning.spent_usd == spent
