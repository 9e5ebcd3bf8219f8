"""`rollouts preflight`: check, with read calls only, that an experiment can be deployed and will hold its limits.

Each check prints one line, `ok`, `warning` or `error`, with what to do. The checks read: the settings (`cdk.json`
context plus `-c key=value` overrides, validated by the same code as `cdk synth`), the caller's account (STS), the
AgentCore control plane of the region (is the service offered there), the account's quotas (Service Quotas, matched
by quota code; ListServiceQuotas lists only quotas with an applied value, so the defaults of
ListAWSDefaultServiceQuotas fill in the rest) against `max_sessions`, `session_rate_limit`, `tps_limit` and
`endpoints` (an error for a setting above the account's quota), the account pool (`rollouts bootstrap`), where the
agent image is built (CodeBuild ARM: offered in the region, concurrent builds allowed), Lambda concurrency
(GetAccountSettings) against what the event sources ask, and the CDK bootstrap version (SSM).

Quota codes are not in AWS's documentation; `QUOTAS` names each with the exact name it is listed under (a code that
is not found falls back to that name, the full string) and docs/deploy.md says where each was found.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from rollout_pipeline import quotas
from rollout_pipeline.config import ConfigError, ExperimentConfig
from rollout_pipeline.ops.deploy_settings import DeploySettings, private_model_url_problem
from rollout_pipeline.quotas import AccountQuotas, QuotaRef

Level = Literal["ok", "warning", "error"]
AGENTCORE_QUOTAS_SERVICE: Final = quotas.AGENTCORE_SERVICE
BOOTSTRAP_VERSION_PARAMETER: Final = "/cdk-bootstrap/hnb659fds/version"
#: The oldest bootstrap stack version that holds what `cdk deploy` of this stack needs (file assets, roles).
MIN_BOOTSTRAP_VERSION: Final = 6
#: A setting above this share of its quota leaves no headroom for retries and other users of the account.
QUOTA_HEADROOM: Final = 0.8


def check_line(outcome: str, name: str, message: str) -> str:
    """One line of a check report (`rollouts preflight`, `rollouts smoke`): outcome, check, what to do."""
    return f"{outcome:<7} {name}: {message}"


@dataclass(frozen=True)
class Check:
    """One line of the preflight: what was checked, how it went, and what to do about it."""

    name: str
    level: Level
    message: str

    def line(self) -> str:
        return check_line(self.level, self.name, self.message)


def load_context(repo_root: Path, overrides: Mapping[str, str]) -> dict[str, Any]:
    """cdk.json's context with `-c key=value` overrides, as `cdk synth` would see it."""
    cdk_json = repo_root / "cdk.json"
    context: dict[str, Any] = json.loads(cdk_json.read_text())["context"] if cdk_json.is_file() else {}
    return {**context, **overrides}


def settings_checks(context: Mapping[str, Any]) -> tuple[list[Check], ExperimentConfig | None]:
    """Every setting valid (as synth validates them), and a model URL a deployed agent can reach."""
    try:
        config = ExperimentConfig.from_context(context)
        settings = DeploySettings.from_context(context)
    except ConfigError as exc:
        return [Check("settings", "error", f"{exc}: fix it in cdk.json or with -c key=value")], None
    checks = [Check("settings", "ok", f"experiment {config.name}, image {settings.image_mode}")]
    problem = private_model_url_problem(config.model_base_url)
    if problem is None:
        checks.append(Check("model url", "ok", config.model_base_url))
    elif settings.allow_private_model_url:
        checks.append(Check("model url", "warning", f"{problem} (allowed by allow_private_model_url)"))
    else:
        checks.append(
            Check(
                "model url",
                "error",
                f"{problem}: set -c model_base_url=https://... or -c allow_private_model_url=true",
            )
        )
    return checks, config


