"""The GSM8K reward: strict and flexible answer extraction, numeric comparison, malformed output, per-turn lists,
and the sample dataset it ships with."""

from __future__ import annotations

import json
import time
from decimal import Decimal
from importlib import resources

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_pipeline import contracts
from rollout_pipeline.agent.rewards import (
    GSM8KReward,
    extract_answer,
    ground_truth_value,
    gsm8k_reward,
    normalize_number,
    per_turn_rewards,
)


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("5 + 2 = 7\n#### 7", 1.0),
        ("#### 7", 1.0),
        ("####7", 1.0),
        ("#### 7.", 1.0),
        ("#### 7.00", 1.0),
        ("#### $7", 1.0),
        ("first guess #### 3, corrected: #### 7", 1.0),
        ("#### 3", 0.0),
        ("the answer is 7", 0.0),
    ],
)
def test_strict_mode_needs_the_marker_and_compares_numbers(response: str, expected: float) -> None:
    assert gsm8k_reward(response, "#### 7", "strict") == expected


def test_flexible_mode_falls_back_to_the_last_number() -> None:
    assert gsm8k_reward("3 + 4 gives 7 apples.", "#### 7", "flexible") == 1.0
    assert gsm8k_reward("7 apples, minus 3 = 4", "#### 7", "flexible") == 0.0
    # A marker still wins over later numbers.
    assert gsm8k_reward("#### 7 (checked with 2 methods)", "#### 7", "flexible") == 1.0


def test_thousands_separators_currency_and_negative_numbers() -> None:
    assert gsm8k_reward("Total: #### $1,200", "#### 1200") == 1.0
    assert gsm8k_reward("#### -15", "#### -15") == 1.0
    assert gsm8k_reward("#### \u221215", "#### -15") == 1.0  # unicode minus sign
    assert gsm8k_reward("#### 15", "#### -15") == 0.0


def test_wrong_answer_gets_the_format_score_and_no_answer_gets_zero() -> None:
    assert gsm8k_reward("#### 8", "#### 7", format_score=0.1) == 0.1
    assert gsm8k_reward("no idea", "#### 7", format_score=0.1) == 0.0
    assert gsm8k_reward("#### 7", "#### 7", correct=2.0) == 2.0


@pytest.mark.parametrize(
    "malformed",
    [None, "", "####", "#### abc", "#### .", "#### ,", 42, 7.0, b"#### 7", {"text": "#### 7"}, ["#### 7"], "\x00\xff"],
)
@pytest.mark.parametrize("mode", ["strict", "flexible"])
def test_malformed_model_output_scores_zero_without_raising(malformed: object, mode: str) -> None:
    assert gsm8k_reward(malformed, "#### 7", mode) == 0.0  # type: ignore[arg-type]


def test_huge_output_is_bounded_and_the_tail_is_read() -> None:
    text = "1 " * 500_000 + "#### 7"
    started = time.monotonic()
    assert gsm8k_reward(text, "#### 7") == 1.0
    assert time.monotonic() - started < 2.0


@pytest.mark.parametrize(
    ("ground_truth", "value"),
    [
        ("Natalia sold 48/2 = 24 clips in May.\n#### 72", Decimal(72)),
        ("#### 1,000", Decimal(1000)),
        ("72", Decimal(72)),
        (72, Decimal(72)),
        (2.5, Decimal("2.5")),
    ],
)
def test_ground_truth_forms(ground_truth: object, value: Decimal) -> None:
    assert ground_truth_value(ground_truth) == value


@pytest.mark.parametrize("bad", [None, "", "#### x", "seventy-two", True, float("nan")])
def test_a_broken_ground_truth_is_a_dataset_error(bad: object) -> None:
    with pytest.raises(ValueError):
        gsm8k_reward("#### 7", bad)


def test_unknown_mode_is_rejected() -> None:
    with pytest.raises(ValueError):
        extract_answer("#### 7", "lenient")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        GSM8KReward("lenient")  # type: ignore[arg-type]


def test_per_turn_rewards_put_the_outcome_last() -> None:
    turns = ["let me think", "#### 3", "no wait, #### 7"]
    assert per_turn_rewards(turns, "#### 7") == [0.0, 0.0, 1.0]
    assert per_turn_rewards(turns, "#### 7", score_every_turn=True, format_score=0.1) == [0.0, 0.1, 1.0]
    assert per_turn_rewards([], "#### 7") == [0.0]
    assert contracts.scalar_reward(per_turn_rewards(turns, "#### 7")) == 1.0


def test_per_turn_rewards_parse_as_a_pipeline_result() -> None:
    body = json.dumps({"status_code": 200, "rewards": per_turn_rewards(["a", "#### 7"], "#### 7")}).encode()
    outcome = contracts.parse_result(body)
    assert outcome.success
    assert outcome.rewards == [0.0, 1.0]
    assert outcome.reward == 1.0


def test_reward_function_object_follows_arts_keyword_contract() -> None:
    reward = GSM8KReward("flexible", format_score=0.25)
    assert reward(response_text="so 7", ground_truth="#### 7", user_input="ignored") == 1.0
    assert reward(response_text="so 8", ground_truth="#### 7") == 0.25
    assert reward(response_text=None, ground_truth="#### 7") == 0.0


def test_normalize_number() -> None:
    assert normalize_number("$1,000.50") == Decimal("1000.5")
    assert normalize_number("12.") == Decimal(12)
    assert normalize_number("1.2.3") is None
    assert normalize_number("-") is None


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=-(10**9), max_value=10**9), st.sampled_from(["strict", "flexible"]))
def test_any_integer_written_with_separators_matches(n: int, mode: str) -> None:
    assert gsm8k_reward(f"Working...\n#### {n:,}", f"#### {n}", mode) == 1.0  # type: ignore[arg-type]
    assert gsm8k_reward(f"#### {n + 1}", f"#### {n}", mode) == 0.0  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.sampled_from(["strict", "flexible"]))
def test_arbitrary_text_never_raises(text: str, mode: str) -> None:
    assert gsm8k_reward(text, "#### 7", mode, format_score=0.5) in (0.0, 0.5, 1.0)  # type: ignore[arg-type]


def test_sample_dataset_rows_are_valid_and_self_consistent() -> None:
    text = resources.files("rollout_pipeline").joinpath("sample_data/gsm8k_sample.jsonl").read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    assert 15 <= len(lines) <= 30
    rows = [contracts.parse_row(line, position) for position, line in enumerate(lines, start=1)]
    assert len({row.input_id for row in rows}) == len(rows)
    for row in rows:
        assert set(row.payload) == {"question", "answer"}
        assert row.payload["answer"].startswith("#### ")
        assert gsm8k_reward(row.payload["answer"], row.payload["answer"]) == 1.0
