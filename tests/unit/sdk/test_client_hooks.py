"""A botocore hook registered on a client factory reaches every client it makes, across resets."""

from __future__ import annotations

from typing import Any

import pytest

from rollout_pipeline.adapters.clients import EnvironmentFactory


def test_a_hook_registered_before_the_first_client_survives_the_factorys_reset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    factory = EnvironmentFactory()
    seen: list[str] = []

    def hook(event_name: str = "", **_kwargs: Any) -> None:
        seen.append(event_name)

    factory.register_hook("rollouts-probe", hook)
    first = factory.client("sqs")  # the environment factory resets itself on its first client
    first.meta.events.emit("rollouts-probe.sqs.ListQueues")
    factory.reset()
    second = factory.client("sqs")
    second.meta.events.emit("rollouts-probe.sqs.ListQueues")
    assert seen == ["rollouts-probe.sqs.ListQueues"] * 2


def test_a_hook_registered_after_a_reset_runs_once_per_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registering makes the factory's session when a reset dropped it; that session takes the hooks registered so
    far, and the new one must not be among them as well as registered again (it ran twice per call: a bench's
    second mode counted every request twice and slept every injected latency twice)."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    factory = EnvironmentFactory()
    factory.client("sqs")  # the first client (the environment factory resets itself then)
    factory.reset()
    seen: list[str] = []

    def hook(event_name: str = "", **_kwargs: Any) -> None:
        seen.append(event_name)

    factory.register_hook("rollouts-probe", hook)
    factory.client("sqs").meta.events.emit("rollouts-probe.sqs.ListQueues")
    assert seen == ["rollouts-probe.sqs.ListQueues"]
