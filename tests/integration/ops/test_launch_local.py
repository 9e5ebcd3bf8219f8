"""One switch between local and deployed: `Experiment.launch(name, mode="local", **settings)` runs the local
pipeline in the background for trainer code written against the SDK, and `destroy()` (or the end of a `with`
block) stops everything it started."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rollout_pipeline.adapters.s3 import S3ObjectStore
from rollout_pipeline.fakes.acr import AgentBehaviour, FakeAgentRuntime
from rollout_pipeline.ops.launch import launcher
from rollout_pipeline.sdk import Experiment, SdkError

MODEL_URL = "http://127.0.0.1:9/v1"  # never called: the fake agent answers


def train(experiment: Experiment) -> dict[str, list[float]]:
    """A trainer step as a user writes it, the same for both modes: submit, consume complete groups."""
    batch = experiment.submit([{"id": "a", "q": 1}, {"id": "b", "q": 2}])
    return {group.input_id: group.rewards for group in experiment.groups(batch, timeout=60, poll_wait_s=1)}


def _local_options(tmp_path: Path) -> dict[str, Any]:
    return {
        "runtime_factory": lambda _resources: FakeAgentRuntime(
            store=S3ObjectStore(), behaviour=AgentBehaviour(rewards=0.5)
        ),
        "sweep_interval_s": 5.0,
        "work_dir": tmp_path / "work",
    }


def _threads_end(before: set[threading.Thread], deadline_s: float = 10.0) -> list[str]:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        left = [t.name for t in threading.enumerate() if t not in before and t.is_alive()]
        if not left:
            return []
        time.sleep(0.05)
    return [t.name for t in threading.enumerate() if t not in before and t.is_alive()]


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)


def test_the_local_switch_runs_a_batch_and_destroy_leaves_nothing_running(
    tmp_path: Path, clean_environment: None
) -> None:
    before = set(threading.enumerate())
    experiment = Experiment.launch(
        "launch-local",
        mode="local",
        group_size=2,
        max_sessions=4,
        model_base_url=MODEL_URL,
        local_options=_local_options(tmp_path),
    )
    endpoint = experiment.aws.endpoint_url
    assert endpoint
    assert endpoint.startswith("http://127.0.0.1:")
    assert experiment.name == "launch-local"
    assert experiment.config.group_size == 2

    rewards = train(experiment)
    experiment.destroy()

    assert rewards == {"a": [0.5, 0.5], "b": [0.5, 0.5]}
    assert _threads_end(before) == [], "every thread the local pipeline started has ended"
    assert os.environ.get("AWS_ENDPOINT_URL") is None, "the process environment is restored"
    experiment.destroy()  # a second destroy does nothing


def test_a_with_block_stops_the_local_pipeline_even_when_the_trainer_fails(
    tmp_path: Path, clean_environment: None
) -> None:
    before = set(threading.enumerate())
    seen: dict[str, int] = {}

    def crashing_trainer() -> None:
        with Experiment.launch(
            "launch-crash", "local", model_base_url=MODEL_URL, local_options=_local_options(tmp_path)
        ) as experiment:
            seen["group_size"] = experiment.config.group_size
            raise RuntimeError("trainer crashed")

    with pytest.raises(RuntimeError, match="trainer crashed"):
        crashing_trainer()
    assert seen == {"group_size": 4}, "local mode's own default where nothing was set"
    assert _threads_end(before) == []


def test_local_mode_refuses_bad_settings_and_unknown_options_before_starting(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    with pytest.raises(SdkError, match="group_size"):
        Experiment.launch("launch-bad", mode="local", group_size=0)
    with pytest.raises(SdkError, match="unknown local option"):
        Experiment.launch("launch-bad", mode="local", local_options={"no_such": 1})
    with pytest.raises(SdkError, match="mode must be one of deployed, local"):
        Experiment.launch("launch-bad", mode="cloud")
    for not_a_dict in ("agent_module=my_agent", ["agent_module"], 3):
        with pytest.raises(SdkError, match=r"local_options must be a dict of local mode's settings.*\(got "):
            Experiment.launch("launch-bad", mode="local", local_options=not_a_dict)
    assert _threads_end(before, 0.0) == []


def test_the_local_launcher_is_found_through_its_entry_point() -> None:
    from rollout_pipeline.local.launch import launch

    assert launcher("local") is launch
