"""`rollouts preflight`: each check against botocore's Stubber on the real service models (no network)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from rollout_pipeline import cli, preflight
from rollout_pipeline.preflight import BOOTSTRAP_VERSION_PARAMETER, Check

REGION = "us-west-2"
ACCOUNT = "123456789012"
REPO_ROOT = Path(__file__).resolve().parents[2]
PUBLIC = {"experiment": "exp", "model_base_url": "https://models.example.com/v1"}


class Clients:
    """Real boto3 clients (real service models) with a Stubber each; every expected call must happen."""

    def __init__(self) -> None:
        session = boto3.session.Session(
            aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret", region_name=REGION
        )
        self.clients: dict[str, Any] = {}
        self.stubs: dict[str, Stubber] = {}
        for service in ("sts", "bedrock-agentcore-control", "service-quotas", "ssm"):
            client = session.client(service)  # type: ignore[call-overload]
            self.clients[service] = client
            self.stubs[service] = Stubber(client)
            self.stubs[service].activate()

    def __call__(self, service: str) -> Any:
        return self.clients[service]

    def identity(self) -> None:
        self.stubs["sts"].add_response(
            "get_caller_identity", {"Account": ACCOUNT, "Arn": f"arn:aws:iam::{ACCOUNT}:user/u", "UserId": "AID"}
        )

    def agentcore(self) -> None:
        self.stubs["bedrock-agentcore-control"].add_response(
            "list_agent_runtimes", {"agentRuntimes": []}, {"maxResults": 1}
        )

    def quotas(self, *quotas: tuple[str, float, str]) -> None:
        self.stubs["service-quotas"].add_response(
            "list_service_quotas",
            {
                "Quotas": [
                    {
                        "ServiceCode": "bedrock-agentcore",
                        "QuotaName": name,
                        "QuotaCode": f"L-{i:08d}",
                        "Value": value,
                        "Unit": unit,
                    }
                    for i, (name, value, unit) in enumerate(quotas)
                ]
            },
            {"ServiceCode": "bedrock-agentcore"},
        )

    def bootstrap(self, version: str | None) -> None:
        if version is None:
            self.stubs["ssm"].add_client_error(
                "get_parameter", "ParameterNotFound", expected_params={"Name": BOOTSTRAP_VERSION_PARAMETER}
            )
        else:
            self.stubs["ssm"].add_response(
                "get_parameter",
                {"Parameter": {"Name": BOOTSTRAP_VERSION_PARAMETER, "Type": "String", "Value": version}},
                {"Name": BOOTSTRAP_VERSION_PARAMETER},
            )

    def verify(self) -> None:
        for stub in self.stubs.values():
            stub.assert_no_pending_responses()


GOOD_QUOTAS = (
    ("Active session workloads per account", 5000.0, "None"),
    ("New sessions rate per endpoint per minute", 400.0, "None"),
    ("InvokeAgentRuntime requests per second", 200.0, "None"),
)


@pytest.fixture
def clients() -> Iterator[Clients]:
    stubbed = Clients()
    yield stubbed
    stubbed.verify()


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {check.name: check for check in checks}


def test_all_ok(clients: Clients) -> None:
    clients.identity()
    clients.agentcore()
    clients.quotas(*GOOD_QUOTAS)
    clients.bootstrap("30")
    checks = preflight.run(preflight.load_context(REPO_ROOT, PUBLIC), client=clients, region=REGION)
    assert [c.name for c in checks] == [
        "settings",
        "model url",
        "credentials",
        "agentcore",
        "active sessions",
        "new sessions",
        "invoke rate",
        "cdk bootstrap",
    ]
    assert {c.level for c in checks} == {"ok"}, [c.line() for c in checks]
    assert preflight.worst(checks) == "ok"
    assert by_name(checks)["new sessions"].message == "session_rate_limit x endpoints=5 within the quota 6.667/s"


def test_quota_below_the_settings_is_an_error_with_what_to_do(clients: Clients) -> None:
    clients.identity()
    clients.agentcore()
    clients.quotas(
        ("Active session workloads per account", 50.0, "None"),
        ("New sessions rate per endpoint per minute", 100.0, "None"),
        ("InvokeAgentRuntime requests per second", 30.0, "None"),
    )
    clients.bootstrap(None)
    checks = by_name(preflight.run(preflight.load_context(REPO_ROOT, PUBLIC), client=clients, region=REGION))
    assert checks["active sessions"].level == "error"
    assert "request an increase" in checks["active sessions"].message
    assert checks["new sessions"].level == "error"  # 100/min = 1.67/s < 5/s
    assert checks["invoke rate"].level == "warning"  # 25 of 30/s: above 80%
    assert "more than 80%" in checks["invoke rate"].message
    assert checks["cdk bootstrap"].level == "error"
    assert f"npx cdk bootstrap aws://{ACCOUNT}/{REGION}" in checks["cdk bootstrap"].message


def test_loopback_model_url_is_an_error_unless_allowed() -> None:
    checks, _config = preflight.settings_checks(preflight.load_context(REPO_ROOT, {"experiment": "exp"}))
    assert by_name(checks)["model url"].level == "error"
    assert "allow_private_model_url=true" in by_name(checks)["model url"].message
    allowed, _ = preflight.settings_checks({"experiment": "exp", "allow_private_model_url": "true"})
    assert by_name(allowed)["model url"].level == "warning"


def test_bad_setting_is_one_error_line() -> None:
    checks, config = preflight.settings_checks({**PUBLIC, "tps_limit": "abc"})
    assert config is None
    assert [c.level for c in checks] == ["error"]
    assert "tps_limit" in checks[0].message


def test_a_quota_service_quotas_does_not_list_is_a_warning() -> None:
    assert preflight.compare("invoke rate", "tps_limit", 25, None, "/s").level == "warning"


def test_agentcore_not_offered(clients: Clients) -> None:
    clients.stubs["bedrock-agentcore-control"].add_client_error("list_agent_runtimes", "UnrecognizedClientException")
    check = preflight.service_check(clients("bedrock-agentcore-control"), REGION)
    assert check.level == "error"


def test_cli_prints_one_line_per_check_and_exits_1_on_error(monkeypatch: pytest.MonkeyPatch) -> None:
    stubbed = Clients()
    stubbed.identity()
    stubbed.agentcore()
    stubbed.quotas(*GOOD_QUOTAS)
    stubbed.bootstrap(None)
    monkeypatch.setattr(boto3.session.Session, "client", lambda _self, service, **_kw: stubbed(service))
    out = io.StringIO()
    code = cli.main(
        [
            "preflight",
            "-e",
            "exp",
            "--region",
            REGION,
            "--cdk-dir",
            str(REPO_ROOT),
            "-c",
            "model_base_url=https://m.example.com/v1",
        ],
        out=out,
    )
    lines = out.getvalue().splitlines()
    assert code == cli.EXIT_ERROR
    assert len(lines) == 8
    assert lines[-1].startswith("error   cdk bootstrap: not bootstrapped")
    stubbed.verify()
