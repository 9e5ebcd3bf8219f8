"""The agent host (`rollout_pipeline.agent.host`, the image's start command and every local agent process): it
imports the author's module without running its server, finds its app and serves it on the address it is given."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bedrock_agentcore.runtime import BedrockAgentCoreApp

from rollout_pipeline.agent import host
from rollout_pipeline.agent.modules import AgentModuleError, load_entrypoint
from rollout_pipeline.config import AGENT_KIND_ENV, AGENT_MODULE_ENV, DEFAULT_AGENT_MODULES

#: Written the ART way, and then some: `app.run()` under the `__main__` guard AND bare at module level, plus a module
#: that reads `--host/--port` from `sys.argv` when imported (as `python -m MODULE --host H --port P` would give them).
ART_WAY = """
import sys
from agentcore_rl_toolkit import AgentCoreRLApp

ARGV = list(sys.argv)
app = AgentCoreRLApp()


@app.rollout_entrypoint
def invoke_agent(payload):
    return {"rewards": 1.0}


app.run()

if __name__ == "__main__":
    app.run()
"""

TWO_APPS = """
from agentcore_rl_toolkit import AgentCoreRLApp

spare = AgentCoreRLApp()
app = AgentCoreRLApp()


@spare.rollout_entrypoint
def unused(payload):
    return {"rewards": 0.0}


@app.rollout_entrypoint
def used(payload):
    return {"rewards": 1.0}


app.run(port=8080)
"""

PLAIN_ENTRYPOINT = """
from bedrock_agentcore.runtime import BedrockAgentCoreApp

app = BedrockAgentCoreApp()


@app.entrypoint
def invoke(payload):
    return {"reward": 1.0}


app.run()
"""


@pytest.fixture
def agents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for name, source in {
        "host_art_way": ART_WAY,
        "host_two_apps": TWO_APPS,
        "host_plain_entrypoint": PLAIN_ENTRYPOINT,
        "host_raises": "raise RuntimeError('MODEL_KEY is not set')\n",
        "host_no_app": "VALUE = 1\n",
    }.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in list(sys.modules):
        if name.startswith("host_"):
            sys.modules.pop(name)


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, str, int]]:
    """What `host.serve` was asked to serve (nothing is really served)."""
    calls: list[tuple[Any, str, int]] = []
    monkeypatch.setattr(host, "serve", lambda app, address, port: calls.append((app, address, port)))
    monkeypatch.delenv(AGENT_MODULE_ENV, raising=False)
    monkeypatch.delenv(AGENT_KIND_ENV, raising=False)
    return calls


def test_an_art_way_module_is_imported_without_starting_its_server(agents: Path) -> None:
    run_before, argv_before = BedrockAgentCoreApp.run, list(sys.argv)
    entry = load_entrypoint("host_art_way", ["--host", "127.0.0.1", "--port", "9123"])
    module = sys.modules["host_art_way"]
    assert entry.app is module.app
    assert entry.is_art_rollout_app
    assert module.ARGV == ["host_art_way", "--host", "127.0.0.1", "--port", "9123"]
    # `app.run()` only noted the request while importing; everything is as it was after.
    assert BedrockAgentCoreApp.run is run_before
    assert sys.argv == argv_before


def test_the_host_serves_the_modules_app_on_the_address_it_is_given(agents: Path, served: list[Any]) -> None:
    host.main(["--agent-module", "host_art_way", "--host", "127.0.0.1", "--port", "9124"])
    assert served == [(sys.modules["host_art_way"].app, "127.0.0.1", 9124)]


def test_of_several_apps_the_one_the_module_runs_is_served(agents: Path) -> None:
    entry = load_entrypoint("host_two_apps")
    assert entry.app_name == "app"
    assert load_entrypoint("host_two_apps:spare").app_name == "spare"


def test_a_plain_entrypoint_is_served_through_the_rft_adapter_whatever_the_kind(
    agents: Path, served: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from rollout_pipeline.agent.app import RolloutApp
    from rollout_pipeline.agent.rft_host import RFT_RUNTIME_ENDPOINT_ENV

    monkeypatch.setenv(RFT_RUNTIME_ENDPOINT_ENV, "unset")  # the adapter's front door sets it: restored after
    host.main(["--agent-module", "host_plain_entrypoint", "--agent-kind", "art", "--port", "9125"])
    ((app, _address, port),) = served
    assert isinstance(app, RolloutApp)  # answers at once and writes the result object
    assert port == 9125


def test_the_image_environment_names_the_module_and_the_kind(
    agents: Path, served: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(AGENT_MODULE_ENV, "host_art_way")
    monkeypatch.setenv(AGENT_KIND_ENV, "art")
    host.main(["--host", "0.0.0.0", "--port", "8080"])
    assert served == [(sys.modules["host_art_way"].app, "0.0.0.0", 8080)]


def test_the_default_module_is_the_kinds_example(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded: list[tuple[str, str]] = []

    def fake_load(module: str, kind: str = "auto", *args: Any, **kwargs: Any) -> Any:
        loaded.append((module, kind))
        raise AgentModuleError("stop here")

    monkeypatch.setattr(host, "load", fake_load)
    monkeypatch.delenv(AGENT_MODULE_ENV, raising=False)
    monkeypatch.setenv(AGENT_KIND_ENV, "RFT")
    with pytest.raises(SystemExit):
        host.main(["--port", "9000"])
    assert loaded == [(DEFAULT_AGENT_MODULES["rft"], "rft")]


@pytest.mark.parametrize(
    ("module", "last_line"),
    [
        ("host_missing_module", "agent host: cannot serve host_missing_module: no module named 'host_missing_module'"),
        ("host_raises", "agent host: cannot serve host_raises: RuntimeError: MODEL_KEY is not set"),
        ("host_no_app", "agent host: cannot serve host_no_app: host_no_app defines no BedrockAgentCoreApp"),
    ],
)
def test_a_module_that_cannot_be_served_ends_the_process_with_one_last_line(
    agents: Path, served: list[Any], capsys: pytest.CaptureFixture[str], module: str, last_line: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        host.main(["--agent-module", module, "--port", "9126"])
    assert exit_info.value.code == host.EXIT_CANNOT_SERVE
    assert served == []
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines[-1].startswith(last_line), lines[-1]


def test_an_unknown_kind_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(AGENT_KIND_ENV, "sagemaker")
    with pytest.raises(SystemExit, match=AGENT_KIND_ENV):
        host.main([])
