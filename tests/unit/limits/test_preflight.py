"""`rollouts preflight`: each check against botocore's Stubber on the real service models (no network).

Quota listings use the codes and names Service Quotas lists (docs/deploy.md says where each was found); the
distractors (StopRuntimeSession, browser and code-interpreter session rates) carry placeholder codes `L-0000000N`:
only their names matter, which share words with the new-session rate."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from rollout_pipeline import cli
from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.ops import preflight
from rollout_pipeline.ops.preflight import BOOTSTRAP_VERSION_PARAMETER, Check

REGION = "us-west-2"
ACCOUNT = "123456789012"
REPO_ROOT = Path(__file__).resolve().parents[3]
PUBLIC = {"experiment": "exp", "model_base_url": "https://models.example.com/v1"}


class Clients:
    """Real boto3 clients (real service models) with a Stubber each; every expected call must happen."""

    def __init__(self) -> None:
        session = boto3.session.Session(
            aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret", region_name=REGION
        )
        self.clients: dict[str, Any] = {}
        self.stubs: dict[str, Stubber] = {}
        for service in ("sts", "bedrock-agentcore-control", "service-quotas", "ssm", "lambda", "dynamodb"):
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

    def listing(self, operation: str, service: str, quotas: list[dict[str, Any]]) -> None:
        self.stubs["service-quotas"].add_response(
            operation, {"Quotas": [{"ServiceCode": service, **q} for q in quotas]}, {"ServiceCode": service}
        )

    def quotas(self, applied: list[dict[str, Any]], defaults: list[dict[str, Any]] | None = None) -> None:
        """The AgentCore listings: applied values, then (when given) the defaults the preflight falls back to."""
        self.listing("list_service_quotas", AGENTCORE, applied)
        if defaults is not None:
            self.listing("list_aws_default_service_quotas", AGENTCORE, defaults)

    def codebuild(self, arm_small: float | None = 1.0) -> None:
        """No applied CodeBuild quota (the usual case), the ARM/Small build default."""
        self.listing("list_service_quotas", "codebuild", [])
        self.listing(
            "list_aws_default_service_quotas", "codebuild", [] if arm_small is None else [ARM_SMALL(arm_small)]
        )

    def lambda_settings(self, total: int = 1000, unreserved: int | None = None) -> None:
        self.stubs["lambda"].add_response(
            "get_account_settings",
            {
                "AccountLimit": {
                    "ConcurrentExecutions": total,
                    "UnreservedConcurrentExecutions": total if unreserved is None else unreserved,
                }
            },
            {},
        )

    def pool(self, exists: bool = True) -> None:
        """The account pool's table (`rollouts bootstrap`)."""
        if exists:
            self.stubs["dynamodb"].add_response(
                "describe_table", {"Table": {"TableName": "rollouts-pool"}}, {"TableName": "rollouts-pool"}
            )
        else:
            self.stubs["dynamodb"].add_client_error(
                "describe_table", "ResourceNotFoundException", expected_params={"TableName": "rollouts-pool"}
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


AGENTCORE = "bedrock-agentcore"
PER_SECOND = {"PeriodValue": 1, "PeriodUnit": "SECOND"}
PER_MINUTE = {"PeriodValue": 1, "PeriodUnit": "MINUTE"}


def quota(code: str, name: str, value: float, period: dict[str, Any] | None = None) -> dict[str, Any]:
    item: dict[str, Any] = {"QuotaCode": code, "QuotaName": name, "Value": value, "Unit": "None", "Adjustable": True}
    if period is not None:
        item["Period"] = period
    return item


def ACTIVE(value: float = 5000) -> dict[str, Any]:
    return quota("L-3E5722B2", "Active Session Workloads per Account", value)


def NEW_SESSIONS(value: float = 25) -> dict[str, Any]:
    return quota("L-8EE2AEA2", "Rate of new Runtime session creation", value, PER_SECOND)


def DATA_PLANE(value: float = 1000) -> dict[str, Any]:
    return quota("L-46ED137C", "Rate of Runtime data plane APIs", value, PER_SECOND)


def ENDPOINTS(value: float = 10) -> dict[str, Any]:
    return quota("L-9B442722", "Endpoints per Agent", value)


def ARM_SMALL(value: float = 1) -> dict[str, Any]:
    return quota("L-5ED1D25B", "Concurrently running builds for ARM/Small environment", value)


#: Quotas whose names share words with the new-session rate ("session", "rate") and come first in a listing.
DISTRACTORS = [
    quota("L-00000001", "Rate of StopRuntimeSession requests", 1, PER_SECOND),
    quota("L-00000002", "Rate of StartBrowserSession requests", 2, PER_SECOND),
    quota("L-00000003", "Rate of StartCodeInterpreterSession requests", 2, PER_SECOND),
    quota("L-00000004", "Active browser sessions per account", 3),
]
DEFAULTS = [*DISTRACTORS, ACTIVE(), NEW_SESSIONS(), DATA_PLANE(), ENDPOINTS()]


@pytest.fixture
def clients() -> Iterator[Clients]:
    stubbed = Clients()
    yield stubbed
    stubbed.verify()


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {check.name: check for check in checks}


def stub_all_ok(clients: Clients, *, bootstrap: str | None = "30") -> None:
    clients.identity()
    clients.agentcore()
    clients.quotas(DISTRACTORS, DEFAULTS)  # only distractors have applied values: the rest are defaults
    clients.pool()
    clients.codebuild()
    clients.lambda_settings()
    clients.bootstrap(bootstrap)


def test_all_ok(clients: Clients) -> None:
    stub_all_ok(clients)
    checks = preflight.run(preflight.load_context(REPO_ROOT, PUBLIC), client=clients, region=REGION)
    assert [c.name for c in checks] == [
        "settings",
        "model url",
        "credentials",
        "agentcore",
        "quotas",
        "new sessions",
        "data-plane calls",
        "active sessions",
        "endpoints",
        "account pool",
        "image build",
        "lambda concurrency",
        "cdk bootstrap",
    ]
    assert {c.level for c in checks} == {"ok"}, [c.line() for c in checks]
    assert preflight.worst(checks) == "ok"
    assert by_name(checks)["new sessions"].message == (
        "session_rate_limit not set: the experiment's share of 25/s per account (less the reserve)"
    )
    assert by_name(checks)["active sessions"].message == "max_sessions=100 within the quota 5000"


def test_quotas_are_matched_by_code_not_by_words(clients: Clients) -> None:
    """The StopRuntimeSession rate (1/s) and browser session rates come first and share the words; matching by
    words took the first as the new-session quota and called a valid config an error."""
    clients.quotas([*DISTRACTORS, NEW_SESSIONS(), ACTIVE(), DATA_PLANE(), ENDPOINTS()], DISTRACTORS)
    checks = by_name(preflight.quota_checks(ExperimentConfig(name="exp"), clients("service-quotas")))
    assert checks["new sessions"].level == "ok", checks["new sessions"].line()
    assert checks["active sessions"].message == "max_sessions=100 within the quota 5000"


def test_the_strictest_new_session_rate_binds_and_a_cap_above_it_is_an_error(clients: Clients) -> None:
    """An account that still lists the per-endpoint container rate (400/min = 6.67/s) is held to it as the account's
    (the safe reading: docs/aws-facts.md); a `session_rate_limit` above it is an error naming the key, one above
    what the pool grants (the quota less the reserve) a warning."""
    per_endpoint_container = quota("L-0B3AF7ED", "", 400, PER_MINUTE)
    clients.quotas([per_endpoint_container, *DISTRACTORS], DEFAULTS)

    def reader() -> Any:
        stubbed = Clients()
        stubbed.quotas([per_endpoint_container, *DISTRACTORS], DEFAULTS)
        return stubbed("service-quotas")

    first = preflight.quota_checks(ExperimentConfig(name="exp", session_rate_limit=10), clients("service-quotas"))
    check = by_name(first)
    assert check["new sessions"].level == "error", check["new sessions"].line()
    assert "session_rate_limit=10 is above the account's quota 6.667/s per account" in check["new sessions"].message
    grantable = by_name(preflight.quota_checks(ExperimentConfig(name="exp", session_rate_limit=6.5), reader()))
    assert grantable["new sessions"].level == "warning"
    assert "above what the account pool grants" in grantable["new sessions"].message
    unset = by_name(preflight.quota_checks(ExperimentConfig(name="exp"), reader()))["new sessions"]
    assert unset.level == "ok"
    assert "6.667/s" in unset.message


def test_a_container_rate_only_in_the_defaults_catalogue_is_not_the_accounts(clients: Clients) -> None:
    """The per-endpoint container rate (400/min) listed only by ListAWSDefaultServiceQuotas is not applied to the
    account: it must not make the whole account 6.67 new sessions/s. The check says which code set each figure."""
    per_endpoint_container = quota("L-0B3AF7ED", "", 400, PER_MINUTE)
    clients.quotas(DISTRACTORS, [per_endpoint_container, *DEFAULTS])
    checks = by_name(
        preflight.quota_checks(ExperimentConfig(name="exp", session_rate_limit=10), clients("service-quotas"))
    )
    assert checks["new sessions"].level == "ok", checks["new sessions"].line()
    assert "L-8EE2AEA2 (default)" in checks["quotas"].message
    assert "L-0B3AF7ED" not in checks["quotas"].message


def _reader_of(quotas: list[dict[str, Any]]) -> Any:
    """A Service Quotas client whose applied listing is empty and whose defaults are `quotas`."""
    stubbed = Clients()
    stubbed.quotas([], quotas)
    return stubbed("service-quotas")


def test_defaults_fill_in_quotas_without_an_applied_value(clients: Clients) -> None:
    clients.quotas([], DEFAULTS)
    checks = preflight.quota_checks(ExperimentConfig(name="exp"), clients("service-quotas"))
    assert {c.level for c in checks} == {"ok"}, [c.line() for c in checks]


def test_an_exact_name_matches_when_the_code_is_not_listed() -> None:
    renamed = {**NEW_SESSIONS(), "QuotaCode": "L-FFFFFFFF"}
    assert preflight.match([renamed], preflight.NEW_SESSION_RATE) == renamed
    assert (
        preflight.match(
            [{**renamed, "QuotaName": "Rate of new Runtime session creation per agent"}], preflight.NEW_SESSION_RATE
        )
        is None
    )  # the whole name, not words


def test_quota_below_the_settings_is_an_error_with_what_to_do(clients: Clients) -> None:
    clients.identity()
    clients.agentcore()
    clients.quotas([ACTIVE(50), NEW_SESSIONS(2), DATA_PLANE(30), ENDPOINTS(10)], [])
    clients.pool(exists=False)
    clients.codebuild(arm_small=0)
    clients.lambda_settings(total=10)
    clients.bootstrap(None)
    settings = {**PUBLIC, "endpoints": "12", "session_rate_limit": "5", "tps_limit": "25"}
    checks = by_name(preflight.run(preflight.load_context(REPO_ROOT, settings), client=clients, region=REGION))
    assert checks["active sessions"].level == "error"
    assert "request an increase in Service Quotas (bedrock-agentcore L-3E5722B2)" in checks["active sessions"].message
    assert checks["new sessions"].level == "error"  # 5/s > the account's 2/s
    assert "session_rate_limit=5" in checks["new sessions"].message
    assert "L-8EE2AEA2" in checks["new sessions"].message
    assert checks["data-plane calls"].level == "warning"  # 25 of 30/s: above 80%
    assert "more than 80%" in checks["data-plane calls"].message
    assert checks["account pool"].level == "error"
    assert "rollouts bootstrap" in checks["account pool"].message
    assert checks["endpoints"].level == "error"
    assert "L-9B442722" in checks["endpoints"].message
    assert checks["image build"].level == "error"
    assert "request an increase in Service Quotas (codebuild L-5ED1D25B)" in checks["image build"].message
    assert "-c image_uri=" in checks["image build"].message
    assert checks["lambda concurrency"].level == "error"
    assert "lambda L-B99A9384" in checks["lambda concurrency"].message
    assert checks["cdk bootstrap"].level == "error"
    assert f"npx cdk bootstrap aws://{ACCOUNT}/{REGION}" in checks["cdk bootstrap"].message


def test_arm_codebuild_is_not_offered_everywhere() -> None:
    (check,) = preflight.codebuild_checks("eu-west-2", preflight.QuotaReader(object()))
    assert check.level == "error"
    assert "-c image_build=local" in check.message
    assert "-c image_uri=" in check.message


def test_no_codebuild_check_when_the_image_is_not_built_there(clients: Clients) -> None:
    clients.identity()
    clients.agentcore()
    clients.quotas([], DEFAULTS)
    clients.pool()
    clients.lambda_settings()
    clients.bootstrap("30")
    context = preflight.load_context(REPO_ROOT, {**PUBLIC, "image_build": "local"})
    checks = preflight.run(context, client=clients, region="eu-west-2")
    assert "image build" not in by_name(checks)


def test_lambda_concurrency_the_stack_asks() -> None:
    config = ExperimentConfig(name="exp", dispatch_concurrency=5)
    # ingest 5 + dispatch 5 + completion 10 (event-source MaximumConcurrency), the sweeper, a custom resource
    assert preflight.lambda_asks(config) == 22
    stubbed = Clients()
    stubbed.lambda_settings(total=1000, unreserved=25)
    check = preflight.lambda_check(config, stubbed("lambda"))
    assert check.level == "warning"  # 22 of 25 unreserved


def test_unreadable_quotas_are_one_warning(clients: Clients) -> None:
    clients.stubs["service-quotas"].add_client_error("list_service_quotas", "AccessDeniedException")
    checks = preflight.quota_checks(ExperimentConfig(name="exp"), clients("service-quotas"))
    assert [(c.name, c.level) for c in checks] == [("quotas", "warning")]


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
    assert preflight.compare("data-plane calls", "tps_limit", 25, None, "/s").level == "warning"


def test_agentcore_not_offered(clients: Clients) -> None:
    clients.stubs["bedrock-agentcore-control"].add_client_error("list_agent_runtimes", "UnrecognizedClientException")
    check = preflight.service_check(clients("bedrock-agentcore-control"), REGION)
    assert check.level == "error"


def test_cli_prints_one_line_per_check_and_exits_1_on_error(monkeypatch: pytest.MonkeyPatch) -> None:
    stubbed = Clients()
    stub_all_ok(stubbed, bootstrap=None)
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
    assert len(lines) == 13
    assert lines[-1].startswith("error   cdk bootstrap: not bootstrapped")
    stubbed.verify()
