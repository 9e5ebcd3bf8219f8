"""The `rollouts` help a newcomer reads: commands by topic, typos answered with the closest name, an unknown option
shown with its own command's usage, and no stray formatting or text of another command."""

from __future__ import annotations

import pytest

from rollout_pipeline.cli import EXIT_OK, EXIT_USAGE, main
from rollout_pipeline.cli.parser import COMMAND_TOPICS, build_parser


def test_the_commands_are_listed_by_topic_each_once(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == EXIT_OK
    out = capsys.readouterr().out
    listing = out.split("commands (", 1)[1].split("positional arguments:", 1)[0]
    for topic, names in COMMAND_TOPICS:
        assert f"\n  {topic}\n" in listing
        for name in names:
            assert sum(line.startswith(f"    {name} ") for line in listing.splitlines()) == 1, name
    assert listing.index("\n  run batches") < listing.index("\n  deploy and operate")
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert {name for _, names in COMMAND_TOPICS for name in names} == set(commands), "every command has a topic"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["sumbit", "x.jsonl"], "invalid choice: 'sumbit'; did you mean 'submit'?"),
        (["budget", "sett", "3"], "did you mean 'set'?"),
        (
            ["submit", "x.jsonl", "--group-szie", "3"],
            "unrecognized arguments: --group-szie 3; did you mean '--group-size'?",
        ),
        (["local", "demo", "--rowz", "3"], "did you mean '--rows'?"),
    ],
)
def test_a_typo_gets_the_closest_name(argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == EXIT_USAGE
    assert expected in capsys.readouterr().err


def test_an_unknown_option_shows_its_commands_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["submit", "x.jsonl", "--group-szie", "3"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("usage: rollouts submit ")
    assert "rollouts submit: error:" in err


def test_budget_help_has_no_doubled_percent_and_up_help_no_demo_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["budget", "--help"]) == EXIT_OK
    budget = capsys.readouterr().out
    assert "80% of the budget" in budget
    assert "%%" not in budget
    assert main(["local", "up", "--help"]) == EXIT_OK
    up = capsys.readouterr().out.replace("local-demo", "")
    assert "demo" not in up.lower()
    assert main(["local", "demo", "--help"]) == EXIT_OK
    assert "the demo then raises it" in " ".join(capsys.readouterr().out.split())
