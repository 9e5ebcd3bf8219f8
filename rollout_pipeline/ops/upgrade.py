"""What a change to a live experiment must not break: the rollouts in flight, the ledger's layout, the endpoints
their sessions run on.

An update while rollouts run mixes two versions of the code over one ledger: a slot taken by the old code and given
back by the new one can land on a counter of another layout (a counter below zero then admits more than its cap),
and a result the old code's rollout writes may not be what the new completion accepts (it times out). Changing
`endpoints` re-routes the stops of running sessions to another qualifier (the endpoint is a hash of the session id
modulo `endpoints`), so a stop can be "confirmed" by two NotFounds while the session runs on. So the deploy of an
existing stack checks here first (`check_update`) and refuses while anything is in flight: unless forced for an
ordinary update, never for a new ledger layout (`keys.LAYOUT_VERSION`) or a new `endpoints`, which cancelling the
batches drains in minutes. `rollouts destroy` counts the same way (`in_flight`). docs/deploy.md, "Upgrades".

Reusable: a change that needs a drained experiment calls `require_drained(experiment, why, force=..., forceable=...)`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Final

from rollout_pipeline.ledger import keys
from rollout_pipeline.sdk._aws import aws_errors
from rollout_pipeline.sdk.errors import SdkError
from rollout_pipeline.sdk.experiment import Experiment

#: The settings whose change re-routes what running sessions need (their stops), so no force overrides a drain.
SESSION_ROUTING_SETTINGS: Final = ("endpoints",)
_QUEUE_COUNTS: Final = (
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
)


@dataclass(frozen=True)
class InFlight:
    """What an experiment has in flight: sessions holding a slot (on the counters of the ledger's layout, and on
    the single counter of layout 1) and messages in its rollout and ingest queues (visible, being handled, delayed).
    The queue counts are SQS's approximations: good enough to tell "drained" from "busy"."""

    sessions: int = 0
    legacy_sessions: int = 0
    queued: int = 0
    ingesting: int = 0
    #: Of `sessions`, those the warm pool holds (started ahead, running no rollout): not work in flight; an update
    #: or a destroy stops them first (`stop_warm_pool`).
    warm: int = 0

    @property
    def total(self) -> int:
        return self.sessions - self.warm + self.legacy_sessions + self.queued + self.ingesting

    def __str__(self) -> str:
        parts = [f"{self.sessions - self.warm + self.legacy_sessions} session(s) holding a slot"]
        if self.legacy_sessions:
            parts[0] += f" ({self.legacy_sessions} on the single counter of ledger layout 1)"
        parts.append(f"{self.queued} rollout message(s) queued")
        if self.ingesting:
            parts.append(f"{self.ingesting} dataset message(s) being ingested")
        return ", ".join(parts)


def in_flight(experiment: Experiment) -> InFlight:
    """What `experiment` has in flight (cheap reads: one Query of the slot counters, one GetItem, two
    GetQueueAttributes)."""
    with aws_errors(f"read what is in flight in {experiment.name}"):
        ledger = experiment.wiring().ledger()
        sessions, legacy = ledger.limits.in_flight(), ledger.experiment.legacy_slots()
        warm = len(ledger.warm.sessions())
        sqs = experiment.client("sqs")
        rollout = sqs.get_queue_attributes(QueueUrl=experiment.rollout_queue_url, AttributeNames=list(_QUEUE_COUNTS))
        ingesting = 0
        if experiment.stack_outputs.ingest_queue_url:  # rows still being ingested become rollouts
            ingest = sqs.get_queue_attributes(
                QueueUrl=experiment.stack_outputs.ingest_queue_url, AttributeNames=list(_QUEUE_COUNTS)
            )
            ingesting = sum(int(v) for v in ingest["Attributes"].values())
    queued = sum(int(v) for v in rollout["Attributes"].values())
    return InFlight(sessions=sessions, legacy_sessions=legacy, queued=queued, ingesting=ingesting, warm=warm)


