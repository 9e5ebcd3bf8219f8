"""The sweeper's reaper of private subscriptions (`bus_subscriptions`): each run removes the subscriptions on the
experiment's bus whose owner is gone (its process no longer exists on this host, or its heartbeat is older than
`bus_subscriptions.STALE_S`), so a process killed with SIGKILL leaves no rule behind on the bus (EventBridge allows
300 per bus, and a bus with rules cannot be deleted). One ListRules call a page, then one look at the queue of each
subscription old enough to be stale; nothing for one made without a heartbeat (left to `rollouts subscriptions
prune`)."""

from __future__ import annotations

import logging

from rollout_pipeline import bus_subscriptions
from rollout_pipeline.ports import BusSubscriptions

log = logging.getLogger(__name__)


def prune_gone(subscriptions: BusSubscriptions, now: float) -> list[str]:
    """Remove the subscriptions whose owner is gone (`bus_subscriptions.gone`); returns their names. A failure to
    remove one is logged and the others go on (the next run tries it again)."""
    removed: list[str] = []
    for name, text in subscriptions.listed():
        facts = bus_subscriptions.parse_description(text)
        if facts is None:
            continue

        def seen(name: str = name) -> float | None:
            return bus_subscriptions.parse_time(subscriptions.seen_tag(name))

        if not bus_subscriptions.gone(facts, seen, now):
            continue
        try:
            subscriptions.remove(name)
        except Exception as exc:
            log.warning("could not remove the subscription %s of %s (gone): %s", name, facts.owner, exc)
            continue
        log.info("removed the %s subscription %s of %s: its owner is gone", facts.kind, name, facts.owner)
        removed.append(name)
    return removed
