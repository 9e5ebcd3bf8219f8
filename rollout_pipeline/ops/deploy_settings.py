"""Settings of a deployed stack that the Lambdas never see, and the checks shared by `cdk synth` and the preflight.

Plain Python (no CDK): the preflight (`rollouts preflight`) and `stacks/application.py` read the same CDK context
(`cdk.json` defaults, `-c key=value` overrides) through this one module, so both refuse the same things.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal
from urllib.parse import urlsplit

from rollout_pipeline.config import ConfigError, ExperimentConfig

IMAGE_BUILD_KEY: Final = "image_build"
IMAGE_URI_KEY: Final = "image_uri"
ALARM_EMAIL_KEY: Final = "alarm_email"
ALLOW_PRIVATE_MODEL_URL_KEY: Final = "allow_private_model_url"
ARCHIVE_DAYS_KEY: Final = "event_archive_days"
MODEL_SECRET_KMS_KEY: Final = "model_secret_kms_key_arn"
#: A prebuilt `image_uri` whose start command is the agent host (`python -m rollout_pipeline.agent.host`), as the
#: image the stack builds: only then does the warm pool run (the host answers its warm-ups).
IMAGE_AGENT_HOST_KEY: Final = "image_agent_host"
#: Every context key that configures the stack but not the experiment (the Lambdas never see these).
STACK_KEYS: Final = (
    IMAGE_BUILD_KEY,
    IMAGE_URI_KEY,
    ALARM_EMAIL_KEY,
    ALLOW_PRIVATE_MODEL_URL_KEY,
    ARCHIVE_DAYS_KEY,
    MODEL_SECRET_KMS_KEY,
    IMAGE_AGENT_HOST_KEY,
)

ImageBuild = Literal["codebuild", "local"]
IMAGE_BUILDS: Final[tuple[ImageBuild, ...]] = ("codebuild", "local")
DEFAULT_ARCHIVE_RETENTION_DAYS: Final = 14
#: AgentCore Runtime pulls images from Amazon ECR only: `ACCOUNT.dkr.ecr.REGION.amazonaws.com[.cn]/REPO(:TAG|@DIGEST)`.
ECR_IMAGE_URI: Final = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/"
    r"(?P<repository>[a-z0-9][a-z0-9._/-]{1,255})(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})|@(?P<digest>sha256:[0-9a-f]{64}))$"
)
#: A KMS key ARN (not an alias: an alias ARN does not authorize the use of its key in an IAM policy).
KMS_KEY_ARN: Final = re.compile(r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/[A-Za-z0-9-]{1,128}$")
EMAIL: Final = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_TRUE: Final = frozenset({"true", "1", "yes"})
_FALSE: Final = frozenset({"false", "0", "no", ""})
#: Host names that only ever mean "this machine" or a private network.
_PRIVATE_SUFFIXES: Final = (".localhost", ".local", ".internal", ".localdomain", ".home.arpa")


def private_model_url_problem(url: str) -> str | None:
    """Why a deployed agent cannot reach `url` (a loopback, private or link-local host), or None if it may.

    Only the URL is inspected (no DNS lookup: synth stays offline). An AgentCore runtime in public network mode
    reaches the internet, not the deploying machine nor a private network.
    """
    host = (urlsplit(url).hostname or "").lower().rstrip(".")
    if not host:
        return f"model_base_url {url!r} has no host"
    if host == "localhost" or host.endswith(_PRIVATE_SUFFIXES):
        return f"model_base_url {url!r} names a local host ({host}) that a deployed agent cannot reach"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if address.is_loopback:
        kind = "loopback"
    elif address.is_link_local:
        kind = "link-local"
    elif address.is_private or address.is_unspecified or address.is_reserved:
        kind = "private"
    else:
        return None
    return f"model_base_url {url!r} is a {kind} address ({host}) that a deployed agent cannot reach"


def _flag(context: Mapping[str, Any], key: str) -> bool:
    raw = context.get(key)
    if isinstance(raw, bool):
        return raw
    text = "" if raw is None else str(raw).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{key}: must be true or false (got {raw!r})")


def _text(context: Mapping[str, Any], key: str) -> str:
    raw = context.get(key)
    return "" if raw is None else str(raw).strip()


@dataclass(frozen=True)
class DeploySettings:
    """How the stack is built and operated: image source, alarm subscription, archive, private-URL opt-in."""

    image_build: ImageBuild = "codebuild"
    image_uri: str = ""
    alarm_email: str = ""
    allow_private_model_url: bool = False
    archive_retention_days: int = DEFAULT_ARCHIVE_RETENTION_DAYS
    #: The customer-managed KMS key of the model secret, if any: the agent role may decrypt with it (via Secrets
    #: Manager only). Secrets under the AWS-managed key need nothing.
    model_secret_kms_key_arn: str = ""
    #: The prebuilt `image_uri` runs the agent host (`IMAGE_AGENT_HOST_KEY`); the images the stack builds always do.
    image_agent_host: bool = False

    @property
    def serves_agent_host(self) -> bool:
        """Whether the runtime's image runs the agent host, which answers the warm pool's warm-ups."""
        return self.image_mode != "uri" or self.image_agent_host

    def warm_pool_config(self, config: ExperimentConfig) -> tuple[ExperimentConfig, str | None]:
        """`config` as the stack deploys it, and a warning when the warm pool is asked for but the image does not
        run the agent host (a prebuilt `image_uri`): the pool is then off (`warm_sessions` 0). A warm-up sent to
        an agent served some other way would run the agent's own code with an empty request."""
        if not config.warm_pool_on or self.serves_agent_host:
            return config, None
        warning = (
            f"warm_sessions={config.warm_sessions} is ignored: the prebuilt image_uri may not run the agent host "
            "(python -m rollout_pipeline.agent.host), which answers the warm pool's warm-ups, so this stack keeps no "
            f"warm pool; if the image's start command is the agent host, deploy with -c {IMAGE_AGENT_HOST_KEY}=true"
        )
        return config.model_copy(update={"warm_sessions": 0}), warning

    @property
    def image_mode(self) -> Literal["codebuild", "local", "uri"]:
        """Where the agent image comes from: built in CodeBuild, built by local Docker, or a prebuilt ECR image."""
        return "uri" if self.image_uri else self.image_build

    @classmethod
    def from_context(cls, context: Mapping[str, Any]) -> DeploySettings:
        """Parse the stack-only context keys; raise ConfigError naming the key and what to do."""
        image_build = _text(context, IMAGE_BUILD_KEY) or "codebuild"
        if image_build not in IMAGE_BUILDS:
            raise ConfigError(f"{IMAGE_BUILD_KEY}: must be one of {', '.join(IMAGE_BUILDS)} (got {image_build!r})")
        image_uri = _text(context, IMAGE_URI_KEY)
        if image_uri and not ECR_IMAGE_URI.match(image_uri):
            raise ConfigError(
                f"{IMAGE_URI_KEY}: AgentCore runs images from Amazon ECR only: "
                f"ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPOSITORY:TAG or @sha256:DIGEST (got {image_uri!r})"
            )
        alarm_email = _text(context, ALARM_EMAIL_KEY)
        if alarm_email and not EMAIL.match(alarm_email):
            raise ConfigError(f"{ALARM_EMAIL_KEY}: not an e-mail address (got {alarm_email!r})")
        kms_key_arn = _text(context, MODEL_SECRET_KMS_KEY)
        if kms_key_arn and not KMS_KEY_ARN.match(kms_key_arn):
            raise ConfigError(
                f"{MODEL_SECRET_KMS_KEY}: a KMS key ARN, arn:aws:kms:REGION:ACCOUNT:key/KEY-ID, not an alias "
                f"(got {kms_key_arn!r})"
            )
        return cls(
            image_build=image_build,
            model_secret_kms_key_arn=kms_key_arn,
            image_uri=image_uri,
            alarm_email=alarm_email,
            allow_private_model_url=_flag(context, ALLOW_PRIVATE_MODEL_URL_KEY),
            archive_retention_days=archive_retention_days(context.get(ARCHIVE_DAYS_KEY)),
            image_agent_host=_flag(context, IMAGE_AGENT_HOST_KEY),
        )

    def check_model_secret_key(self, model_secret_name: str | None) -> None:
        """Refuse a model-secret KMS key without a model secret (the grant would serve nothing)."""
        if self.model_secret_kms_key_arn and not model_secret_name:
            raise ConfigError(
                f"{MODEL_SECRET_KMS_KEY} is set but model_secret_name is not: set -c model_secret_name=NAME "
                f"(the secret encrypted with that key) or leave {MODEL_SECRET_KMS_KEY} empty"
            )

    def check_model_url(self, url: str) -> None:
        """Refuse a model URL a deployed agent cannot reach, unless `allow_private_model_url` is set."""
        problem = private_model_url_problem(url)
        if problem and not self.allow_private_model_url:
            raise ConfigError(
                f"{problem}: deploy with `-c model_base_url=https://...` (a public endpoint), or with "
                f"`-c {ALLOW_PRIVATE_MODEL_URL_KEY}=true` if the runtime really reaches it"
            )


def archive_retention_days(raw: Any) -> int:
    """`event_archive_days`: whole days 0-3650, 0 disables the archive; empty means the default."""
    if raw is None or raw == "":
        return DEFAULT_ARCHIVE_RETENTION_DAYS
    try:
        days = int(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{ARCHIVE_DAYS_KEY}: must be a whole number of days, 0 to disable (got {raw!r})") from None
    if not 0 <= days <= 3650:
        raise ConfigError(f"{ARCHIVE_DAYS_KEY}: must be between 0 and 3650 (got {days})")
    return days
