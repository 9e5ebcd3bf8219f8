"""Unit tests of the shared contracts: dataset rows, per-file options, ids and keys, session ids, result parsing,
event models and the experiment configuration."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout_pipeline import ids
from rollout_pipeline.config import ConfigError, ExperimentConfig, HandlerSettings, SamplingParams
from rollout_pipeline.contracts import (
    MAX_ROW_BYTES,
    BatchAccepted,
    DetailType,
    FailureReason,
    FileOptions,
    RolloutCompleted,
    RolloutMessage,
    RowError,
    Timings,
    build_agent_payload,
    detail_type_of,
    parse_detail,
    parse_result,
    parse_row,
    reward_stats,
    scalar_reward,
    stats_from_sums,
)

CONFIG = ExperimentConfig(name="exp-1", group_size=4)

# ------------------------------------------------------------------------------------------------ dataset rows


def test_row_with_id_and_rollout_overrides() -> None:
    row = parse_row(b'{"id": "q-1", "prompt": "hi", "_rollout": {"sampling_params": {"temperature": 0.3}}}', 7)
    assert (row.position, row.input_id) == (7, "q-1")
    assert row.payload == {"prompt": "hi"}
    assert row.rollout_overrides == {"sampling_params": {"temperature": 0.3}}


def test_row_without_id_gets_its_position_and_integer_ids_become_strings() -> None:
    assert parse_row('{"prompt": "x"}', 12).input_id == "line-12"
    assert parse_row('{"id": null, "prompt": "x"}', 3).input_id == "line-3"
    assert parse_row({"id": 42}, 1).input_id == "42"


def test_row_from_a_decoded_mapping_is_validated_too() -> None:
    with pytest.raises(RowError) as info:
        parse_row({"id": "a/b"}, 1)
    assert info.value.reason == "invalid_id"


@pytest.mark.parametrize(
    ("raw", "reason", "fragment"),
    [
        (b'{"id": ', "invalid_json", "invalid JSON"),
        (b'{"a": "\xff"}', "invalid_json", "not UTF-8"),
        (b"[1, 2]", "not_an_object", "got array"),
        (b'"text"', "not_an_object", "got string"),
        (b"3.5", "not_an_object", "got number"),
        (b"null", "not_an_object", "got null"),
        (b'{"id": "../x"}', "invalid_id", "not safe"),
        (b'{"id": "a..b"}', "invalid_id", "'..'"),
        (b'{"id": "a/b"}', "invalid_id", "not safe"),
        (b'{"id": "-lead"}', "invalid_id", "not safe"),
        (b'{"id": "tab\\there"}', "invalid_id", "not safe"),
        (b'{"id": true}', "invalid_id", "string or an integer"),
        (b'{"id": 1.5}', "invalid_id", "string or an integer"),
        (b'{"_rollout": [1]}', "invalid_rollout", "must be an object"),
        (b'{"_rollout": {"exp_id": "x", "attempt": 2}}', "invalid_rollout", "attempt, exp_id"),
        (b'{"_rollout": {"sampling_params": {"top_p": 0}}}', "invalid_rollout", "top_p"),
    ],
)
def test_bad_rows_raise_row_error_with_reason(raw: bytes, reason: str, fragment: str) -> None:
    with pytest.raises(RowError) as info:
        parse_row(raw, 1)
    assert info.value.reason == reason
    assert fragment in str(info.value)


def test_id_length_limit() -> None:
    assert parse_row(json.dumps({"id": "a" * 128}), 1).input_id == "a" * 128
    with pytest.raises(RowError, match="not safe"):
        parse_row(json.dumps({"id": "a" * 129}), 1)


def test_oversized_row_is_rejected_as_text_and_as_mapping() -> None:
    big = {"pad": "x" * MAX_ROW_BYTES}
    with pytest.raises(RowError) as info:
        parse_row(json.dumps(big), 1)
    assert info.value.reason == "oversized"
    with pytest.raises(RowError) as info:
        parse_row(big, 1)
    assert info.value.reason == "oversized"


# ------------------------------------------------------------------------------------------- per-file options


def test_file_options_default_to_the_experiment() -> None:
    options = FileOptions.from_metadata(CONFIG, {})
    assert options == FileOptions.defaults(CONFIG)
    assert (options.group_size, options.rollout_timeout_s, options.max_attempts) == (4, 900, 2)


def test_file_options_from_metadata_override_and_merge_sampling_params() -> None:
    config = CONFIG.model_copy(update={"sampling_params": SamplingParams(temperature=1.0, max_tokens=64)})
    options = FileOptions.from_metadata(
        config,
        {
            "group-size": "16",
            "rollout-timeout-s": "120",
            "max-attempts": "3",
            "sampling-params": '{"temperature": 0.2}',
            "policy-version": "step-10",
            "unrelated": "ignored",
        },
    )
    assert (options.group_size, options.rollout_timeout_s, options.max_attempts) == (16, 120, 3)
    assert options.sampling_params.temperature == 0.2
    assert options.sampling_params.max_tokens == 64, "metadata sampling params merge into the defaults"
    assert options.policy_version == "step-10"


def test_file_options_round_trip_through_metadata() -> None:
    options = FileOptions(
        group_size=3,
        rollout_timeout_s=60,
        max_attempts=1,
        sampling_params=SamplingParams(top_p=0.9),
        policy_version="v2",
    )
    assert FileOptions.from_metadata(CONFIG, options.to_metadata()) == options


@pytest.mark.parametrize(
    ("metadata", "fragment"),
    [
        ({"group-size": "0"}, "metadata group-size"),
        ({"group-size": "many"}, "metadata group-size"),
        ({"max-attempts": "11"}, "metadata max-attempts"),
        ({"rollout-timeout-s": "5"}, "metadata rollout-timeout-s"),
        ({"sampling-params": "{bad"}, "metadata sampling-params: not valid JSON"),
        ({"sampling-params": "[1]"}, "metadata sampling-params: must be a JSON object"),
        ({"sampling-params": '{"temperature": -1}'}, "metadata sampling-params"),
        ({"policy-version": "p" * 129}, "metadata policy-version"),
    ],
)
def test_bad_metadata_names_the_key(metadata: dict[str, str], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        FileOptions.from_metadata(CONFIG, metadata)


# ------------------------------------------------------------------------------------------------ identifiers


@pytest.mark.parametrize("value", ["a", "exp-1", "a" + "b" * 31])
def test_valid_exp_ids(value: str) -> None:
    assert ids.validate_exp_id(value) == value


@pytest.mark.parametrize("value", ["", "1exp", "Exp", "a_b", "a" * 33, "a/b"])
def test_invalid_exp_ids(value: str) -> None:
    with pytest.raises(ids.InvalidId):
        ids.validate_exp_id(value)


@pytest.mark.parametrize("value", ["", "-b", "B1", "a" * 49, "a.b"])
def test_invalid_batch_ids(value: str) -> None:
    with pytest.raises(ids.InvalidId):
        ids.validate_batch_id(value)


def test_batch_id_for_upload_is_deterministic_per_version_and_valid() -> None:
    first = ids.batch_id_for_upload("bucket", "datasets/My Data.v2.jsonl.gz", "v1")
    assert first == ids.batch_id_for_upload("bucket", "datasets/My Data.v2.jsonl.gz", "v1")
    assert first.startswith("my-data-")
    assert ids.validate_batch_id(first) == first
    assert first != ids.batch_id_for_upload("bucket", "datasets/My Data.v2.jsonl.gz", "v2")
    assert first != ids.batch_id_for_upload("other", "datasets/My Data.v2.jsonl.gz", "v1")
    unversioned = ids.batch_id_for_upload("bucket", "datasets/x.jsonl", None, etag="e1")
    assert unversioned != ids.batch_id_for_upload("bucket", "datasets/x.jsonl", None, etag="e2")


def test_slug_and_new_batch_ids() -> None:
    assert ids.slug("  Hello, World!  ") == "hello-world"
    assert ids.slug("!!!") == "batch"
    assert len(ids.slug("x" * 100)) == 24
    fresh = {ids.new_batch_id("Run 1") for _ in range(20)}
    assert len(fresh) == 20
    assert all(ids.validate_batch_id(b) and b.startswith("run-1-") for b in fresh)


def test_keys() -> None:
    assert ids.rollout_id("q1", 3) == "q1#3"
    assert ids.claim_key("b-1", "q1") == "claims/b-1/q1.json"
    assert ids.errors_key("datasets/a.jsonl") == "datasets/a.jsonl.errors.ndjson"
    assert ids.result_key("exp-1", "q1", "sid") == "exp-1/q1/sid.json"
    assert ids.derived_input_id(5) == "line-5"


def test_session_id_is_deterministic_new_per_attempt_and_within_acr_bounds() -> None:
    sid = ids.session_id("exp-1", "b-" + "x" * 46, "q" * 128, 1023, 10)
    assert ids.SESSION_ID_MIN <= len(sid) <= ids.SESSION_ID_MAX
    assert sid == ids.session_id("exp-1", "b-" + "x" * 46, "q" * 128, 1023, 10)
    shortest = ids.session_id("e", "b", "i", 0, 1)
    assert len(shortest) == ids.SESSION_ID_MIN, "a short batch id gets a longer hash"
    assert ids.parse_result_key(ids.result_key("e", "i", shortest)).batch_id == "b"
    typical = ids.session_id("exp-1", "data-0123456789ab", "q1", 0, 1)
    assert len(typical.rsplit("-", 1)[-1]) == 16, "ids long enough keep the 16-character hash"
    assert ids.session_id("e", "b", "i", 0, 1) != ids.session_id("e", "b", "i", 0, 2)
    assert ids.session_id("e", "b", "i", 0, 1) != ids.session_id("e", "b", "j", 0, 1)
    with pytest.raises(ids.InvalidId):
        ids.session_id("e", "b", "i", -1, 1)
    with pytest.raises(ids.InvalidId):
        ids.session_id("e", "b", "i", 0, 0)


@given(
    batch=st.from_regex(ids.BATCH_ID_RE, fullmatch=True),
    input_id=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_=+@:-]{0,30}", fullmatch=True),
    index=st.integers(min_value=0, max_value=1023),
    attempt=st.integers(min_value=1, max_value=10),
)
def test_result_key_parses_back_to_the_attempt(batch: str, input_id: str, index: int, attempt: int) -> None:
    sid = ids.session_id("exp-1", batch, input_id, index, attempt)
    ref = ids.parse_result_key(ids.result_key("exp-1", input_id, sid))
    assert (ref.exp_id, ref.batch_id, ref.input_id, ref.index, ref.attempt, ref.session_id) == (
        "exp-1",
        batch,
        input_id,
        index,
        attempt,
        sid,
    )
    assert ref.rollout_id == f"{input_id}#{index}"


@pytest.mark.parametrize(
    "key",
    [
        "exp-1/q1/not-ours.json",
        "exp-1/q1/b-1-0-1-0000000000000000.json",  # right shape, wrong hash
        "exp-1/q1/sid.txt",
        "exp-1/sid.json",
        "Bad/q1/x.json",
        "exp-1/../x.json",
    ],
)
def test_foreign_result_keys_are_rejected(key: str) -> None:
    with pytest.raises(ids.InvalidId):
        ids.parse_result_key(key)


def test_result_key_of_another_input_is_rejected() -> None:
    sid = ids.session_id("exp-1", "b-1", "q1", 0, 1)
    with pytest.raises(ids.InvalidId, match="does not belong"):
        ids.parse_result_key(ids.result_key("exp-1", "q2", sid))


def test_event_ids_are_stable_and_distinct() -> None:
    first = ids.event_id("Rollout Completed", "e", "b", "i", 0)
    assert first == ids.event_id("Rollout Completed", "e", "b", "i", 0)
    assert first == ids.event_id(DetailType.ROLLOUT_COMPLETED, "e", "b", "i", 0)
    others = {
        ids.event_id("Rollout Completed", "e", "b", "i", 1),
        ids.event_id("Rollout Failed", "e", "b", "i", 0),
        ids.event_id("Batch Accepted", "e", "b"),
        ids.event_id("Batch Completed", "e", "b"),
    }
    assert first not in others
    assert len(others) == 4


# -------------------------------------------------------------------------------------- messages and payload


def _message(**overrides: Any) -> RolloutMessage:
    values: dict[str, Any] = {
        "exp_id": "exp-1",
        "batch_id": "b-1",
        "input_id": "q1",
        "index": 2,
        "attempt": 1,
        "group_size": 4,
        "submitted_at": datetime(2026, 1, 1, tzinfo=UTC),
        "payload": {"prompt": "hi"},
    }
    values.update(overrides)
    return RolloutMessage(**values)


def test_rollout_message_round_trips_and_derives_ids() -> None:
    message = _message()
    assert RolloutMessage.model_validate_json(message.model_dump_json()) == message
    assert message.rollout_id == "q1#2"
    assert message.session_id == ids.session_id("exp-1", "b-1", "q1", 2, 1)


@pytest.mark.parametrize(
    "overrides", [{"input_id": "../x"}, {"batch_id": "B"}, {"exp_id": "X"}, {"attempt": 0}, {"index": -1}]
)
def test_rollout_message_rejects_bad_ids(overrides: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        _message(**overrides)


def test_agent_payload_is_art_compatible_and_pipeline_keys_win() -> None:
    message = _message()
    options = FileOptions.defaults(CONFIG).model_copy(
        update={"sampling_params": SamplingParams(temperature=1.0, max_tokens=32), "policy_version": "v3"}
    )
    payload = build_agent_payload(
        row_payload={"prompt": "hi"},
        rollout_overrides={"sampling_params": {"temperature": 0.1}, "base_url": "http://gw/v1", "extra": 1},
        message=message,
        options=options,
        config=CONFIG,
        results_bucket="results",
    )
    rollout = payload["_rollout"]
    assert payload["prompt"] == "hi"
    assert (rollout["exp_id"], rollout["input_id"], rollout["s3_bucket"]) == ("exp-1", "q1", "results")
    assert rollout["sampling_params"] == {"temperature": 0.1, "max_tokens": 32}
    assert (rollout["base_url"], rollout["extra"], rollout["model_id"]) == ("http://gw/v1", 1, "default")
    assert (rollout["session_id"], rollout["rollout_id"]) == (message.session_id, "q1#2")
    assert (rollout["index"], rollout["attempt"], rollout["group_size"], rollout["policy_version"]) == (2, 1, 4, "v3")


# ---------------------------------------------------------------------------------------------- result parsing


def test_success_with_scalar_or_per_turn_rewards() -> None:
    scalar = parse_result(b'{"rewards": 1, "status_code": 200}')
    assert (scalar.success, scalar.rewards, scalar.reward) == (True, 1.0, 1.0)
    turns = parse_result(b'{"rewards": [0.1, 0.5, 0.9]}')
    assert (turns.success, turns.rewards, turns.reward) == (True, [0.1, 0.5, 0.9], 0.9)
    assert scalar_reward([0.2, 0.4]) == 0.4
    assert scalar_reward(0.7) == 0.7


def test_agent_error_carries_the_stop_reason_and_traceback_tail() -> None:
    outcome = parse_result(
        json.dumps(
            {"status_code": 500, "stop_reason": "boom", "traceback": "Traceback...\nValueError: boom detail"}
        ).encode()
    )
    assert (outcome.success, outcome.reason) == (False, FailureReason.AGENT_ERROR)
    assert outcome.error is not None
    assert outcome.error.startswith("status_code 500: boom")
    assert "ValueError: boom detail" in outcome.error
    assert parse_result(b'{"status_code": 503}').error == "status_code 503: agent returned status_code 503"


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"not json", "not valid JSON"),
        (b"[1]", "must be a JSON object"),
        (b'{"status_code": "200", "rewards": 1}', "status_code must be an integer"),
        (b'{"status_code": 200}', "no 'rewards'"),
        (b'{"rewards": "high"}', "rewards must be"),
        (b'{"rewards": []}', "rewards must be"),
        (b'{"rewards": [1, null]}', "rewards must be"),
        (b'{"rewards": true}', "rewards must be"),
        (b'{"rewards": NaN}', "rewards must be"),
    ],
)
def test_invalid_results_are_never_a_zero_reward(body: bytes, fragment: str) -> None:
    outcome = parse_result(body)
    assert (outcome.success, outcome.reason, outcome.reward) == (False, FailureReason.INVALID_RESULT, None)
    assert fragment in (outcome.error or "")


def test_result_size_limit() -> None:
    assert parse_result(b'{"rewards": 1}', max_bytes=5).reason == FailureReason.INVALID_RESULT
    assert parse_result(b'{"rewards": 1}', max_bytes=100).success


def test_reward_statistics() -> None:
    assert reward_stats([]) == (None, None)
    assert reward_stats([1.0, 3.0]) == (2.0, 1.0)
    mean, std = stats_from_sums(3, 6.0, 14.0)  # values 1, 2, 3
    assert mean == 2.0
    assert std is not None
    assert math.isclose(std, math.sqrt(2 / 3))
    assert stats_from_sums(0, 0.0, 0.0) == (None, None)
    assert stats_from_sums(2, 2.0, 1.9999999) == (1.0, 0.0), "rounding never makes the variance negative"


# ------------------------------------------------------------------------------------------------ event models


def test_event_details_round_trip_by_detail_type() -> None:
    accepted = BatchAccepted(
        event_id="e",
        exp_id="exp-1",
        batch_id="b-1",
        rows_accepted=2,
        rows_rejected=1,
        rollouts_enqueued=8,
        group_size=4,
    )
    assert detail_type_of(accepted) == DetailType.BATCH_ACCEPTED
    assert parse_detail("Batch Accepted", accepted.model_dump_json()) == accepted
    completed = RolloutCompleted(
        event_id="e2",
        exp_id="exp-1",
        batch_id="b-1",
        input_id="q1",
        index=0,
        rollout_id="q1#0",
        session_id="s" * 33,
        attempt=1,
        rewards=[0.0, 1.0],
        reward=1.0,
        result_uri="s3://r/k",
        timings=Timings(),
    )
    assert parse_detail("Rollout Completed", json.loads(completed.model_dump_json())) == completed


def test_event_details_reject_unknown_fields_and_types() -> None:
    with pytest.raises(ValueError):
        parse_detail("Batch Accepted", {"event_id": "e", "exp_id": "x", "batch_id": "b", "surprise": 1})
    with pytest.raises(ValueError):
        parse_detail("Batch Exploded", {})
    with pytest.raises(TypeError):
        detail_type_of(Timings())  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------- configuration


def test_config_from_cdk_context_coerces_strings() -> None:
    config = ExperimentConfig.from_context(
        {
            "experiment": "exp-2",
            "group_size": "16",
            "sampling_params": '{"temperature": 0.7}',
            "policy_version": "none",
            "model_base_url": "https://models.example/v1/",
            "unrelated": "value",
        }
    )
    assert (config.name, config.group_size, config.policy_version) == ("exp-2", 16, None)
    assert config.sampling_params.temperature == 0.7
    assert config.model_base_url == "https://models.example/v1"
    assert ExperimentConfig.from_env(config.to_env()) == config
    assert config.runtime_name == "rollouts_exp_2"


@pytest.mark.parametrize(
    ("context", "fragment"),
    [
        ({}, "missing experiment name"),
        ({"experiment": "Bad Name"}, "name"),
        ({"experiment": "x", "group_size": "0"}, "group_size"),
        ({"experiment": "x", "sampling_params": "{"}, "sampling_params: not valid JSON"),
        ({"experiment": "x", "model_base_url": "ftp://x"}, "model_base_url"),
        ({"experiment": "x", "rollout_timeout_s": "3600", "max_lifetime_s": "600"}, "max_lifetime_s"),
    ],
)
def test_bad_config_names_the_key(context: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        ExperimentConfig.from_context(context)


def test_handler_settings_round_trip_and_missing_variables() -> None:
    settings = HandlerSettings(
        table_name="t",
        input_bucket="in",
        results_bucket="out",
        rollout_queue_url="https://q/rollout",
        bus_name="bus",
        ingest_queue_url="https://q/ingest",
        experiment=CONFIG,
    )
    assert HandlerSettings.from_environ(settings.to_environ()) == settings
    with pytest.raises(ConfigError, match="TABLE_NAME, BUS_NAME"):
        HandlerSettings.from_environ(
            {k: v for k, v in settings.to_environ().items() if k not in ("TABLE_NAME", "BUS_NAME")}
        )