#: AgentCore Runtime quotas: codes, names and documented defaults live in `quotas` (one home); docs/deploy.md and
#: docs/aws-facts.md say where each was found.
ACTIVE_SESSIONS: Final = quotas.ACTIVE_SESSIONS
NEW_SESSION_RATE: Final = quotas.NEW_SESSION_RATE
CONTAINER_SESSION_RATE: Final = quotas.CONTAINER_SESSION_RATE
DATA_PLANE_RATE: Final = quotas.DATA_PLANE_RATE
ENDPOINTS_PER_AGENT: Final = quotas.ENDPOINTS_PER_AGENT
#: `cdklabs-deploy-time-build` builds the agent image on ARM_CONTAINER with compute type SMALL.
CODEBUILD_ARM_SMALL: Final = QuotaRef(
    "codebuild", "L-5ED1D25B", "Concurrently running builds for ARM/Small environment"
)
LAMBDA_CONCURRENCY: Final = QuotaRef("lambda", "L-B99A9384", "Concurrent executions")
#: The AgentCore Runtime quotas the preflight compares (`rollouts smoke` prints which of them an account lists).
AGENTCORE_QUOTAS: Final = (
    ACTIVE_SESSIONS,
    NEW_SESSION_RATE,
    CONTAINER_SESSION_RATE,
    DATA_PLANE_RATE,
    ENDPOINTS_PER_AGENT,
)
QUOTAS: Final = (
    ACTIVE_SESSIONS,
    NEW_SESSION_RATE,
    CONTAINER_SESSION_RATE,
    DATA_PLANE_RATE,
    ENDPOINTS_PER_AGENT,
    CODEBUILD_ARM_SMALL,
    LAMBDA_CONCURRENCY,
)
#: Regions where CodeBuild offers ARM_CONTAINER (CodeBuild user guide, "Build environment compute types").
ARM_CODEBUILD_REGIONS: Final = frozenset(
    {
        "us-east-1",
        "us-east-2",
        "us-west-2",
        "eu-west-1",
        "eu-central-1",
        "ap-south-1",
        "ap-northeast-1",
        "ap-southeast-1",
        "ap-southeast-2",
        "sa-east-1",
    }
)
#: Concurrent executions of Lambdas the stack adds besides the pipeline's (custom-resource handlers, at deploy).
HELPER_LAMBDA_CONCURRENCY: Final = 1
_PERIOD_SECONDS: Final = {"SECOND": 1.0, "MINUTE": 60.0, "HOUR": 3600.0, "DAY": 86_400.0, "WEEK": 604_800.0}


class QuotaReader:
    """A service's quotas as the account sees them: applied values (ListServiceQuotas) first, then the defaults
    (ListAWSDefaultServiceQuotas) for every quota without an applied value. Read once per service, on first use."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._applied: dict[str, list[dict[str, Any]]] = {}
        self._defaults: dict[str, list[dict[str, Any]]] = {}

    def _list(self, operation: str, service: str) -> list[dict[str, Any]]:
        from botocore.exceptions import ClientError

        quotas: list[dict[str, Any]] = []
        try:
            for page in self._client.get_paginator(operation).paginate(ServiceCode=service):
                quotas.extend(page.get("Quotas", []))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "NoSuchResourceException":
                raise
        return quotas

    def find(self, ref: QuotaRef) -> dict[str, Any] | None:
        """The quota `ref` (applied value, else the default), or None when neither list holds it.

        Raises botocore's ClientError when Service Quotas cannot be read (e.g. AccessDeniedException)."""
        return self.find_with_source(ref)[0]

    def find_with_source(self, ref: QuotaRef) -> tuple[dict[str, Any] | None, Literal["applied", "default", ""]]:
        """`find`, and which list held the quota: "applied", "default" or "" (neither)."""
        if ref.service not in self._applied:
            self._applied[ref.service] = self._list("list_service_quotas", ref.service)
        found = match(self._applied[ref.service], ref)
        if found is not None:
            return found, "applied"
        if ref.service not in self._defaults:
            self._defaults[ref.service] = self._list("list_aws_default_service_quotas", ref.service)
        found = match(self._defaults[ref.service], ref)
        return found, "default" if found is not None else ""


def match(quotas: Iterable[Mapping[str, Any]], ref: QuotaRef) -> dict[str, Any] | None:
    """The quota with `ref`'s code, else the one listed under exactly `ref`'s name (the whole name, any case)."""
    listed = list(quotas)
    for quota in listed:
        if quota.get("QuotaCode") == ref.code:
            return dict(quota)
    if ref.name:
        wanted = ref.name.strip().casefold()
        for quota in listed:
            if str(quota.get("QuotaName", "")).strip().casefold() == wanted:
                return dict(quota)
    return None


