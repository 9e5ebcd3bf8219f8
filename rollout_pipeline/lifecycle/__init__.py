"""The rollout lifecycle: dispatch, completion, sweeper, cancel, publishing (outbox) and limits.

Entry points (each takes a `LifecycleDeps`):
- `dispatch.dispatch_records(records, deps, wait_until=...)`: the rollout-queue consumer (SQS batch).
- `completion.complete_records(records, deps)` / `completion.handle_result_event(event, deps)`.
- `sweeper.sweep(deps)`: deadlines and the outbox.
- `cancel.cancel_batch(batch_id, deps)`.
"""
