"""One route from a second process to a running local pipeline: the experiment registered at the local endpoint
(attach by name, as to a deployed stack), the outputs in every form a user holds them (the dict, flat or wrapped as
`cdk deploy --outputs-file` writes it, the file's path, its JSON text), the environment `rollouts local up` prints,
hints that carry the options given, and one-line errors for a wrong endpoint or name. Over a loopback moto server,
through real HTTP, as another process would."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout_pipeline import topology
from rollout_pipeline.cli import EXIT_ERROR, EXIT_OK, build_parser, main
from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.local.moto_server import moto_server
from rollout_pipeline.local.resources import ExperimentResources, create_resources, register_stack
from rollout_pipeline.sdk import Experiment, ExperimentNotDeployed, SdkError
from rollout_pipeline.sdk.route import local_up_block, stack_outputs

REGION = "us-east-1"
NAME = "route-exp"


@pytest.fixture
def local(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, ExperimentResources]]:
    """A local endpoint holding experiment NAME, registered as `rollouts local up` registers it."""
    import boto3

    for key in ("AWS_ENDPOINT_URL", "AWS_PROFILE", "ROLLOUTS_ENDPOINT_URL", "ROLLOUTS_EXPERIMENT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "local")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "local")
    with moto_server() as endpoint:

        def client(service: str) -> Any:
            return boto3.client(service, endpoint_url=endpoint, region_name=REGION)

        resources = create_resources(ExperimentConfig(name=NAME, group_size=2), region=REGION, client=client)
        register_stack(resources, client=client)
        yield endpoint, resources


def test_a_second_process_attaches_to_the_local_experiment_by_name(local: tuple[str, ExperimentResources]) -> None:
    endpoint, resources = local
    experiment = Experiment.local(endpoint, name=NAME)
    assert experiment.outputs == resources.stack_outputs()
    assert Experiment.attach(NAME, endpoint_url=endpoint).trainer_queue_url == resources.trainer_queue_url
    batch = experiment.submit([{"id": "q1", "prompt": "hi"}])
    assert experiment.status(batch).rollouts_total == 2


def test_the_printed_environment_is_all_it_takes(
    local: tuple[str, ExperimentResources], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    endpoint, resources = local
    block = local_up_block(endpoint, NAME)
    assert f"export ROLLOUTS_ENDPOINT_URL={endpoint} ROLLOUTS_EXPERIMENT={NAME}" in block
    assert f'exp = Experiment.local("{endpoint}", name="{NAME}")' in block
    monkeypatch.setenv("ROLLOUTS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("ROLLOUTS_EXPERIMENT", NAME)
    assert Experiment.local().name == NAME
    assert Experiment.attach(NAME).rollout_queue_url == resources.rollout_queue_url  # code written for a deploy
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"id": "a", "prompt": "x"}\n')
    assert main(["submit", str(rows)]) == EXIT_OK


@pytest.mark.parametrize("form", ["wrapped dict", "flat dict", "path", "path text", "JSON text"])
def test_the_outputs_in_every_form_a_user_holds_them(
    local: tuple[str, ExperimentResources], tmp_path: Path, form: str
) -> None:
    endpoint, resources = local
    flat = resources.stack_outputs()
    wrapped = {topology.stack_name(NAME): flat}  # `cdk deploy --outputs-file`, `rollouts local up --write-outputs`
    path = tmp_path / "outputs.json"
    path.write_text(json.dumps(wrapped, indent=2))
    given: Any = {
        "wrapped dict": wrapped,
        "flat dict": flat,
        "path": path,
        "path text": str(path),
        "JSON text": path.read_text(),
    }[form]
    assert Experiment.local(endpoint, outputs=given).outputs == flat
    assert Experiment.from_outputs(given, endpoint_url=endpoint).outputs == flat


def test_outputs_of_several_stacks_name_the_one_wanted(local: tuple[str, ExperimentResources]) -> None:
    _endpoint, resources = local
    flat = resources.stack_outputs()
    both = {topology.stack_name(NAME): flat, topology.stack_name("other"): {**flat, "ExperimentName": "other"}}
    assert stack_outputs(both, NAME) == flat
    with pytest.raises(SdkError, match="several stacks"):
        stack_outputs(both)
    with pytest.raises(SdkError, match="holds no stack Rollouts-third"):
        stack_outputs(both, "third")


def test_wrong_endpoint_or_name_is_one_line_saying_what_to_do(local: tuple[str, ExperimentResources]) -> None:
    endpoint, _resources = local
    with pytest.raises(ExperimentNotDeployed, match=r"no experiment 'nope' at http://127\.0\.0\.1:\d+ \(start it"):
        Experiment.local(endpoint, name="nope")
    with pytest.raises(SdkError, match=r"must start with http:// or https://.*did you mean http://127\.0\.0\.1:4580"):
        Experiment.local("127.0.0.1:4580", name=NAME)
    with pytest.raises(SdkError, match="needs the endpoint URL"):
        Experiment.local(name=NAME)


def test_hints_carry_the_options_the_command_was_given(
    local: tuple[str, ExperimentResources], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    endpoint, resources = local
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"id": "a", "prompt": "x"}\n')
    assert main(["submit", str(rows), "-e", NAME, "--endpoint-url", endpoint]) == EXIT_OK
    captured = capsys.readouterr()
    batch = captured.out.strip()
    hint = f"follow it with: rollouts watch -e {NAME} --endpoint-url {endpoint} --batch {batch}"
    assert hint in captured.err
    # What the hint says works as it is.
    argv = [*hint.removeprefix("follow it with: rollouts ").split(), "--timeout", "0.5"]
    assert main(argv) in (EXIT_OK, EXIT_ERROR)  # nothing runs the batch here: its watch times out (exit 1)
    assert "no AWS region configured" not in capsys.readouterr().err

    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({topology.stack_name(NAME): resources.stack_outputs()}))
    assert main(["submit", str(rows), "--outputs-file", str(outputs), "--endpoint-url", endpoint]) == EXIT_OK
    err = capsys.readouterr().err
    assert f"rollouts watch --outputs-file {outputs} --endpoint-url {endpoint} --batch" in err


def test_endpoint_without_a_scheme_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "-e", NAME, "--endpoint-url", "127.0.0.1:4580", "--batch", "b"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("rollouts: error: endpoint URL '127.0.0.1:4580' must start with http:// or https://")


def test_old_option_spellings_still_work_as_hidden_aliases(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    up = parser.parse_args(["local", "up", "-e", "x", "--outputs-file", "o.json", "--timeout-s", "30"])
    assert (up.experiment, up.write_outputs, up.rollout_timeout) == (["x"], Path("o.json"), 30)
    new = parser.parse_args(["local", "up", "--write-outputs", "o.json", "--rollout-timeout", "30", "--port", "0"])
    assert (new.write_outputs, new.rollout_timeout, new.port) == (Path("o.json"), 30, 0)
    demo = parser.parse_args(["local", "demo", "--wait-s", "12"])
    assert demo.timeout == 12
    assert parser.parse_args(["local", "demo", "--timeout", "12"]).timeout == 12
    submit = parser.parse_args(["submit", "f.jsonl", "--timeout", "60"])
    assert submit.rollout_timeout == 60
    assert parser.parse_args(["submit", "f.jsonl", "--rollout-timeout", "60"]).rollout_timeout == 60
    assert main(["local", "up", "--help"]) == EXIT_OK
    shown = capsys.readouterr().out
    assert "--write-outputs FILE" in shown
    assert not re.search(r"^\s+--outputs-file", shown, re.MULTILINE)
    assert "--timeout-s" not in shown


def test_export_into_a_pipe_closed_early_ends_quietly(local: tuple[str, ExperimentResources]) -> None:
    endpoint, _resources = local
    experiment = Experiment.local(endpoint, name=NAME)
    batch = experiment.submit([{"id": f"q{i}", "prompt": "x" * 100} for i in range(300)], group_size=2)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "ROLLOUTS_ENDPOINT_URL": endpoint,
        "ROLLOUTS_EXPERIMENT": NAME,
    }
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", f"rollouts export --batch {batch} --no-results | head -1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert json.loads(done.stdout)["batch_id"] == batch  # the one line head wanted
    assert done.stderr == "", "no traceback, no 'Exception ignored' at exit"
    assert done.returncode == 141, "the reader went away: 128 + SIGPIPE, as `cat` reports it"