def per_second(quota: Mapping[str, Any]) -> float:
    """A rate quota in per-second units, from its `Period` (Service Quotas states some per minute)."""
    value = float(quota["Value"])
    period = quota.get("Period") or {}
    unit = str(period.get("PeriodUnit", "")).upper()
    if unit in _PERIOD_SECONDS:
        return value / (_PERIOD_SECONDS[unit] * float(period.get("PeriodValue") or 1))
    name = str(quota.get("QuotaName", "")).lower()
    return value / 60.0 if "per minute" in name else value


def _label(quota: Mapping[str, Any]) -> str:
    return f"{quota.get('QuotaCode', '?')} {quota.get('QuotaName', '')}".strip()


def compare(name: str, setting: str, wanted: float, limit: float | None, unit: str, *, fix: str = "") -> Check:
    """A setting against its quota: error above it, warning above QUOTA_HEADROOM of it."""
    if limit is None:
        return Check(name, "warning", f"quota not found in Service Quotas; check {setting}={wanted:g} by hand")
    if wanted > limit:
        return Check(
            name,
            "error",
            f"{setting}={wanted:g} is above the account's quota {limit:.4g}{unit}: lower it or request an increase "
            f"in Service Quotas ({fix or AGENTCORE_QUOTAS_SERVICE})",
        )
    if wanted > limit * QUOTA_HEADROOM:
        return Check(
            name, "warning", f"{setting}={wanted:g} uses more than {QUOTA_HEADROOM:.0%} of the quota {limit:.4g}{unit}"
        )
    return Check(name, "ok", f"{setting}={wanted:g} within the quota {limit:.4g}{unit}")


def _request(ref: QuotaRef) -> str:
    return f"{ref.service} {ref.code}"


def read_account_quotas(reader: QuotaReader, region: str) -> AccountQuotas:
    """The account's AgentCore quotas in `region` by code: the value applied to the account, else the default
    Service Quotas lists, else the documented default. The per-endpoint container session rate counts only when it
    is APPLIED to the account (an account that still has it): found only in the defaults catalogue, it is not the
    account's (taken, its 400/min made the whole account 6.67 new sessions/s). `source` says which code set each
    figure and how. Raises botocore's ClientError when Service Quotas cannot be read."""
    documented = AccountQuotas.defaults(region)
    sources: list[str] = []

    def value(figure: str, ref: QuotaRef, rate: bool, *, applied_only: bool = False) -> float | None:
        quota, where = reader.find_with_source(ref)
        if quota is None or (applied_only and where != "applied"):
            return None
        sources.append(f"{figure} {ref.code} ({where})")
        return per_second(quota) if rate else float(quota["Value"])

    account_rate = value("new sessions", NEW_SESSION_RATE, True)
    container_rate = value("new sessions per endpoint", CONTAINER_SESSION_RATE, True, applied_only=True)
    rates = [v for v in (account_rate, container_rate) if v is not None]
    data_plane = value("data plane", DATA_PLANE_RATE, True)
    active = value("active sessions", ACTIVE_SESSIONS, False)
    missing = [
        figure
        for figure, found in (("new sessions", rates), ("data plane", data_plane), ("active sessions", active))
        if found is None or found == []
    ]
    if missing:
        sources.append(f"{', '.join(missing)}: documented default")
    return AccountQuotas(
        new_sessions_per_s=min(rates) if rates else documented.new_sessions_per_s,
        data_plane_per_s=data_plane if data_plane is not None else documented.data_plane_per_s,
        active_sessions=int(active) if active is not None else documented.active_sessions,
        source="; ".join(sources),
    )


def capacity_checks(
    config: ExperimentConfig, account: AccountQuotas, reserve: float = quotas.DEFAULT_RESERVE
) -> list[Check]:
    """The experiment's caps against the account's quotas: an error (naming the key) for a cap above the quota,
    a warning above what the account pool can grant (the quota less its reserve)."""
    scope = "per account"
    asked: list[tuple[str, str, float | None, float, str, QuotaRef]] = [
        (
            "new sessions",
            "session_rate_limit",
            config.session_rate_limit,
            account.new_sessions_per_s,
            f"/s {scope}",
            NEW_SESSION_RATE,
        ),
        (
            "data-plane calls",
            "tps_limit",
            None if config.tps_limit is None else float(config.tps_limit),
            account.data_plane_per_s,
            "/s",
            DATA_PLANE_RATE,
        ),
        (
            "active sessions",
            "max_sessions",
            float(config.max_sessions),
            float(account.active_sessions),
            "",
            ACTIVE_SESSIONS,
        ),
    ]
    checks = []
    for name, key, wanted, limit, unit, ref in asked:
        if wanted is None:
            checks.append(
                Check(name, "ok", f"{key} not set: the experiment's share of {limit:.4g}{unit} (less the reserve)")
            )
            continue
        check = compare(name, key, wanted, limit, unit, fix=_request(ref))
        grantable = limit * (1 - reserve)
        if check.level != "error" and wanted > grantable:
            check = Check(
                name,
                "warning",
                f"{key}={wanted:g} is above what the account pool grants ({limit:.4g}{unit} less the {reserve:.0%} "
                f"reserve = {grantable:.4g}): the experiment gets at most that",
            )
        checks.append(check)
    return checks


