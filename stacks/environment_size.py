"""Lambda's 4 KB limit on a function's environment, checked at synth with the setting that made it big.

Lambda refuses a function whose environment variables (names and values) total more than 4 KB
(https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html). The pipeline's functions carry the
whole experiment configuration as JSON (`EXPERIMENT_CONFIG`); a long `sampling_params` or `model_base_url` would
only fail at deploy, in CloudFormation. Resource names are unknown at synth (tokens): each counts at the longest
value AWS allows for it, so a template that passes here fits whatever names CloudFormation picks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final

from aws_cdk import Token

from rollout_pipeline import topology
from rollout_pipeline.config import ConfigError

LAMBDA_ENVIRONMENT_LIMIT_BYTES: Final = 4 * 1024
#: The longest value of each variable that holds a name CloudFormation chooses (from the services' own limits).
_QUEUE_URL_MAX: Final = len("https://sqs.ap-southeast-7.amazonaws.com.cn/123456789012/") + 80  # queue names: 80
TOKEN_MAX_BYTES: Final[Mapping[str, int]] = {
    "TABLE_NAME": 255,  # DynamoDB table names
    "INPUT_BUCKET": 63,  # S3 bucket names
    "RESULTS_BUCKET": 63,
    "ROLLOUT_QUEUE_URL": _QUEUE_URL_MAX,
    "INGEST_QUEUE_URL": _QUEUE_URL_MAX,
    "BUS_NAME": 256,  # EventBridge bus names
    # arn:aws-cn:bedrock-agentcore:REGION:ACCOUNT:runtime/NAME-SUFFIX (runtime names: 48, suffix: 10)
    "RUNTIME_ARN": len("arn:aws-cn:bedrock-agentcore:ap-southeast-7:123456789012:runtime/") + 48 + 1 + 10,
    # Imported from the account pool's stack, whose export is its table's well-known name.
    "POOL_TABLE_NAME": len(topology.POOL_TABLE_NAME),
}
#: A variable not listed above whose value is a token.
UNKNOWN_TOKEN_MAX_BYTES: Final = 2048
CONFIG_VARIABLE: Final = "EXPERIMENT_CONFIG"


def _size(name: str, value: str) -> int:
    if Token.is_unresolved(value):
        return len(name.encode()) + TOKEN_MAX_BYTES.get(name, UNKNOWN_TOKEN_MAX_BYTES)
    return len(name.encode()) + len(value.encode())


def environment_bytes(environment: Mapping[str, str]) -> int:
    """The environment's size as Lambda counts it (names and values), tokens at their longest."""
    return sum(_size(name, value) for name, value in environment.items())


def largest_settings(config_json: str, count: int = 3) -> list[tuple[str, int]]:
    """The experiment settings that take the most room in `EXPERIMENT_CONFIG` (name, bytes of their JSON)."""
    values = json.loads(config_json)
    sizes = [(key, len(json.dumps(value, separators=(",", ":")).encode())) for key, value in values.items()]
    return sorted(sizes, key=lambda item: -item[1])[:count]


def check_environment_size(environment: Mapping[str, str]) -> None:
    """Raise ConfigError if the environment can exceed Lambda's 4 KB, naming the settings that take the room."""
    total = environment_bytes(environment)
    if total <= LAMBDA_ENVIRONMENT_LIMIT_BYTES:
        return
    config_json = environment.get(CONFIG_VARIABLE, "{}")
    biggest = ", ".join(f"{key} ({size} bytes)" for key, size in largest_settings(config_json))
    raise ConfigError(
        f"the Lambda environment would take up to {total} bytes, over Lambda's {LAMBDA_ENVIRONMENT_LIMIT_BYTES}-byte "
        f"limit: {CONFIG_VARIABLE} (the experiment settings as JSON) is {len(config_json.encode())} bytes; "
        f"the largest settings: {biggest}. Shorten them (e.g. fewer sampling_params)"
    )
