"""The agent's model credential, delivered out of band (never in a payload, the ledger, a queue or an event).

Deployed: the runtime's environment names a Secrets Manager secret (`config.MODEL_SECRET_ENV`, set from
`ExperimentConfig.model_secret_name`); the execution role may call `GetSecretValue` on that secret only, and the
agent reads it once at start (`serve`) into `OPENAI_API_KEY`, where the model helpers look for a key. Local mode
passes the key through the agent process's environment (`OPENAI_API_KEY`) instead.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Final

from rollout_pipeline.config import MODEL_SECRET_ENV

logger = logging.getLogger(__name__)

API_KEY_ENV: Final = "OPENAI_API_KEY"


def secret_api_key(secret_string: str) -> str:
    """The API key in a secret's value: the plain string, or the `api_key` field of a JSON object."""
    try:
        parsed = json.loads(secret_string)
    except ValueError:
        return secret_string.strip()
    if isinstance(parsed, dict) and isinstance(parsed.get("api_key"), str):
        return str(parsed["api_key"])
    return secret_string.strip()


def load_model_credential(secrets_client: Any | None = None) -> bool:
    """Put the model key into `OPENAI_API_KEY` from the secret named by the environment, unless a key is already
    there. Returns True when a key was loaded from Secrets Manager."""
    name = os.environ.get(MODEL_SECRET_ENV)
    if not name or os.environ.get(API_KEY_ENV):
        return False
    if secrets_client is None:
        import boto3

        secrets_client = boto3.client("secretsmanager")
    value = secrets_client.get_secret_value(SecretId=name)["SecretString"]
    os.environ[API_KEY_ENV] = secret_api_key(str(value))
    logger.info("model credential loaded from secret %s", name)
    return True
