"""Numbers reach the ledger in a form every DynamoDB implementation accepts (positional, <= 38 digits)."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout_pipeline.contracts import MAX_ABS_REWARD as MAX_REWARD_MAGNITUDE
from rollout_pipeline.ledger.attributes import from_attribute_value, number_text, to_attribute_value

REWARDS = st.floats(
    allow_nan=False, allow_infinity=False, min_value=-MAX_REWARD_MAGNITUDE, max_value=MAX_REWARD_MAGNITUDE
)


@given(REWARDS)
def test_any_accountable_reward_and_its_square_are_plain_dynamodb_numbers(reward: float) -> None:
    for value in (reward, reward * reward):
        text = to_attribute_value(value)["N"]
        assert "e" not in text.lower()
        digits = text.lstrip("-").replace(".", "").strip("0")  # significant digits
        assert len(digits) <= 38
        back = from_attribute_value({"N": text})
        assert math.isclose(float(back), value, rel_tol=1e-15, abs_tol=1e-130)


@pytest.mark.parametrize(
    ("value", "text"),
    [(1e-06, "0.000001"), (-2.5e-7, "-0.00000025"), (1e20, "100000000000000000000"), (0.0, "0"), (-0.0, "0"), (3, "3")],
)
def test_examples(value: float, text: str) -> None:
    assert to_attribute_value(value) == {"N": text}


def test_non_finite_and_out_of_range_numbers_are_refused() -> None:
    for bad in (math.inf, math.nan, 1e130):
        with pytest.raises(ValueError):
            number_text(bad)
    assert number_text(Decimal("1E-140")) == "0"
