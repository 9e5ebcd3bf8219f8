"""Shared fixtures: an in-process moto account with one experiment's resources, and queue helpers.

Nothing here reaches AWS: fake credentials, moto's `mock_aws`, and the boto3 client cache reset around each test.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings

from rollout_pipeline.adapters import clients
from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.fakes import faithful
from rollout_pipeline.local.moto_server import patch_moto
from rollout_pipeline.local.resources import ExperimentResources, create_resources

REGION = "us-east-1"

#: Hypothesis runs the same examples on every machine and every run (a failure in CI fails again locally, and
#: prints the blob that replays it); `HYPOTHESIS_PROFILE=explore` searches at random, saving failures in
#: .hypothesis/ to replay them first.
hypothesis_settings.register_profile("deterministic", derandomize=True, database=None, print_blob=True)
hypothesis_settings.register_profile("explore", derandomize=False, print_blob=True)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "deterministic")


def wait_for(condition: Callable[[], object], timeout_s: float = 30.0, what: str = "the condition") -> None:
    """Wait until `condition()` is truthy, checking every 10 ms; fail the test after `timeout_s` (a bound, not a
    timing: on a fast machine it returns at once)."""
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.01)


def proc_stat(pid: int) -> list[str]:
    """The fields of `/proc/PID/stat` after the command's name (proc(5): state, ppid, ...; utime and stime at 11 and
    12, in clock ticks). OSError when the process is gone."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie waiting for its new parent to reap it does not)."""
    try:
        state = proc_stat(pid)[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile` (`make test`): longest suites first, tests/infra on one worker (tests/schedule.py)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from tests.schedule import SuiteOrderScheduling

    return SuiteOrderScheduling(config, log)


@pytest.fixture(autouse=True, scope="session")
def temporary_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The suite's temporary files (`tempfile`'s, this process's and its children's: `TMPDIR`) in pytest's own
    temporary directory, which pytest prunes: what a test leaves (a stopped local pipeline's work directory, kept
    for its logs) does not pile up in the machine's."""
    import tempfile

    folder = tmp_path_factory.mktemp("tmp", numbered=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tempfile, "tempdir", str(folder))
        patch.setenv("TMPDIR", str(folder))
        yield folder


TESTS = Path(__file__).resolve().parent
#: Suites that run under the faithful AWS profile by default (ROLLOUTS_AWS_PROFILE=moto switches it off).
FAITHFUL_SUITES = ("integration", "e2e")


@pytest.fixture(autouse=True)
def aws_profile(request: pytest.FixtureRequest) -> Iterator[faithful.FaithfulProfile | None]:
    """The faithful AWS profile (`fakes.faithful`) for every integration and e2e test (the folder under tests/,
    whatever the room below it), unless the test is marked `plain_moto` or `ROLLOUTS_AWS_PROFILE=moto`. Yields the
    active profile (None: plain moto)."""
    suite = request.node.path.resolve().relative_to(TESTS).parts[0]
    wanted = faithful.profile_from_env(faithful.FAITHFUL) == faithful.FAITHFUL
    if suite not in FAITHFUL_SUITES or not wanted or request.node.get_closest_marker("plain_moto"):
        yield None
        return
    seed = int(os.environ.get("ROLLOUTS_AWS_SEED", "0"))
    with faithful.activate(faithful.FaithfulProfile(seed=seed)) as profile:
        yield profile


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake credentials and region; no endpoint override (in-process moto intercepts botocore)."""
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture
def no_aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Remove every AWS credential source: environment keys, profile, container and web-identity credentials,
    config and credentials files (pointed at a missing file), and the EC2 instance metadata service."""
    for key in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
    ):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def serialise_dynamodb(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run in-process moto's DynamoDB requests one at a time, answers included, as local mode's server does
    (`local.moto_server.serialised_dynamodb_requests`): moto's backend is not thread-safe and builds an
    `UpdateItem`'s returned item outside its call, and the lifecycle runs its work in threads. The faithful profile
    still sees calls overlap: it holds a transaction's items for `hold_ms` of wall time, before the request."""
    from moto.core.botocore_stubber import BotocoreStubber

    from rollout_pipeline.local.moto_server import serialised_dynamodb_requests

    original = BotocoreStubber.process_request
    monkeypatch.setattr(BotocoreStubber, "process_request", serialised_dynamodb_requests(original))


@pytest.fixture
def moto_aws(aws_env: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from moto import mock_aws

    patch_moto()
    serialise_dynamodb(monkeypatch)
    clients.reset()
    with mock_aws():
        yield
    clients.reset()


@pytest.fixture
def experiment_config() -> ExperimentConfig:
    return ExperimentConfig(name="test-exp", group_size=2, max_attempts=2, tps_limit=50, max_sessions=20)


@pytest.fixture
def resources(moto_aws: None, experiment_config: ExperimentConfig) -> ExperimentResources:
    return create_resources(experiment_config, region=REGION, client=clients.client)


def receive_all(queue_url: str, *, delete: bool = True, max_rounds: int = 50) -> list[dict[str, Any]]:
    """Receive every visible message of a (shallow) queue; return the parsed bodies."""
    sqs = clients.client("sqs")
    bodies: list[dict[str, Any]] = []
    for _ in range(max_rounds):
        resp = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
        messages = resp.get("Messages") or []
        if not messages:
            break
        for message in messages:
            bodies.append(json.loads(message["Body"]))
            if delete:
                sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
    return bodies
