"""GSM8K-style reward: the answer after `#### `, compared numerically with the ground truth.

- strict mode: only an answer written as `#### <number>` counts (the last such marker wins);
- flexible mode: the `#### ` answer if there is one, else the last number in the text.

A correct answer scores `correct` (1.0), a parsable but wrong one `format_score` (0.0 by default; set e.g. 0.1 to
reward the format), no answer at all 0.0. Numbers compare by value: `1,000`, `$1000`, `1000.00` and `1000.` are
all 1000. Pure functions, standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Any, Final, Literal

Mode = Literal["strict", "flexible"]

#: Longest model output looked at (the tail is kept: answers come last).
MAX_TEXT_CHARS: Final = 100_000
_MINUS_SIGN: Final = "\u2212"
_NUMBER = r"[-\u2212]?\$?\s?[0-9][0-9,]*(?:\.[0-9]+)?\.?"
_STRICT: Final = re.compile(r"####\s*(" + _NUMBER + ")")
_ANY_NUMBER: Final = re.compile(_NUMBER)


def normalize_number(text: str) -> Decimal | None:
    """`"$1,000.50"` -> Decimal("1000.50"); None when `text` is not a plain number."""
    cleaned = text.strip().replace(_MINUS_SIGN, "-").replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    if not cleaned or cleaned in {"-", "."}:
        return None
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def extract_answer(text: Any, mode: Mode = "strict") -> Decimal | None:
    """The final numeric answer in a model's output, or None (also for non-text or malformed output)."""
    if not isinstance(text, str) or not text:
        return None
    if mode not in ("strict", "flexible"):
        raise ValueError(f"mode must be 'strict' or 'flexible', got {mode!r}")
    tail = text[-MAX_TEXT_CHARS:]
    marked = _STRICT.findall(tail)
    if marked:
        return normalize_number(marked[-1])
    if mode == "strict":
        return None
    for candidate in reversed(_ANY_NUMBER.findall(tail)):
        value = normalize_number(candidate)
        if value is not None:
            return value
    return None


def ground_truth_value(answer: Any) -> Decimal:
    """The number of a ground-truth answer: `"#### 42"`, a full GSM8K solution ending in `#### 42`, `"42"` or 42.

    Raises ValueError when there is none (a dataset bug, not a model failure)."""
    if isinstance(answer, bool):
        raise ValueError(f"ground truth is not a number: {answer!r}")
    if isinstance(answer, int | float | Decimal):
        value = Decimal(str(answer))
        if not value.is_finite():
            raise ValueError(f"ground truth is not finite: {answer!r}")
        return value
    parsed = extract_answer(answer, "strict") if isinstance(answer, str) and "####" in answer else None
    if parsed is None and isinstance(answer, str):
        parsed = normalize_number(answer)
    if parsed is None:
        raise ValueError(f"ground truth has no number: {answer!r}")
    return parsed


def gsm8k_reward(
    response: Any,
    ground_truth: Any,
    mode: Mode = "strict",
    *,
    correct: float = 1.0,
    format_score: float = 0.0,
) -> float:
    """Reward of one response: `correct` if its answer equals the ground truth, `format_score` if it has an answer
    that is wrong, 0.0 if it has none (malformed, empty or non-text output)."""
    expected = ground_truth_value(ground_truth)
    answer = extract_answer(response, mode)
    if answer is None:
        return 0.0
    return correct if answer == expected else format_score


def per_turn_rewards(
    responses: Sequence[Any],
    ground_truth: Any,
    mode: Mode = "strict",
    *,
    score_every_turn: bool = False,
    correct: float = 1.0,
    format_score: float = 0.0,
) -> list[float]:
    """One reward per assistant turn. By default an outcome reward: 0.0 for every turn but the last, which gets the
    final answer's reward (so `rewards[-1]`, the pipeline's scalar reward, is the outcome). With
    `score_every_turn`, each turn is scored on its own. No turns at all gives `[0.0]` (never an empty list)."""
    if not responses:
        ground_truth_value(ground_truth)  # still reject a broken ground truth
        return [0.0]
    if score_every_turn:
        return [gsm8k_reward(r, ground_truth, mode, correct=correct, format_score=format_score) for r in responses]
    final = gsm8k_reward(responses[-1], ground_truth, mode, correct=correct, format_score=format_score)
    return [0.0] * (len(responses) - 1) + [final]


class GSM8KReward:
    """ART `RewardFunction`-style callable: `reward(response_text=..., ground_truth=...)` -> float."""

    def __init__(self, mode: Mode = "strict", *, correct: float = 1.0, format_score: float = 0.0) -> None:
        if mode not in ("strict", "flexible"):
            raise ValueError(f"mode must be 'strict' or 'flexible', got {mode!r}")
        self.mode: Mode = mode
        self.correct = correct
        self.format_score = format_score

    def __call__(self, *, response_text: Any = None, ground_truth: Any = None, **_: Any) -> float:
        """Score `response_text` against `ground_truth` (other keyword arguments are ignored)."""
        return gsm8k_reward(
            response_text, ground_truth, self.mode, correct=self.correct, format_score=self.format_score
        )
