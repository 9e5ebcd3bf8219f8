"""The rollout state machine against DynamoDB semantics (moto), driven by Hypothesis: any interleaving of
dispatches, invokes, undone dispatches, results, timeouts and cancels, with stale and duplicated attempts, keeps the
ledger consistent with a simple model: one terminal transition at most, counters once, slot held iff dispatched."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from rollout_pipeline import ids
from rollout_pipeline.adapters import clients
from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.attributes import item_values
from rollout_pipeline.ledger.items import RolloutRecord, Terminal
from rollout_pipeline.ledger.ledger import Ledger
from rollout_pipeline.ledger.outbox import OUTBOX_PUBLISH
from rollout_pipeline.ledger.rollouts import DISPATCHED, FAILED, QUEUED, SUCCEEDED, DispatchStart
from rollout_pipeline.local.resources import ExperimentResources

INPUT = "q"
FINISHED = datetime(2026, 1, 1, tzinfo=UTC)
INDEX = 0
attempts = st.integers(min_value=1, max_value=3)


def _item(table: str, key: dict[str, Any]) -> dict[str, Any]:
    raw = clients.client("dynamodb").get_item(TableName=table, Key=key, ConsistentRead=True).get("Item")
    return item_values(raw) if raw else {}


def make_machine(resources: ExperimentResources) -> type[RuleBasedStateMachine]:
    table = resources.table_name
    exp = resources.config.name

    class RolloutMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.whole = Ledger.open(table)
            self.ledger = self.whole.rollouts
            self.batch = f"sm-{uuid.uuid4().hex[:12]}"
            ddb = clients.client("dynamodb")
            ddb.put_item(
                TableName=table,
                Item={
                    **keys.batch_key(self.batch),
                    "exp_id": {"S": exp},
                    "batch_id": {"S": self.batch},
                    "status": {"S": "accepted"},
                },
            )
            ddb.put_item(
                TableName=table,
                Item={
                    **keys.group_key(self.batch, INPUT),
                    "exp_id": {"S": exp},
                    "batch_id": {"S": self.batch},
                    "input_id": {"S": INPUT},
                    "group_size": {"N": "1"},
                    "terminal": {"N": "0"},
                    "rewards": {"M": {}},
                    "failures": {"M": {}},
                },
            )
            self.base_in_flight = self.whole.limits.in_flight()
            # the model
            self.state: str | None = None
            self.attempt = 0
            self.invoked = False
            self.terminal_transitions = 0

        # ------------------------------------------------------------------------------------------ helpers

        def record(self) -> RolloutRecord | None:
            return self.ledger.get_rollout(self.batch, INPUT, INDEX)

        def now(self) -> int:
            return 1_800_000_000

        def finish(self, attempt: int, from_state: str | None, outcome: Terminal) -> bool:
            return self.ledger.finish(
                ids.AttemptRef(self.batch, INPUT, INDEX, attempt),
                exp_id=exp,
                from_state=from_state,
                outcome=outcome,
                outbox=frozenset({OUTBOX_PUBLISH}),
            )

        # -------------------------------------------------------------------------------------------- rules

        @rule(attempt=attempts)
        def dispatch(self, attempt: int) -> None:
            start = self.ledger.begin_dispatch(
                exp_id=exp,
                batch_id=self.batch,
                input_id=INPUT,
                index=INDEX,
                attempt=attempt,
                session_id=ids.session_id(exp, self.batch, INPUT, INDEX, attempt),
                submitted_at="2026-01-01T00:00:00+00:00",
                deadline=self.now() + 60,
                max_sessions=10_000,
                policy_version=None,
            )
            expected = (self.state is None and attempt == 1) or (self.state == QUEUED and self.attempt == attempt)
            assert (start is DispatchStart.STARTED) == expected, (start, self.state, self.attempt, attempt)
            if expected:
                self.state, self.attempt, self.invoked = DISPATCHED, attempt, False
            else:
                assert start is DispatchStart.NOT_DISPATCHABLE

        @rule(attempt=attempts)
        def mark_invoked(self, attempt: int) -> None:
            ok = self.ledger.mark_invoked(ids.AttemptRef(self.batch, INPUT, INDEX, attempt))
            expected = self.state == DISPATCHED and self.attempt == attempt
            assert ok == expected
            if ok:
                self.invoked = True

        @rule(attempt=attempts)
        def undo_after_throttling(self, attempt: int) -> None:
            ok = self.ledger.undo_dispatch(ids.AttemptRef(self.batch, INPUT, INDEX, attempt))
            expected = self.state == DISPATCHED and self.attempt == attempt and not self.invoked
            assert ok == expected
            if ok:
                self.state = QUEUED

        @rule(attempt=attempts, success=st.booleans(), reward=st.floats(-10, 10, allow_nan=False))
        def result(self, attempt: int, success: bool, reward: float) -> None:
            outcome = (
                Terminal(state=SUCCEEDED, finished_at=FINISHED, reward=reward, rewards=reward)
                if success
                else Terminal(state=FAILED, finished_at=FINISHED, reason="agent_error", error="boom")
            )
            ok = self.finish(attempt, DISPATCHED, outcome)
            expected = self.state == DISPATCHED and self.attempt == attempt
            assert ok == expected
            if ok:
                self.state = SUCCEEDED if success else FAILED
                self.terminal_transitions += 1

        @precondition(lambda self: self.state == DISPATCHED)
        @rule(stale=st.booleans())
        def deadline_passed(self, stale: bool) -> None:
            rec = self.record()
            assert rec is not None
            if stale:  # a sweeper holding an older read
                rec = RolloutRecord(**{**rec.__dict__, "attempt": rec.attempt - 1})
            next_sid = ids.session_id(exp, self.batch, INPUT, INDEX, rec.attempt + 1)
            ok = self.ledger.requeue_for_retry(rec, next_session_id=next_sid, stop_pending=False)
            assert ok == (not stale)
            if ok:
                self.state, self.attempt, self.invoked = QUEUED, self.attempt + 1, False

        @rule(attempt=st.integers(min_value=0, max_value=3), from_state=st.sampled_from([None, QUEUED, DISPATCHED]))
        def cancel(self, attempt: int, from_state: str | None) -> None:
            outcome = Terminal(state=FAILED, finished_at=FINISHED, reason="cancelled", error="cancelled")
            ok = self.finish(attempt, from_state, outcome)
            expected = (self.state is None and from_state is None) or (
                self.state == from_state and self.attempt == attempt and from_state is not None
            )
            assert ok == expected, (ok, self.state, self.attempt, from_state, attempt)
            if ok:
                self.state, self.attempt = FAILED, attempt
                self.terminal_transitions += 1

        # ------------------------------------------------------------------------------------------ checks

        @invariant()
        def ledger_matches_model(self) -> None:
            rec = self.record()
            if self.state is None:
                assert rec is None
                return
            assert rec is not None
            assert (rec.state, rec.attempt) == (self.state, self.attempt)
            item = _item(table, keys.rollout_key(self.batch, INPUT, INDEX))
            assert (keys.DEADLINE_PK in item) == (self.state == DISPATCHED)
            if rec.terminal:
                assert OUTBOX_PUBLISH in rec.outbox
                assert item[keys.OUTBOX_PK] == keys.outbox_pk(self.batch, INPUT, INDEX)

        @invariant()
        def slot_held_iff_dispatched(self) -> None:
            assert self.whole.limits.in_flight() - self.base_in_flight == (1 if self.state == DISPATCHED else 0)

        @invariant()
        def counted_once(self) -> None:
            assert self.terminal_transitions <= 1
            group = _item(table, keys.group_key(self.batch, INPUT))
            batch = self.whole.batches.read_batch(self.batch)  # counters summed over the batch's COUNT# shards
            assert batch is not None
            assert group["terminal"] == self.terminal_transitions
            assert batch.terminal == self.terminal_transitions
            assert len(group["rewards"]) + len(group["failures"]) == self.terminal_transitions
            if self.state == SUCCEEDED:
                assert batch.succeeded == 1
                assert batch.reward_count == 1

    return RolloutMachine


def test_rollout_state_machine(resources: ExperimentResources) -> None:
    run_state_machine_as_test(
        make_machine(resources),
        settings=settings(max_examples=25, stateful_step_count=15, deadline=None, print_blob=True),
    )
