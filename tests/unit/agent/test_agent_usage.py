"""The agent host reports what the session used beside the result (`agent.usage`), for every ART app of the process,
without touching the user's function; the image's start command installs it before it runs an unmodified module."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace
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
    deadline = time.process_time() + 0.1
    while time.process_time() < deadline:  # burn a little CPU
        pass
    token = "t" * 64
    payload = {"q": 1, "_rollout": {"exp_id": "e", "input_id": "i", "s3_bucket": "b", "attempt_token": token}}
    result = {"rewards": 1.0, RESULT_USAGE_KEY: {"cpu_s": 0.0, "rollouts": 1}}  # an agent cannot set it
    art_app.save_result(result=result, rollout_config=payload["_rollout"], result_key="e/i/s.json", payload=payload)
    (body,) = art_app.s3_client.bodies
    reported = body[RESULT_USAGE_KEY]
    assert reported["cpu_s"] >= before["cpu_s"] + 0.05  # reported to 0.01 s: margin for the rounding
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


def test_the_agent_host_installs_it_before_it_imports_the_module(monkeypatch: pytest.MonkeyPatch) -> None:
    from rollout_pipeline.agent import credentials, host, usage

    order: list[str] = []

    def load(module: str, kind: str, argv: object = (), environ: object = None) -> host.ServedAgent:
        order.append(f"load {module}")
        return host.ServedAgent(app=object(), entry=SimpleNamespace(module=module, app_name="app"), kind="art")  # type: ignore[arg-type]

    monkeypatch.setattr(usage, "install", lambda: order.append("install"))
    monkeypatch.setattr(host, "load", load)
    monkeypatch.setattr(host, "serve", lambda app, h, p: order.append("serve"))
    monkeypatch.setattr(credentials, "load_model_credential", lambda: None)
    host.main(["--agent-module", "some_agent", "--agent-kind", "art", "--port", "18080"])
    assert order == ["install", "load some_agent", "serve"]


def test_a_result_with_the_usage_key_still_proves_its_attempt() -> None:
    import hmac

    from rollout_pipeline.contracts import attempt_token

    key = b"k" * 32
    token = attempt_token(key, "e", "s" * 40)
    body = {"rewards": 1, "payload": {"_rollout": {"attempt_token": token}}, RESULT_USAGE_KEY: {"cpu_s": 1.0}}
    assert carries_attempt_token(body, key, "e", "s" * 40)
    assert hmac.compare_digest(token, body["payload"]["_rollout"]["attempt_token"])
