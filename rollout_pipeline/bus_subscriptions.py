"""The private subscriptions processes make on an experiment's bus (a rule and an SQS queue of the same name:
`sdk/subscription.py` makes them) and what tells that their owner is gone: their names, tags, the rule's
description (kind, owner, creation, heartbeat) and the owner's liveness.

A subscription made with a heartbeat has its queue's `rollouts:seen-at` tag refreshed every `HEARTBEAT_S` by its
owner process while it is open, whether or not the owner reads it. A process killed with SIGKILL (or OOM-killed, or
lost with its node) runs no cleanup: its subscription is gone once it is `STALE_S` unseen (the sweeper, every
minute), or at once when its owner ran on the host that looks (the owner's process id no longer exists: the SDK
when it opens a subscription, local mode's sweeper). Subscriptions made without a heartbeat (no `sqs:TagQueue`, or
an earlier version) are left to `rollouts subscriptions prune`.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

#: Name kinds (after `{bus}-`) of the subscriptions on the experiment bus: `rollouts watch`'s taps, the SDK's own
#: streams (`events(batch_id=...)`, `groups`, `RolloutClient`) and the ART backend's per-process queues.
BUS_KINDS: Final = ("tap", "sdk", "art")
#: The target id every subscription rule delivers to its queue with.
TARGET_ID: Final = "tap"
#: Tags of a subscription's rule and queue (the queue's `seen-at` is refreshed by its owner).
TAG_KIND: Final = "rollouts:subscription"
TAG_OWNER: Final = "rollouts:owner"
TAG_CREATED: Final = "rollouts:created-at"
TAG_SEEN: Final = "rollouts:seen-at"
#: An open subscription's owner refreshes `seen-at` this often (one TagQueue a minute per subscription).
HEARTBEAT_S: Final = 60.0
#: A subscription with a heartbeat not seen for this long (five missed beats) has lost its owner.
STALE_S: Final = 300.0

_DESCRIPTION: Final = re.compile(
    r"^rollouts (?P<kind>[a-z]+) subscription of (?P<owner>\S+), created (?P<created>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)"
    r"(?:; heartbeat (?P<heartbeat>\d+) s)?(?:; pid namespace (?P<pidns>\d+))?$"
)
_OWNER: Final = re.compile(r"^(?P<user>[^@]*)@(?P<host>.+):(?P<pid>\d+)$")
_TIME_FORMAT: Final = "%Y-%m-%dT%H:%M:%SZ"


@dataclass(frozen=True, slots=True)
class RuleFacts:
    """What a subscription rule's description says: its kind, owner (`user@host:pid`), creation (epoch s) and the
    owner's heartbeat period (None: made without one)."""

    kind: str
    owner: str
    created: float
    heartbeat_s: int | None
    #: The owner's process-id namespace (Linux; None: not recorded): its pid means something only in it.
    pid_namespace: int | None = None


def iso(moment: float) -> str:
    """A UTC time as tags and descriptions carry it: `2026-11-24T01:20:00Z`."""
    return datetime.fromtimestamp(moment, UTC).strftime(_TIME_FORMAT)


def parse_time(text: str | None) -> float | None:
    """Epoch seconds of a time written by `iso`, None for anything else."""
    if not text:
        return None
    try:
        return datetime.strptime(text, _TIME_FORMAT).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def description(kind: str, owner: str, created: str, heartbeat_s: int | None, pid_namespace: int | None = None) -> str:
    """The rule's description (at most 512 characters: EventBridge's limit)."""
    text = f"rollouts {kind} subscription of {owner}, created {created}"
    text += f"; heartbeat {heartbeat_s} s" if heartbeat_s else ""
    text += f"; pid namespace {pid_namespace}" if pid_namespace is not None else ""
    return text[:512]


def parse_description(text: str) -> RuleFacts | None:
    """The facts of a description written by `description` (None: not one)."""
    found = _DESCRIPTION.match(text)
    created = parse_time(found.group("created")) if found else None
    if found is None or created is None:
        return None
    beat, namespace = found.group("heartbeat"), found.group("pidns")
    return RuleFacts(
        found.group("kind"),
        found.group("owner"),
        created,
        int(beat) if beat else None,
        int(namespace) if namespace else None,
    )


def this_owner(user: str) -> str:
    """This process as a subscription's owner: `user@host:pid`."""
    return f"{user}@{socket.gethostname()}:{os.getpid()}"


def pid_namespace() -> int | None:
    """This process's process-id namespace (the inode of `/proc/self/ns/pid`; None where there is none: macOS)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def owner_gone(owner: str, namespace: int | None = None) -> bool:
    """Whether `owner` (`user@host:pid`, its pids in process-id `namespace`) ran here and its process no longer
    exists. False when it cannot be told here: another host, another pid namespace (a container may share the host's
    name), or a process id of another user's process or in use again (counted alive)."""
    found = _OWNER.match(owner)
    if found is None or found.group("host") != socket.gethostname() or namespace != pid_namespace():
        return False
    pid = int(found.group("pid"))
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # PermissionError: it exists (another user's)
        return False
    return False


def gone(facts: RuleFacts, seen_at: Callable[[], float | None], now: float) -> bool:
    """Whether a subscription has lost its owner: the owner's process is gone on this host, or (one made with a
    heartbeat) neither it was created nor its queue seen for `STALE_S`. `seen_at` reads the queue's `seen-at` (None:
    the queue or its tag is gone), only for a subscription older than that."""
    if owner_gone(facts.owner, facts.pid_namespace):
        return True
    if facts.heartbeat_s is None:
        return False
    stale_s = max(STALE_S, 5.0 * facts.heartbeat_s)
    if now - facts.created < stale_s:
        return False
    return now - max(facts.created, seen_at() or 0.0) >= stale_s
