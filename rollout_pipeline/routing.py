"""Event routing shared by the CDK stack and local mode: which S3 objects trigger what, what the trainer gets.

Patterns are plain EventBridge event patterns (dicts), so the stack, local mode and tests use the same ones.
"""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import unquote_plus

from rollout_pipeline.contracts import EVENT_SOURCE, DetailType
from rollout_pipeline.contracts.mtrl import MTRL_BATCH_PREFIX

DATASET_PREFIX: Final = "datasets/"
#: Dataset file kinds the ingest stage accepts (a `.json` file holds one JSON array).
DATASET_SUFFIXES: Final = (".jsonl", ".jsonl.gz", ".json")


def dataset_event_pattern(input_bucket: str) -> dict[str, Any]:
    """S3 "Object Created" of any object under `datasets/`, by prefix: ingestion skips the keys that are not dataset
    files (`is_dataset_key`). No wildcard: the rule lives on the account's default bus, where EventBridge allows 30
    rules containing wildcards per bus, not adjustable, shared by everything in the account (docs/aws-facts.md); a
    wildcard rule per experiment would stop the 30th experiment's deploy."""
    return {
        "source": ["aws.s3"],
        "detail-type": ["Object Created"],
        "detail": {"bucket": {"name": [input_bucket]}, "object": {"key": [{"prefix": DATASET_PREFIX}]}},
    }


def result_event_pattern(results_bucket: str) -> dict[str, Any]:
    """S3 "Object Created" of a result object (`{exp_id}/{input_id}/{session_id}.json`)."""
    return {
        "source": ["aws.s3"],
        "detail-type": ["Object Created"],
        "detail": {"bucket": {"name": [results_bucket]}, "object": {"key": [{"suffix": ".json"}]}},
    }


def trainer_event_pattern() -> dict[str, Any]:
    """Every pipeline event on the experiment bus goes to the trainer queue."""
    return {"source": [EVENT_SOURCE]}


def mtrl_report_event_pattern() -> dict[str, Any]:
    """The terminal events of the MTRL forwarder's rollouts (batches `mtrl-*`): what the MTRL reporter reports."""
    return {
        "source": [EVENT_SOURCE],
        "detail-type": [DetailType.ROLLOUT_COMPLETED.value, DetailType.ROLLOUT_FAILED.value],
        "detail": {"batch_id": [{"prefix": MTRL_BATCH_PREFIX}]},
    }


def is_dataset_key(key: str) -> bool:
    return key.startswith(DATASET_PREFIX) and key.endswith(DATASET_SUFFIXES) and ".errors." not in key


def event_key_candidates(key: str) -> tuple[str, ...]:
    """The object keys an S3 event's `detail.object.key` may stand for, most likely first: decoded
    (`event_object_key`), then as the event carried it when that differs. Keys the pipeline accepts (no `+`, `%` or
    space) read the same either way; a reader of another key that is not found (or not parsed) under the first
    tries the second, once, so it holds whether or not S3's EventBridge events encode keys."""
    decoded = event_object_key(key)
    return (decoded,) if decoded == key else (decoded, key)


def event_object_key(key: str) -> str:
    """The object key of an S3 event's `detail.object.key`: S3 URL-encodes it (a space arrives as `+`), as AWS's own
    Powertools assumes, so decode it with `unquote_plus`. Keys the pipeline generates survive this unchanged."""
    return unquote_plus(key)
