"""`rollouts preflight`: check, with read calls only, that an experiment can be deployed and will hold its limits.

Each check prints one line, `ok`, `warning` or `error`, with what to do. The checks read: the settings (`cdk.json`
context plus `-c key=value` overrides, validated by the same code as `cdk synth`), the caller's account (STS), the
AgentCore control plane of the region (is the service offered there), the account's AgentCore quotas (Service
Quotas) against `session_rate_limit`, `tps_limit` and `max_sessions`, and the CDK bootstrap version (SSM).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from rollout_pipeline.config import ConfigError, ExperimentConfig
from rollout_pipeline.deploy_settings import DeploySettings, private_model_url_problem

Level = Literal["ok", "warning", "error"]
AGENTCORE_QUOTAS_SERVICE: Final = "bedrock-agentcore"
BOOTSTRAP_VERSION_PARAMETER: Final = "/cdk-bootstrap/hnb659fds/version"
#: The oldest bootstrap stack version that holds what `cdk deploy` of this stack needs (file assets, roles).
MIN_BOOTSTRAP_VERSION: Final = 6
#: A setting above this share of its quota leaves no headroom for retries and other users of the account.
QUOTA_HEADROOM: Final = 0.8


@dataclass(frozen=True)
class Check:
    """One line of the preflight: what was checked, how it went, and what to do about it."""

    name: str
    level: Level
    message: str

    def line(self) -> str:
        return f"{self.level:<7} {self.name}: {self.message}"


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


def _quotas(client: Any) -> list[dict[str, Any]]:
    quotas: list[dict[str, Any]] = []
    for page in client.get_paginator("list_service_quotas").paginate(ServiceCode=AGENTCORE_QUOTAS_SERVICE):
        quotas.extend(page.get("Quotas", []))
    return quotas


def _find(quotas: Iterable[dict[str, Any]], *words: str) -> dict[str, Any] | None:
    for quota in quotas:
        name = str(quota.get("QuotaName", "")).lower()
        if all(word in name for word in words):
            return quota
    return None


def _per_second(quota: Mapping[str, Any]) -> float:
    """A rate quota in per-second units (Service Quotas states some per minute)."""
    value = float(quota["Value"])
    unit = str(quota.get("Unit", "")).lower()
    name = str(quota.get("QuotaName", "")).lower()
    return value / 60.0 if "minute" in unit or "per minute" in name else value


def compare(name: str, setting: str, wanted: float, limit: float | None, unit: str) -> Check:
    """A setting against its quota: error above it, warning above QUOTA_HEADROOM of it."""
    if limit is None:
        return Check(name, "warning", f"quota not found in Service Quotas; check {setting}={wanted:g} by hand")
    if wanted > limit:
        return Check(
            name,
            "error",
            f"{setting}={wanted:g} is above the account's quota {limit:.4g}{unit}: lower it or request an increase "
            "in Service Quotas (bedrock-agentcore)",
        )
    if wanted > limit * QUOTA_HEADROOM:
        return Check(
            name, "warning", f"{setting}={wanted:g} uses more than {QUOTA_HEADROOM:.0%} of the quota {limit:.4g}{unit}"
        )
    return Check(name, "ok", f"{setting}={wanted:g} within the quota {limit:.4g}{unit}")


def quota_checks(config: ExperimentConfig, client: Any) -> list[Check]:
    """The experiment's limits against the account's AgentCore quotas in this region."""
    from botocore.exceptions import ClientError

    try:
        quotas = _quotas(client)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        return [Check("quotas", "warning", f"cannot read Service Quotas ({code}): compare the limits by hand")]
    sessions = _find(quotas, "active session")
    rate = _find(quotas, "session", "rate") or _find(quotas, "new session") or _find(quotas, "session creation")
    tps = _find(quotas, "invokeagentruntime") or _find(quotas, "invoke", "agent", "runtime")
    return [
        compare(
            "active sessions", "max_sessions", config.max_sessions, float(sessions["Value"]) if sessions else None, ""
        ),
        compare(
            "new sessions",
            "session_rate_limit x endpoints",
            config.session_rate_limit * config.endpoints,
            _per_second(rate) if rate else None,
            "/s",
        ),
        compare("invoke rate", "tps_limit", config.tps_limit, _per_second(tps) if tps else None, "/s"),
    ]


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
        checks.extend(quota_checks(config, client("service-quotas")))
    checks.append(bootstrap_check(client("ssm"), account, region))
    return checks


def worst(checks: Iterable[Check]) -> Level:
    levels = {check.level for check in checks}
    return "error" if "error" in levels else "warning" if "warning" in levels else "ok"