def quota_checks(config: ExperimentConfig, client: Any, region: str = "") -> list[Check]:
    """The experiment's limits against the account's AgentCore quotas in this region, matched by quota code."""
    from botocore.exceptions import ClientError

    reader = QuotaReader(client)
    try:
        account = read_account_quotas(reader, region)
        endpoints = reader.find(ENDPOINTS_PER_AGENT)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        return [Check("quotas", "warning", f"cannot read Service Quotas ({code}): compare the limits by hand")]
    return [
        Check("quotas", "ok", f"read from Service Quotas: {account.source}"),
        *capacity_checks(config, account),
        compare(
            "endpoints",
            "endpoints",
            config.endpoints,
            float(endpoints["Value"]) if endpoints else None,
            " per agent",
            fix=_request(ENDPOINTS_PER_AGENT),
        ),
    ]


def pool_check(client: Any, region: str) -> Check:
    """The account pool exists in this region (its table, `topology.POOL_TABLE_NAME`); else the one command that
    creates it."""
    from botocore.exceptions import ClientError

    from rollout_pipeline.topology import POOL_TABLE_NAME

    try:
        client.describe_table(TableName=POOL_TABLE_NAME)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code == "ResourceNotFoundException":
            return Check(
                "account pool",
                "error",
                f"no account pool in {region} (table {POOL_TABLE_NAME}): run `rollouts bootstrap` once per account "
                "and region (`rollouts deploy` does it for you)",
            )
        return Check("account pool", "warning", f"cannot read table {POOL_TABLE_NAME} ({code})")
    return Check("account pool", "ok", f"table {POOL_TABLE_NAME} in {region}")


def codebuild_checks(region: str, reader: QuotaReader) -> list[Check]:
    """The default image build (CodeBuild, ARM_CONTAINER, SMALL): offered in the region, and builds allowed."""
    from botocore.exceptions import ClientError

    other_modes = (
        "-c image_build=local (Docker on this machine) or -c image_uri=ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPO:TAG"
    )
    if region not in ARM_CODEBUILD_REGIONS:
        return [
            Check(
                "image build",
                "error",
                f"CodeBuild offers no ARM builds (ARM_CONTAINER) in {region}: deploy with {other_modes}",
            )
        ]
    try:
        quota = reader.find(CODEBUILD_ARM_SMALL)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        return [Check("image build", "warning", f"cannot read the CodeBuild build quota ({code}): check it by hand")]
    if quota is None:
        return [
            Check(
                "image build",
                "warning",
                f"quota {_request(CODEBUILD_ARM_SMALL)} not found: check that the account may run an ARM/Small build",
            )
        ]
    allowed = float(quota["Value"])
    if allowed < 1:
        return [
            Check(
                "image build",
                "error",
                f"the account may run {allowed:g} concurrent ARM/Small CodeBuild builds ({_label(quota)}): request "
                f"an increase in Service Quotas ({_request(CODEBUILD_ARM_SMALL)}) or deploy with {other_modes}",
            )
        ]
    return [Check("image build", "ok", f"CodeBuild ARM in {region}, {allowed:g} concurrent build(s) allowed")]


def lambda_asks(config: ExperimentConfig) -> int:
    """Concurrent executions the stack's functions may use at once: each event source's MaximumConcurrency, one
    sweeper, and the custom-resource handlers (no function reserves concurrency)."""
    from rollout_pipeline.topology import function_specs

    specs = function_specs(config).values()
    return sum(spec.max_concurrency or 1 for spec in specs) + HELPER_LAMBDA_CONCURRENCY


