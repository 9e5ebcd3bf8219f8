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