def deployed_layout(experiment: Experiment) -> int:
    """The layout the experiment's ledger is stamped with (`keys.UNSTAMPED_LAYOUT` for a ledger from before stamps)."""
    with aws_errors(f"read the ledger layout of {experiment.name}"):
        found = experiment.wiring().ledger().experiment.layout_version()
    return keys.UNSTAMPED_LAYOUT if found is None else found


def require_drained(
    experiment: Experiment,
    why: str,
    *,
    force: bool,
    forceable: bool = True,
    say: Callable[[str], None] | None = None,
) -> InFlight:
    """Nothing in flight, or (`forceable` and `force`) go on anyway with a warning through `say`; else one
    `SdkError` saying what is in flight, why it matters (`why`) and how to drain."""
    busy = in_flight(experiment)
    if not busy.total:
        return busy
    if force and forceable:
        if say is not None:
            say(f"warning: {experiment.name} has {busy} in flight; going on as forced: {why}")
        return busy
    drain = (
        "wait for its rollouts to end, or cancel their batches (`rollouts cancel --batch`, exp.batches.cancel), "
        "then deploy again (docs/deploy.md, 'Upgrades')"
    )
    forcing = ", or deploy with force=True (--force) to go on anyway" if forceable else " (force does not apply)"
    raise SdkError(f"experiment {experiment.name} has {busy} in flight: {why}: {drain}{forcing}")


def check_update(
    experiment: Experiment,
    changed: Collection[str],
    *,
    force: bool,
    layout: int = keys.LAYOUT_VERSION,
    say: Callable[[str], None] | None = None,
) -> None:
    """Before updating a live experiment's stack to code of ledger `layout` with the settings `changed`: refuse
    while anything is in flight (`require_drained`); a new ledger layout or `endpoints` even when forced. Then the
    warm pool's sessions are stopped (they run the image being replaced; the pool refills with the next batch): an
    update refused leaves them running (they are not work in flight: `InFlight.warm`)."""
    _require_drained_for(experiment, changed, force=force, layout=layout, say=say)
    stop_warm_pool(experiment, "stopped", say)


def _require_drained_for(
    experiment: Experiment,
    changed: Collection[str],
    *,
    force: bool,
    layout: int,
    say: Callable[[str], None] | None,
) -> None:
    """`check_update`'s refusal, by what the update changes."""
    routing = sorted(set(changed) & set(SESSION_ROUTING_SETTINGS))
    deployed = deployed_layout(experiment)
    if deployed != layout:
        require_drained(
            experiment,
            f"this update moves its ledger from layout {deployed} to {layout}, whose items the running code and the "
            "new code read differently (slots could be over-admitted for good, results dropped)",
            force=force,
            forceable=False,
            say=say,
        )
    elif routing:
        require_drained(
            experiment,
            f"changing {', '.join(routing)} re-routes the stops of running sessions to other endpoints (a stop could "
            "be confirmed by NotFound while its session runs on)",
            force=force,
            forceable=False,
            say=say,
        )
    else:
        require_drained(
            experiment,
            "an update while rollouts run mixes two versions of the code over them (drain before upgrading)",
            force=force,
            say=say,
        )


def stop_warm_pool(experiment: Experiment, reason: str, say: Callable[[str], None] | None = None) -> int:
    """Stop every session of the experiment's warm pool (`exp.capacity.stop_warm_pool`) when it holds any; `reason`
    "destroyed" keeps it stopped for good. Returns how many were stopped."""
    with aws_errors(f"read the warm pool of {experiment.name}"):
        held = len(experiment.wiring().ledger().warm.sessions())
    if not held and reason != "destroyed":
        return 0
    stopped = experiment.capacity.stop_warm_pool(reason=reason)
    if stopped and say is not None:
        say(f"stopped {stopped} warm session(s) of the warm pool")
    return stopped
