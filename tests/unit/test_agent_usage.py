"""The agent host reports what the session used beside the result (`agent.usage`), for every ART app of the process,
without touching the user's function; the image's start command installs it before it runs an unmodified module."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from rollout_pipeline.config import RESULT_USAGE_KEY
from rollout_pipeline.contracts import carries_attempt_token, reported_usage


class Puts:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def put_object(self, **kwargs: Any) -> None:
        self.bodies.append(json.loads(kwargs["Body"]))


@pytest.fixture
def art_app(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    from agentcore_rl_toolkit.app import AgentCoreRLApp

    from rollout_pipeline.agent import usage

    usage.install()
    app = AgentCoreRLApp()
    app.s3_client = Puts()
    return app


def test_every_saved_result_carries_the_sessions_cpu_seconds(art_app: Any) -> None:
    from rollout_pipeline.agent import usage

    before = usage.current_usage()
    art_app.add_async_task("rollout")  # ART registers one task per rollout it starts
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # burn a little CPU
        pass
    token = "t" * 64
    payload = {"q": 1, "_rollout": {"exp_id": "e", "input_id": "i", "s3_bucket": "b", "attempt_token": token}}
    result = {"rewards": 1.0, RESULT_USAGE_KEY: {"cpu_s": 0.0, "rollouts": 1}}  # an agent cannot set it
    art_app.save_result(result=result, rollout_config=payload["_rollout"], result_key="e/i/s.json", payload=payload)
    (body,) = art_app.s3_client.bodies
    reported = body[RESULT_USAGE_KEY]
    assert reported["cpu_s"] >= before["cpu_s"] + 0.04
    assert reported["rollouts"] == before["rollouts"] + 1
    assert reported["peak_rss_mb"] > 0
    assert body["rewards"] == 1.0
    assert body["payload"] == payload
    parsed = reported_usage(body)
    assert parsed is not None
    assert parsed.cpu_s == reported["cpu_s"]
    assert body["payload"]["_rollout"]["attempt_token"] == token  # the attempt token's place is ART's copy


def test_install_is_idempotent(art_app: Any) -> None:
    from agentcore_rl_toolkit.app import AgentCoreRLApp

    from rollout_pipeline.agent import usage

    patched = AgentCoreRLApp.save_result
    usage.install()
    assert AgentCoreRLApp.save_result is patched


def test_the_start_command_installs_it_before_it_runs_an_art_module(monkeypatch: pytest.MonkeyPatch) -> None:
    from rollout_pipeline.agent import start, usage

    installed: list[bool] = []
    monkeypatch.setattr(usage, "install", lambda: installed.append(True))
    monkeypatch.setattr(start.runpy, "run_module", lambda *a, **k: installed.append(False))
    monkeypatch.setenv("ROLLOUTS_AGENT_KIND", "art")
    monkeypatch.setenv("ROLLOUTS_AGENT_MODULE", "some_agent")
    start.main([])
    assert installed == [True, False]


def test_a_result_with_the_usage_key_still_proves_its_attempt() -> None:
    import hmac

    from rollout_pipeline.contracts import attempt_token

    key = b"k" * 32
    token = attempt_token(key, "e", "s" * 40)
    body = {"rewards": 1, "payload": {"_rollout": {"attempt_token": token}}, RESULT_USAGE_KEY: {"cpu_s": 1.0}}
    assert carries_attempt_token(body, key, "e", "s" * 40)
    assert hmac.compare_digest(token, body["payload"]["_rollout"]["attempt_token"])
