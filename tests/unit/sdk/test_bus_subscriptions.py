"""What a subscription rule's description says, and when its owner is gone (`bus_subscriptions`)."""

from __future__ import annotations

import os
import socket
import subprocess

from rollout_pipeline import bus_subscriptions as bs

CREATED = "2026-11-24T01:20:00Z"


def test_a_description_says_kind_owner_creation_heartbeat_and_pid_namespace() -> None:
    text = bs.description("sdk", "me@host:42", CREATED, 60, 4026531836)
    assert (
        text == f"rollouts sdk subscription of me@host:42, created {CREATED}; heartbeat 60 s; pid namespace 4026531836"
    )
    assert bs.parse_description(text) == bs.RuleFacts("sdk", "me@host:42", bs.parse_time(CREATED) or 0, 60, 4026531836)
    earlier = bs.parse_description(f"rollouts art subscription of me@host:42, created {CREATED}")  # no heartbeat
    assert earlier is not None
    assert (earlier.heartbeat_s, earlier.pid_namespace) == (None, None)
    assert bs.parse_description("Routes pipeline events to the trainer queue") is None


def test_an_owner_is_gone_only_when_its_process_is_gone_from_this_host_and_namespace() -> None:
    host, namespace = socket.gethostname(), bs.pid_namespace()
    finished = subprocess.Popen(["true"])
    finished.wait()
    assert bs.owner_gone(f"me@{host}:{finished.pid}", namespace)
    assert not bs.owner_gone(f"me@{host}:{os.getpid()}", namespace), "this process is alive"
    assert not bs.owner_gone(f"me@another-{host}:{finished.pid}", namespace), "another host cannot be told"
    assert not bs.owner_gone(f"me@{host}:{finished.pid}", (namespace or 0) + 1), "nor another pid namespace"
    assert not bs.owner_gone("not an owner", namespace)


def test_a_subscription_with_a_heartbeat_is_gone_once_stale() -> None:
    elsewhere = bs.RuleFacts("sdk", "me@elsewhere:1", created=1000.0, heartbeat_s=60)
    assert not bs.gone(elsewhere, lambda: None, now=1000.0 + bs.STALE_S - 1), "young: its queue is not even read"
    assert bs.gone(elsewhere, lambda: None, now=1000.0 + bs.STALE_S)
    assert not bs.gone(elsewhere, lambda: 1000.0 + bs.STALE_S, now=1000.0 + bs.STALE_S + 10), "seen a moment ago"
    no_heartbeat = bs.RuleFacts("art", "me@elsewhere:1", created=1000.0, heartbeat_s=None)
    assert not bs.gone(no_heartbeat, lambda: None, now=1e9), "left to `rollouts subscriptions prune`"
