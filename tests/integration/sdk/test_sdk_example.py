"""examples/grpo_consumer.py runs end to end against moto: submit -> ingestion -> lifecycle (fake ACR) -> groups, given
the outputs file `cdk deploy --outputs-file` (and `rollouts local up --write-outputs`) writes, or a flat one."""

from __future__ import annotations

import json
import runpy
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from rollout_pipeline.fakes.acr import AgentBehaviour, Behaviour, FakeAgentRuntime, FakeInvocation
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.sdk import Experiment, stack_name
from tests.conftest import REGION
from tests.integration.lifecycle_support import drive, make_deps
from tests.integration.sdk.test_sdk_submit import ingest_pending, write_jsonl

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "grpo_consumer.py"


def reward_by_index(inv: FakeInvocation) -> AgentBehaviour:
    return AgentBehaviour(rewards=float(inv.payload["_rollout"]["index"]))


@pytest.fixture
def moto_lock_but_sqs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Like lifecycle_support.moto_lock, but SQS requests are not serialised: the example long-polls the trainer
    queue for 20 s (its production default), which must not block the pipeline thread meanwhile."""
    from moto.core.responses import BaseResponse

    lock = threading.RLock()
    original = BaseResponse._dispatch

    def locked(self: Any, *args: Any, **kwargs: Any) -> Any:
        if type(self).__name__ == "SQSResponse":
            return original(self, *args, **kwargs)
        with lock:
            return original(self, *args, **kwargs)

    monkeypatch.setattr(BaseResponse, "_dispatch", locked)


@pytest.fixture
def fake_behaviour() -> Behaviour:
    return reward_by_index


@pytest.mark.usefixtures("moto_lock_but_sqs")
@pytest.mark.parametrize("shape", ["cdk deploy --outputs-file", "flat"])
def test_grpo_consumer_prints_group_advantages(
    resources: ExperimentResources,
    fake: FakeAgentRuntime,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    shape: str,
) -> None:
    outputs = tmp_path / "outputs.json"
    flat = resources.stack_outputs()
    outputs.write_text(json.dumps({stack_name(resources.config.name): flat} if shape != "flat" else flat))
    dataset = write_jsonl(tmp_path / "gsm.jsonl", [{"id": "a", "question": "1+1"}, {"id": "b", "question": "2+2"}])
    deps = make_deps(resources, fake)
    experiment = Experiment.from_outputs(resources.stack_outputs(), region=REGION)
    stop = threading.Event()

    def pipeline() -> None:
        while not stop.is_set():
            ingest_pending(experiment)
            drive(resources, deps, rounds=1, wait_s=0.5)
            stop.wait(0.2)

    worker = threading.Thread(target=pipeline, daemon=True)
    worker.start()
    monkeypatch.setattr(
        sys, "argv", ["grpo_consumer.py", str(dataset), "--outputs-file", str(outputs), "--group-size", "3"]
    )
    try:
        runpy.run_path(str(EXAMPLE), run_name="__main__")
    finally:
        stop.set()
        worker.join(10)
    out = capsys.readouterr().out
    # rewards 0, 1, 2 -> mean 1, std sqrt(2/3): advantages -1.225, 0, +1.225
    assert "a  rewards=[0.0, 1.0, 2.0]  advantages=[-1.225, +0.000, +1.225]" in out
    assert "b  rewards=[0.0, 1.0, 2.0]  advantages=[-1.225, +0.000, +1.225]" in out
    assert "done: 6 succeeded, 0 failed, reward mean 1.0" in out
