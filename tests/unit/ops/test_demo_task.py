"""The demo's task: the bundled arithmetic dataset is self-consistent, `--dataset` picks bundled datasets by name,
and the demo's reward gives 1 exactly for the right final number."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollout_pipeline import contracts
from rollout_pipeline.agent.rewards import gsm8k_reward
from rollout_pipeline.local.demo import BUNDLED_DATASETS, DEFAULT_DATASET, resolve_dataset, sample_dataset_path
from rollout_pipeline.local.model_server import DEFAULT_MAX_TOKENS
from rollout_pipeline.local.pipeline import LocalSettings


def test_arithmetic_rows_are_valid_single_digit_sums() -> None:
    lines = [line for line in sample_dataset_path("arithmetic").read_text().splitlines() if line.strip()]
    assert len(lines) == 30
    rows = [contracts.parse_row(line, position) for position, line in enumerate(lines, start=1)]
    assert len({row.input_id for row in rows}) == len({json.dumps(row.payload) for row in rows}) == len(rows)
    for row in rows:
        assert row.payload["task"] == "arithmetic"
        left, plus, right = row.payload["question"].split()
        assert plus == "+"
        assert 2 <= int(left) <= 9
        assert 2 <= int(right) <= 9
        assert row.payload["answer"] == str(int(left) + int(right))


@pytest.mark.parametrize(
    ("reply", "reward"),
    [("17", 1.0), ("The result of 8 + 9 is 17.", 1.0), ("8 + 9 = 16", 0.0), ("I cannot say.", 0.0), ("", 0.0)],
)
def test_the_demo_reward_scores_the_last_number(reply: str, reward: float) -> None:
    assert gsm8k_reward(reply, "17", "flexible") == reward


def test_dataset_names_resolve_to_bundled_files_and_paths_pass_through(tmp_path: Path) -> None:
    assert DEFAULT_DATASET == "arithmetic"
    assert resolve_dataset(None) == (sample_dataset_path("arithmetic"), BUNDLED_DATASETS["arithmetic"][1])
    path, max_tokens = resolve_dataset("gsm8k")
    assert path.name == "gsm8k_sample.jsonl"
    assert path.is_file()
    assert max_tokens == 256
    own = tmp_path / "mine.jsonl"
    assert resolve_dataset(str(own)) == (own, DEFAULT_MAX_TOKENS)


def test_local_up_and_the_demo_sample_the_same_tokens_for_your_rows(tmp_path: Path) -> None:
    from rollout_pipeline.cli.parser import build_parser
    from rollout_pipeline.local.cli import _settings

    parser = build_parser()
    own = str(tmp_path / "mine.jsonl")
    up = _settings(parser.parse_args(["local", "up"]))
    demo_args = parser.parse_args(["local", "demo", "--dataset", own])
    demo = _settings(demo_args, resolve_dataset(demo_args.dataset)[1])
    assert up.sampling_params["max_tokens"] == demo.sampling_params["max_tokens"] == DEFAULT_MAX_TOKENS
    assert LocalSettings().sampling_params["max_tokens"] == DEFAULT_MAX_TOKENS  # and from Python
