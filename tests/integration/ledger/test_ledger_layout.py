"""The ledger's layout stamp (`keys.LAYOUT_VERSION`): what a function does when it meets a ledger of another layout
(fails loudly before touching it; never reads or writes items whose shape it does not know)."""

from __future__ import annotations

import importlib
import json
from typing import Any

import pytest

from rollout_pipeline.adapters import clients
from rollout_pipeline.ledger import keys
from rollout_pipeline.ledger.experiment import LayoutMismatch
from rollout_pipeline.ledger.ledger import Ledger
from rollout_pipeline.local.resources import ExperimentResources
from tests.conftest import receive_all


class FakeContext:
    function_name = "sweeper"
    memory_limit_in_mb = 256
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:sweeper"
    aws_request_id = "request-1"

    def get_remaining_time_in_millis(self) -> int:
        return 60_000


@pytest.fixture
def sweeper_handler(resources: ExperimentResources, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The sweeper Lambda as a container runs it: its stage built from the environment on first use."""
    import lambdas.sweeper

    for name, value in resources.settings().to_environ().items():
        monkeypatch.setenv(name, value)
    return importlib.reload(lambdas.sweeper)


def stamp(resources: ExperimentResources, version: int | None) -> None:
    ddb = clients.client("dynamodb")
    if version is None:
        ddb.delete_item(TableName=resources.table_name, Key=keys.layout_key())
    else:
        ddb.put_item(TableName=resources.table_name, Item=keys.layout_item(version))


def test_local_mode_stamps_its_ledger_as_the_stack_does(resources: ExperimentResources) -> None:
    ledger = Ledger.open(resources.table_name, clients.client("dynamodb"))
    assert ledger.experiment.layout_version() == keys.LAYOUT_VERSION
    ledger.experiment.require_layout()


@pytest.mark.parametrize("found", [None, keys.UNSTAMPED_LAYOUT, keys.LAYOUT_VERSION + 1])
def test_a_function_refuses_a_ledger_of_another_layout_before_touching_it(
    resources: ExperimentResources, sweeper_handler: Any, caplog: pytest.LogCaptureFixture, found: int | None
) -> None:
    """No stamp (a ledger from before layouts), an older or a newer one: the invocation fails with one clear
    message (logged as an error: the function's Errors alarm fires, its messages wait or dead-letter, nothing is
    misread), and nothing in the table changes."""
    stamp(resources, found)
    before = clients.client("dynamodb").scan(TableName=resources.table_name)["Items"]
    with pytest.raises(LayoutMismatch, match=f"this code reads and writes layout {keys.LAYOUT_VERSION}") as refused:
        sweeper_handler.handler({}, FakeContext())
    assert refused.value.found == found
    assert "docs/deploy.md, 'Upgrades'" in str(refused.value)
    assert any(
        record.levelname == "ERROR" and "refuses to touch it" in record.getMessage() for record in caplog.records
    )
    after = clients.client("dynamodb").scan(TableName=resources.table_name)["Items"]
    assert sorted(json.dumps(i, sort_keys=True) for i in after) == sorted(json.dumps(i, sort_keys=True) for i in before)

    stamp(resources, keys.LAYOUT_VERSION)  # the stack's stamp back in step: the next invocation works
    assert sweeper_handler.handler({}, FakeContext())["errors"] == []
    assert receive_all(resources.rollout_queue_url) == []


def test_the_legacy_single_counter_is_read_for_what_is_in_flight(resources: ExperimentResources) -> None:
    ledger = Ledger.open(resources.table_name, clients.client("dynamodb"))
    assert ledger.experiment.legacy_slots() == 0
    clients.client("dynamodb").put_item(
        TableName=resources.table_name, Item={**keys.legacy_sessions_key(), "in_flight": {"N": "3"}}
    )
    assert ledger.experiment.legacy_slots() == 3