def lambda_check(config: ExperimentConfig, client: Any) -> Check:
    """What the account lets the stack's Lambdas run at once (GetAccountSettings) against what they ask."""
    from botocore.exceptions import BotoCoreError, ClientError

    asked = lambda_asks(config)
    try:
        limit = client.get_account_settings()["AccountLimit"]
    except (BotoCoreError, ClientError) as exc:
        return Check("lambda concurrency", "warning", f"cannot read the Lambda account settings ({exc})")
    total = int(limit.get("ConcurrentExecutions", 0))
    unreserved = int(limit.get("UnreservedConcurrentExecutions", total))
    fix = (
        f"request a Lambda concurrency increase to at least {asked + 10} in Service Quotas "
        f"({_request(LAMBDA_CONCURRENCY)}); throttled queue consumers send rollouts to the dead-letter queues"
    )
    if unreserved < asked:
        return Check(
            "lambda concurrency",
            "error",
            f"the stack's functions may run {asked} at once, the account leaves {unreserved} unreserved "
            f"(of {total}): {fix}",
        )
    if asked > unreserved * QUOTA_HEADROOM:
        return Check(
            "lambda concurrency",
            "warning",
            f"the stack's functions may use {asked} of the {unreserved} unreserved executions: other functions of "
            f"the account share them; {fix}",
        )
    return Check("lambda concurrency", "ok", f"{asked} asked, {unreserved} unreserved of {total}")


def service_check(client: Any, region: str) -> Check:
    """AgentCore Runtime answers in the region (ListAgentRuntimes, one item)."""
    from botocore.exceptions import ClientError, EndpointConnectionError

    try:
        client.list_agent_runtimes(maxResults=1)
    except EndpointConnectionError:
        return Check("agentcore", "error", f"AgentCore Runtime is not offered in {region}: deploy to another region")
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code == "AccessDeniedException":
            return Check("agentcore", "warning", f"offered in {region}, but these credentials may not list runtimes")
        return Check("agentcore", "error", f"AgentCore answered {code} in {region}: {exc}")
    return Check("agentcore", "ok", f"AgentCore Runtime answers in {region}")


def bootstrap_check(client: Any, account: str, region: str) -> Check:
    """The CDK bootstrap stack exists in the account and region (its SSM version parameter)."""
    from botocore.exceptions import ClientError

    fix = f"run `npx cdk bootstrap aws://{account}/{region}`"
    try:
        value = client.get_parameter(Name=BOOTSTRAP_VERSION_PARAMETER)["Parameter"]["Value"]
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code == "ParameterNotFound":
            return Check("cdk bootstrap", "error", f"not bootstrapped: {fix}")
        return Check("cdk bootstrap", "warning", f"cannot read {BOOTSTRAP_VERSION_PARAMETER} ({code})")
    if int(value) < MIN_BOOTSTRAP_VERSION:
        return Check("cdk bootstrap", "error", f"version {value} is older than {MIN_BOOTSTRAP_VERSION}: {fix}")
    return Check("cdk bootstrap", "ok", f"version {value}")


def run(
    context: Mapping[str, Any],
    *,
    client: Callable[[str], Any],
    region: str,
) -> list[Check]:
    """Every check, in order; `client(service)` returns a boto3 client for the region (read calls only)."""
    from botocore.exceptions import BotoCoreError, ClientError

    checks, config = settings_checks(context)
    try:
        account = client("sts").get_caller_identity()["Account"]
    except (BotoCoreError, ClientError) as exc:
        checks.append(Check("credentials", "error", f"no usable AWS credentials ({exc}): configure a profile"))
        return checks
    checks.append(Check("credentials", "ok", f"account {account}, region {region}"))
    checks.append(service_check(client("bedrock-agentcore-control"), region))
    if config is not None:
        service_quotas = client("service-quotas")
        checks.extend(quota_checks(config, service_quotas, region))
        checks.append(pool_check(client("dynamodb"), region))
        if DeploySettings.from_context(context).image_mode == "codebuild":
            checks.extend(codebuild_checks(region, QuotaReader(service_quotas)))
        checks.append(lambda_check(config, client("lambda")))
    checks.append(bootstrap_check(client("ssm"), account, region))
    return checks


def worst(checks: Iterable[Check]) -> Level:
    levels = {check.level for check in checks}
    return "error" if "error" in levels else "warning" if "warning" in levels else "ok"
