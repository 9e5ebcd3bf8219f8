"""`Experiment` as a facade of topics (docs/sdk.md): small, each flat name the verb of one topic and listed in the
docs, launch options told apart from settings in one place (`LaunchOptions`)."""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.ops.launch import SETTING_KEYS, plan
from rollout_pipeline.sdk import Experiment, SdkError
from rollout_pipeline.sdk import experiment as experiment_module
from rollout_pipeline.sdk.experiment import Alias
from rollout_pipeline.sdk.operations import LaunchOptions

REPO = Path(__file__).resolve().parents[3]
#: The most lines the class may take (docstring, topics and flat names included).
MAX_FACADE_LINES = 600
#: The stack outputs of an experiment `x` (nothing is read from AWS here).
OUTPUTS = {
    "ExperimentName": "x",
    "ExperimentConfig": ExperimentConfig(name="x", model_base_url="https://models.example.org/v1").to_env(),
    "InputBucketName": "rollouts-x-input",
    "ResultsBucketName": "rollouts-x-results",
    "RolloutQueueUrl": "https://sqs.us-east-1.amazonaws.com/123456789012/rollouts-x-rollouts",
    "TrainerQueueUrl": "https://sqs.us-east-1.amazonaws.com/123456789012/rollouts-x-trainer",
    "EventBusName": "rollouts-x",
    "LedgerTableName": "rollouts-x-ledger",
}


def test_the_facade_stays_small() -> None:
    tree = ast.parse((REPO / "rollout_pipeline/sdk/experiment.py").read_text(encoding="utf-8"))
    (facade,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Experiment"]
    assert facade.end_lineno is not None
    assert facade.end_lineno - facade.lineno + 1 <= MAX_FACADE_LINES


def aliases() -> dict[str, Alias[Any, Any, Any]]:
    return {name: value for name, value in vars(Experiment).items() if isinstance(value, Alias)}


def test_each_flat_name_is_the_verb_of_its_topic() -> None:
    exp = Experiment(OUTPUTS, region="us-east-1")
    assert aliases()
    for name, alias in aliases().items():
        topic = getattr(exp, alias.topic)
        assert getattr(type(topic), alias.verb.__name__) is alias.verb, name
        bound = getattr(exp, name)
        assert bound.__self__ is topic, name
        assert bound.__func__ is alias.verb, name
        assert str(alias.__doc__).startswith(f"`exp.{alias.topic}.{alias.verb.__name__}`")


def test_docs_list_every_flat_name_with_its_topic_verb() -> None:
    """docs/sdk.md's "Flat names" table is the list users read: one row per alias, naming the verb it calls."""
    text = (REPO / "docs/sdk.md").read_text(encoding="utf-8")
    section = text.split("### Flat names", 1)[1].split("\n#", 1)[0]
    rows = dict(re.findall(r"^\| `exp\.(\w+)\(` \| `exp\.(\w+\.\w+)\(` \|", section, flags=re.MULTILINE))
    assert rows == {name: f"{alias.topic}.{alias.verb.__name__}" for name, alias in aliases().items()}


class RecordingOperations:
    """Stands in for the operator code: records what `Experiment.launch` hands it."""

    def __init__(self) -> None:
        self.launched: list[tuple[str, str, Mapping[str, Any], LaunchOptions]] = []

    def launch(self, name: str, mode: str, settings: Mapping[str, Any], options: LaunchOptions) -> str:
        self.launched.append((name, mode, dict(settings), options))
        return "attached"


def test_launch_tells_its_options_from_the_experiments_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    operator = RecordingOperations()
    monkeypatch.setattr(experiment_module, "operations", lambda: operator)
    local = {"agent_module": "my_agent"}
    assert Experiment.launch("x", "local", yes=True, group_size=2, local_options=local, max_sessions=4) == "attached"
    assert operator.launched == [
        ("x", "local", {"group_size": 2, "max_sessions": 4}, LaunchOptions(yes=True, local_options=local))
    ]
    assert not hasattr(Experiment, "deploy"), "one name for launching: Experiment.launch"


@pytest.mark.parametrize(
    ("given", "error"),
    [
        ({"yes": "y"}, r"yes is True or False \(got 'y'\)"),
        ({"force": 1}, r"force is True or False \(got 1\)"),
        ({"local_options": "agent_module=x"}, r"local_options must be a dict of local mode's settings.*\(got str\)"),
    ],
)
def test_a_bad_launch_option_is_one_clear_error(given: dict[str, Any], error: str) -> None:
    with pytest.raises(SdkError, match=error):
        LaunchOptions.split(given)


def test_an_unknown_keyword_names_the_settings_and_the_launch_options() -> None:
    with pytest.raises(SdkError, match=r"unknown setting\(s\) yess: .*launch's options yes, force, region"):
        plan("x", {"yess": True}, None)


def test_no_setting_shares_a_name_with_a_launch_option() -> None:
    """`Experiment.launch` tells them apart by name: a setting named like an option would never reach the stack."""
    assert set(SETTING_KEYS) & set(LaunchOptions.names()) == set()
