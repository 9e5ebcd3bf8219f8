"""The agent image's start command (`rollout_pipeline.agent.start`): the configured module, served as its kind says."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout_pipeline.agent import rft_host, start
from rollout_pipeline.config import AGENT_KIND_ENV, AGENT_MODULE_ENV, DEFAULT_AGENT_MODULES

ART_MAIN = """
import sys
RAN = []
if __name__ == "__main__":
    import start_probe
    start_probe.ARGV.append(list(sys.argv))
"""


@pytest.fixture
def probe(tmp_path: Path) -> Iterator[Any]:
    (tmp_path / "start_probe.py").write_text("ARGV = []\n")
    (tmp_path / "art_start_agent.py").write_text(ART_MAIN)
    sys.path.insert(0, str(tmp_path))
    import start_probe

    yield start_probe
    sys.path.remove(str(tmp_path))
    sys.modules.pop("start_probe", None)


def test_art_runs_the_module_as_main_with_the_server_arguments(monkeypatch: pytest.MonkeyPatch, probe: Any) -> None:
    monkeypatch.setenv(AGENT_KIND_ENV, "art")
    monkeypatch.setenv(AGENT_MODULE_ENV, "art_start_agent")
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    start.main(["--host", "0.0.0.0", "--port", "8080"])
    assert [
        [str(Path(probe.__file__).with_name("art_start_agent.py")), "--host", "0.0.0.0", "--port", "8080"]
    ] == probe.ARGV


def test_rft_hands_the_module_to_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(rft_host, "main", lambda argv: calls.append(list(argv)))
    monkeypatch.setenv(AGENT_KIND_ENV, "RFT")
    monkeypatch.delenv(AGENT_MODULE_ENV, raising=False)
    start.main(["--port", "9000"])
    assert calls == [["--agent-module", DEFAULT_AGENT_MODULES["rft"], "--port", "9000"]]


def test_an_unknown_kind_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(AGENT_KIND_ENV, "sagemaker")
    with pytest.raises(SystemExit, match=AGENT_KIND_ENV):
        start.main([])
