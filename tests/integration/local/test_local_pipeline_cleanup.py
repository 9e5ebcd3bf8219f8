"""Local mode stops everything it started when the run fails or is interrupted, and restores the process state."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from rollout_pipeline.adapters.runtime import local_runtime
from rollout_pipeline.fakes.acr import FakeAgentRuntime
from rollout_pipeline.local.pipeline import LocalPipeline, LocalSettings, interrupt_on_signals


def _port_open(url: str) -> bool:
    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 80), timeout=1):
            return True
    except OSError:
        return False


def _crash_inside(settings: LocalSettings, seen: dict[str, Any]) -> None:
    """Start the pipeline, record what it started, then fail the way a crashing trainer script would."""
    with LocalPipeline(settings) as pipeline:
        seen["endpoint"] = pipeline.endpoint_url
        seen["threads"] = [t for c in pipeline.consumers for t in c._threads]
        seen["port_open"] = _port_open(pipeline.endpoint_url)
        seen["env_endpoint"] = os.environ.get("AWS_ENDPOINT_URL")
        seen["runtime_installed"] = local_runtime(pipeline.endpoint_url) is pipeline.runtime
        seen["threads_alive"] = all(t.is_alive() for t in seen["threads"])
        pipeline.runtime.invoke("cleanup-session-0000000000000000000000001", {})
        seen["sessions"] = pipeline.active_sessions()
        raise RuntimeError("trainer crashed")


def test_pipeline_stops_everything_it_started_when_the_run_fails(tmp_path: Path) -> None:
    before_env = os.environ.get("AWS_ENDPOINT_URL")
    settings = LocalSettings(
        experiment="cleanup",
        model_url="http://127.0.0.1:9/v1",
        runtime_factory=lambda resources: FakeAgentRuntime(),
        work_dir=tmp_path,
    )
    seen: dict[str, Any] = {}
    with pytest.raises(RuntimeError, match="trainer crashed"):
        _crash_inside(settings, seen)

    assert seen["port_open"]
    assert seen["env_endpoint"] == seen["endpoint"]
    assert seen["runtime_installed"]
    assert len(seen["threads"]) >= 4
    assert seen["threads_alive"]
    assert seen["sessions"] == ["cleanup-session-0000000000000000000000001"], "sessions seen through the runtime"
    assert not _port_open(seen["endpoint"]), "the moto server is stopped"
    assert not any(t.is_alive() for t in seen["threads"]), "every consumer thread ended"
    assert os.environ.get("AWS_ENDPOINT_URL") == before_env, "the environment is restored"
    assert os.environ.get("TABLE_NAME") != "rollouts-cleanup-ledger"
    assert local_runtime(seen["endpoint"]) is None, "the endpoint's runtime is unregistered"


def _terminate_self_and_wait() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)  # interrupted at once by the handler


def test_sigterm_becomes_keyboard_interrupt_so_cleanup_runs() -> None:
    assert threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM)
    with interrupt_on_signals(), pytest.raises(KeyboardInterrupt):
        _terminate_self_and_wait()
    assert signal.getsignal(signal.SIGTERM) == previous, "the previous SIGTERM handler is restored"


def _failing_runtime(resources: Any) -> Any:
    raise RuntimeError("the agent runtime cannot start")


def test_a_run_that_never_started_leaves_no_work_directory_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its own temporary work directory is removed with the failed start (a `--work-dir` of the user's is kept)."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    settings = LocalSettings(experiment="never", model_url="http://127.0.0.1:9/v1", runtime_factory=_failing_runtime)
    pipeline = LocalPipeline(settings)
    assert pipeline.work_dir.parent == tmp_path
    with pytest.raises(RuntimeError, match="cannot start"):
        pipeline.start()
    assert list(tmp_path.iterdir()) == []

    given = tmp_path / "mine"
    settings.work_dir = given
    with pytest.raises(RuntimeError, match="cannot start"):
        LocalPipeline(settings).start()
    assert given.is_dir()


def test_bad_settings_are_refused_in_one_line_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    from rollout_pipeline.config import ConfigError

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    settings = LocalSettings(experiment="ok-name", group_size=-2, sampling_params={"temperature": 99})
    with pytest.raises(ConfigError) as refused:
        LocalPipeline(settings).start()
    message = str(refused.value)
    assert "\n" not in message
    assert "group_size: Input should be greater than or equal to 1 (got -2)" in message
    assert "sampling_params.temperature" in message
    assert list(tmp_path.iterdir()) == []
