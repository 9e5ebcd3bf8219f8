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


def test_two_threads_first_errors_meet_one_set_of_exception_classes(monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore loads a client's exception classes on first use, without a lock: two threads' first errors could
    each load a set, and one's `except client.exceptions.X` then missed the other's raise (4 concurrent MTRL
    invocations: a `ConditionalCheckFailedException` escaped `put_new`). The factory loads them as it makes the
    client; loading is slowed here so that two threads would both load them."""
    import threading
    import time

    from botocore.errorfactory import ClientExceptionsFactory

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    load = ClientExceptionsFactory._create_client_exceptions

    def slow_load(self: Any, service_model: Any) -> Any:
        time.sleep(1.0)
        return load(self, service_model)

    monkeypatch.setattr(ClientExceptionsFactory, "_create_client_exceptions", slow_load)
    client = EnvironmentFactory().client("dynamodb")
    barrier = threading.Barrier(2)
    seen: list[Any] = []

    def first_error() -> None:
        barrier.wait(timeout=30)
        seen.append(client.exceptions.ConditionalCheckFailedException)

    threads = [threading.Thread(target=first_error) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(seen) == 2
    assert seen[0] is seen[1]
