"""The rollout dataset over moto, end to end: a batch run through the lifecycle (fake ACR: a failing member, per-turn
rewards, extra result fields) is exported to Parquet and read back as users read it (pyarrow, pandas, polars, the
Hugging Face `datasets` Parquet loader and its directory loader), one row per rollout, failures with their reasons
and never reward 0; several batches at once, streamed row group by row group; filters; re-scoring with a reward
function in a module file (hand-computed rewards and advantages, rows whose function raised reported, ledger,
buckets and events untouched, no agent run); `rollouts stats --pass-k` against a hand computation."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa  # the `data` extra: `make setup` installs it; a missing extra fails here, never skips
import pyarrow.parquet as pq
import pytest

from rollout_pipeline.adapters import clients
from rollout_pipeline.cli import EXIT_ERROR, EXIT_OK, EXIT_USAGE, main
from rollout_pipeline.fakes.acr import AgentBehaviour, Behaviour, FakeAgentRuntime, FakeInvocation
from rollout_pipeline.lifecycle.deps import LifecycleDeps
from rollout_pipeline.local.resources import ExperimentResources
from rollout_pipeline.sdk import BatchNotFound, Experiment, SdkError
from rollout_pipeline.sdk.dataset import COLUMNS, COST_COLUMNS, RESCORE_COLUMNS, SCHEMA_VERSION
from tests.conftest import REGION
from tests.integration.conftest import queue_depth
from tests.integration.lifecycle_support import drive, moto_lock  # noqa: F401 - fixture

pytestmark = pytest.mark.usefixtures("moto_lock")

#: What each input's rollouts return: a reward (or per-turn list), or None for an agent error.
OUTCOMES: dict[str, list[Any]] = {
    "q1": [1.0, 0.0],
    "q2": [[0.0, 1.0], [0.5, 0.0]],  # per-turn: scalar rewards 1.0 and 0.0
    "q3": [1.0, None],
    "q4": [0.0, 0.0],
}
ANSWERS = {"q1": "7", "q2": "3", "q3": "5", "q4": "9"}
#: What the agent "said" (a result field the re-scoring function reads).
RESPONSES = {("q1", 0): "7", ("q1", 1): "8", ("q2", 0): "3", ("q2", 1): "3", ("q3", 0): "oops", ("q4", 0): "9"}
EPS = 1e-6


def behaviour(inv: FakeInvocation) -> AgentBehaviour:
    q, index = inv.payload["q"], inv.payload["_rollout"]["index"]
    outcome = OUTCOMES[q][index]
    if outcome is None:
        return AgentBehaviour(kind="agent_error", error="tool exploded")
    return AgentBehaviour(rewards=outcome, extra={"response": RESPONSES.get((q, index)), "turns": 2})


@pytest.fixture
def fake_behaviour() -> Behaviour:
    return behaviour


def run_batch(experiment: Experiment, resources: ExperimentResources, deps: LifecycleDeps) -> str:
    batch_id = experiment.submit([{"id": q, "q": q, "answer": a} for q, a in ANSWERS.items()], group_size=2)
    drive(resources, deps)
    assert experiment.status(batch_id).done
    return batch_id


@pytest.fixture
def batch(experiment: Experiment, resources: ExperimentResources, deps: LifecycleDeps) -> str:
    return run_batch(experiment, resources, deps)


@pytest.fixture
def cli(resources: ExperimentResources, tmp_path: Path) -> list[str]:
    """The common CLI options of this experiment (its outputs file: no CloudFormation needed)."""
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps(resources.stack_outputs()))
    return ["--outputs-file", str(outputs), "--region", REGION]


def by_rollout(table: Any) -> dict[str, dict[str, Any]]:
    return {row["rollout_id"]: row for row in table.to_pylist()}


def experiment_jsonl(experiment: Experiment, batch: str, path: Path) -> list[dict[str, Any]]:
    experiment.export(batch, path)
    return [json.loads(line) for line in path.read_text().splitlines()]


def grpo(rewards: list[float | None]) -> list[float | None]:
    """The advantage by hand: (r - mean) / (population std + 1e-6) over the successful rewards."""
    values = [r for r in rewards if r is not None]
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return [None if r is None else (r - mean) / (std + EPS) for r in rewards]


# ---------------------------------------------------------------------------------------------------- export


def test_a_batch_exported_to_parquet_reads_back_with_every_reader(
    experiment: Experiment, batch: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "ds"
    export = experiment.export_dataset(batch, out, result_fields=["response"])
    assert (export.rows, export.rows_by_batch) == (8, {batch: 8})
    data = out / "data" / f"{batch}.parquet"
    assert export.files == [str(data)]

    table = pq.read_table(data)
    assert table.num_rows == 8, "one row per rollout"
    assert table.schema.names == [*(c.name for c in (*COLUMNS, *COST_COLUMNS)), "result_response"]
    assert table.schema.field("reward").type == pa.float64()
    assert table.schema.field("finished_at").type == pa.timestamp("us", tz="UTC")
    assert table.schema.metadata[b"rollout_pipeline.schema_version"] == SCHEMA_VERSION.encode()
    rows = by_rollout(table)
    assert len(rows) == 8
    failed = rows["q3#1"]
    assert (failed["status"], failed["failure_reason"], failed["reward"], failed["advantage"]) == (
        "failed",
        "agent_error",
        None,
        None,
    )
    assert "tool exploded" in failed["error"]
    assert failed["result_status_code"] == 500, "the agent's error result is kept"
    assert rows["q2#0"]["turn_rewards"] == [0.0, 1.0]
    assert rows["q2#0"]["reward"] == 1.0
    assert rows["q1#0"]["result_response"] == "7"
    assert json.loads(rows["q1#0"]["result_json"])["rewards"] == 1.0
    assert json.loads(rows["q1#0"]["payload_json"]) == {"q": "q1", "answer": "7"}
    assert [rows["q1#0"]["advantage"], rows["q1#1"]["advantage"]] == pytest.approx(grpo([1.0, 0.0]))
    assert [rows["q3#0"]["advantage"], rows["q3#1"]["advantage"]] == [0.0, None]
    assert {rows[f"q4#{i}"]["advantage"] for i in range(2)} == {0.0}
    assert all(r["group_complete"] and r["session_id"] and r["attempt"] == 1 for r in rows.values())
    # What each rollout cost, as its event carried it (the JSON Lines export's `cost`, priced the same way).
    costs = {line["rollout_id"]: line["cost"] for line in experiment_jsonl(experiment, batch, tmp_path / "x.jsonl")}
    for rollout_id, row in rows.items():
        cost = costs[rollout_id]
        assert cost is not None, rollout_id
        assert row["cost_usd"] == cost["usd"] > 0, rollout_id
        assert row["cost_agentcore_usd"] == pytest.approx(cost["agentcore_memory_usd"] + cost["agentcore_cpu_usd"])
        assert (row["cost_session_end"], row["cost_priced_as"]) == (cost["session_end"], cost["priced_as"])
    assert failed["cost_usd"] is not None, "a failed rollout cost something too"

    import pandas as pd
    import polars as pl

    frame = pd.read_parquet(out / "data")
    assert len(frame) == 8
    assert frame.loc[frame.rollout_id == "q3#1", "reward"].isna().all(), "a failure is not reward 0"
    assert (frame.status == "failed").sum() == 1
    polars_frame = pl.read_parquet(out / "data" / "*.parquet")
    assert polars_frame.height == 8
    assert polars_frame.filter(pl.col("status") == "failed")["failure_reason"].to_list() == ["agent_error"]

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    import datasets

    loaded = datasets.load_dataset(
        "parquet", data_files=str(out / "data" / "*.parquet"), cache_dir=str(tmp_path / "hf-cache")
    )["train"]
    assert loaded.num_rows == 8
    hf_rows = {r["rollout_id"]: r for r in loaded}
    assert hf_rows["q3#1"]["reward"] is None
    assert hf_rows["q3#1"]["failure_reason"] == "agent_error"
    assert hf_rows["q2#0"]["turn_rewards"] == [0.0, 1.0]
    by_card = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "hf-cache-2"))["train"]
    assert by_card.num_rows == 8, "the dataset card's `configs` points the loader at data/"

    card = (out / "README.md").read_text()
    assert card.startswith("---\nconfigs:")
    assert f"| `{batch}` | 8 | 7 | 1 (agent_error 1) | 0 |" in card
    assert "| `failure_reason` | string |" in card


def test_several_batches_and_every_batch_stream_row_group_by_row_group(
    experiment: Experiment, resources: ExperimentResources, deps: LifecycleDeps, batch: str, tmp_path: Path
) -> None:
    second = run_batch(experiment, resources, deps)
    both = experiment.export_dataset([batch, second], tmp_path / "two")
    assert both.rows_by_batch == {batch: 8, second: 8}
    everything = experiment.export_dataset(None, tmp_path / "all")
    assert everything.rows_by_batch == {batch: 8, second: 8}, "every batch, oldest first"

    # Row groups are written while the ledger is still being read: never the whole batch in memory.
    from rollout_pipeline.sdk import parquet
    from rollout_pipeline.sdk.export import write_dataset

    ledger = experiment.wiring().ledger()
    consumed: list[str] = []
    flushed_after: list[int] = []
    groups = ledger.groups.batch_groups

    def counted_groups(batch_id: str) -> Iterator[Any]:
        for group in groups(batch_id):
            consumed.append(group.input_id)
            yield group

    original_flush = parquet.ParquetFileWriter._flush

    def flush(self: parquet.ParquetFileWriter) -> None:
        if self.buffered_rows:
            flushed_after.append(len(consumed))
        original_flush(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ledger.groups, "batch_groups", counted_groups)
        patch.setattr(parquet.ParquetFileWriter, "_flush", flush)
        streamed = write_dataset(
            ledger,
            exp_id=experiment.name,
            batch_ids=[batch],
            directory=tmp_path / "streamed",
            fetch=experiment.fetch_result,
            row_group_rows=2,
            chunk_rollouts=2,
        )
    assert streamed.rows == 8
    assert pq.ParquetFile(tmp_path / "streamed" / "data" / f"{batch}.parquet").metadata.num_row_groups == 4
    assert flushed_after[0] < len(ANSWERS), "the first row group was written before every group was read"


def test_filters_and_the_cli(experiment: Experiment, batch: str, cli: list[str], tmp_path: Path) -> None:
    def exported(*options: str) -> dict[str, dict[str, Any]]:
        out = tmp_path / "f"
        code = main(["export", *cli, "--batch", batch, "--format", "parquet", "-o", str(out), "--overwrite", *options])
        assert code == EXIT_OK
        return by_rollout(pq.read_table(out / "data"))

    assert sorted(exported("--variance-only")) == ["q1#0", "q1#1", "q2#0", "q2#1"]
    assert len(exported("--succeeded-only")) == 7
    kept = exported("--min-reward", "1")
    assert sorted(kept) == ["q1#0", "q2#0", "q3#0"]
    assert kept["q1#0"]["advantage"] == pytest.approx(grpo([1.0, 0.0])[0]), "computed over the whole group"
    assert "filters: reward >= 1" in (tmp_path / "f" / "README.md").read_text().lower()

    # The same through `Experiment.export(format=...)`.
    assert experiment.export(batch, tmp_path / "p", format="parquet", succeeded_only=True) == 7
    with pytest.raises(SdkError, match="variance_only: only with format='parquet'"):
        experiment.export(batch, tmp_path / "x.jsonl", variance_only=True)
    with pytest.raises(SdkError, match="format must be jsonl or parquet"):
        experiment.export(batch, tmp_path / "x.csv", format="csv")


def test_cli_errors_are_one_line(
    experiment: Experiment, cli: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    batch = experiment.submit([{"id": "q1", "q": "q1"}], group_size=2)  # queued: enough to export
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x.txt").write_text("keep me")
    cases = [
        (["--batch", batch, "--format", "parquet", "-o", str(tmp_path / "full")], "is not empty (x.txt)"),
        (["--batch", batch, "--format", "parquet"], "--format parquet writes a directory: pass -o DIR"),
        (["--batch", batch, "--variance-only"], "--variance-only: only with --format parquet"),
        (["--batch", "nope-000000000000", "--format", "parquet", "-o", str(tmp_path / "n")], "no batch"),
        (["--batch", batch, "--format", "parquet", "-o", str(tmp_path / "r"), "--result-field", "json"], "exists"),
    ]
    for options, message in cases:
        assert main(["export", *cli, *options]) == EXIT_ERROR, options
        err = capsys.readouterr().err
        assert message in err, err
        assert "Traceback" not in err
    assert (tmp_path / "full" / "x.txt").read_text() == "keep me"
    assert main(["export", *cli, "--format", "parquet", "-o", str(tmp_path / "x")]) == EXIT_USAGE  # no batch


# --------------------------------------------------------------------------------------------------- rescore

REWARD_MODULE = '''
import json

def exact(row, result):
    """1 when the agent's response is the row's answer (from the payload); raises on q3#0, whose response is not
    a number, to show a row marked without stopping the run."""
    if result.get("response") == "oops":
        raise ValueError("response is not a number")
    return 1.0 if result.get("response") == row["payload"]["answer"] else 0.0
'''


def _ledger_items(resources: ExperimentResources) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for page in clients.client("dynamodb").get_paginator("scan").paginate(TableName=resources.table_name):
        items += page["Items"]
    return sorted(items, key=lambda item: (item["pk"]["S"], item["sk"]["S"]))


def _objects(bucket: str) -> list[tuple[str, str]]:
    listed = clients.client("s3").list_objects_v2(Bucket=bucket).get("Contents") or []
    return sorted((o["Key"], o["ETag"]) for o in listed)


def test_rescoring_gives_the_expected_rewards_and_advantages_and_changes_nothing(
    experiment: Experiment,
    resources: ExperimentResources,
    fake: FakeAgentRuntime,
    batch: str,
    cli: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    module = tmp_path / "my_rewards.py"
    module.write_text(REWARD_MODULE)
    ledger_before = _ledger_items(resources)
    results_before = _objects(resources.results_bucket)
    queued_events = queue_depth(resources.trainer_queue_url)
    invocations = len(fake.invocations())

    out = tmp_path / "rescored"
    assert main(["rescore", *cli, "--batch", batch, "--reward", f"{module}:exact", "-o", str(out)]) == EXIT_OK
    printed = capsys.readouterr().out
    assert "re-scored 6 rollout(s)" in printed
    assert "the function failed on 1 row(s)" in printed
    assert f"{batch}/q3#0: ValueError: response is not a number" in printed

    table = pq.read_table(out / "data")
    assert table.schema.names[-len(RESCORE_COLUMNS) :] == [c.name for c in RESCORE_COLUMNS]
    assert table.schema.metadata[b"rollout_pipeline.rescored_with"] == f"{module}:exact".encode()
    rows = by_rollout(table)
    # By hand: q1 responses 7 (right), 8 -> [1, 0]; q2 3, 3 (both right) -> [1, 1]; q3#0 raised, q3#1 failed;
    # q4#0 right, q4#1 has no response -> [1, 0].
    expected = {"q1": [1.0, 0.0], "q2": [1.0, 1.0], "q3": [None, None], "q4": [1.0, 0.0]}
    for q, rewards in expected.items():
        assert [rows[f"{q}#{i}"]["reward"] for i in range(2)] == rewards, q
    assert [rows[f"q1#{i}"]["original_reward"] for i in range(2)] == [1.0, 0.0]
    assert [rows[f"q2#{i}"]["original_reward"] for i in range(2)] == [1.0, 0.0]
    assert [rows[f"q4#{i}"]["original_reward"] for i in range(2)] == [0.0, 0.0]
    assert rows["q2#0"]["original_turn_rewards"] == [0.0, 1.0]
    assert rows["q2#0"]["turn_rewards"] is None
    assert [rows[f"q4#{i}"]["advantage"] for i in range(2)] == pytest.approx(grpo([1.0, 0.0]))  # was 0, 0
    assert [rows[f"q4#{i}"]["original_advantage"] for i in range(2)] == [0.0, 0.0]
    assert [rows[f"q2#{i}"]["advantage"] for i in range(2)] == [0.0, 0.0]  # was +-1
    assert rows["q4#0"]["group_reward_mean"] == 0.5
    assert rows["q3#0"]["rescore_error"] == "ValueError: response is not a number"
    assert (rows["q3#0"]["status"], rows["q3#1"]["status"]) == ("succeeded", "failed")
    assert rows["q3#1"]["rescore_error"] is None
    assert rows["q3#1"]["failure_reason"] == "agent_error"
    assert [rows[f"q3#{i}"]["advantage"] for i in range(2)] == [None, None]

    assert _ledger_items(resources) == ledger_before, "no ledger item changed"
    assert _objects(resources.results_bucket) == results_before, "no result object changed"
    assert queue_depth(resources.trainer_queue_url) == queued_events, "no event was published"
    assert len(fake.invocations()) == invocations, "no agent ran"

    # From Python, with a function object; one that fails on every row makes the CLI exit 1.
    export = experiment.rescore(batch, lambda row, result: [0.0, float(row["index"])], tmp_path / "py")
    assert (export.rescored, export.failed) == (7, 0)
    assert by_rollout(pq.read_table(tmp_path / "py" / "data"))["q1#1"]["turn_rewards"] == [0.0, 1.0]
    module.write_text("def broken(row, result):\n    return 'high'\n")
    code = main(["rescore", *cli, "--batch", batch, "--reward", f"{module}:broken", "-o", str(tmp_path / "b")])
    assert code == EXIT_ERROR
    captured = capsys.readouterr()
    assert "returned 'high' (str)" in captured.out
    assert "failed on every row" in captured.err
    with pytest.raises(SdkError, match="has no 'nothing'"):
        experiment.rescore(batch, f"{module}:nothing", tmp_path / "c")


# ---------------------------------------------------------------------------------------------------- pass@k


def test_stats_pass_at_k_matches_a_hand_computation(
    experiment: Experiment, batch: str, cli: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["stats", *cli, "--batch", batch, "--pass-k", "1,2"]) == EXIT_OK
    out = capsys.readouterr().out
    # Passing (reward >= 1): q1 1 of 2, q2 1 of 2, q3 1 of 1 (its failure is no sample), q4 0 of 2.
    # pass@1 = (1/2 + 1/2 + 1 + 0) / 4 = 0.5; pass@2 over the inputs with n >= 2 (q1, q2, q4):
    # q1, q2: 1 - C(1,2)/C(2,2) = 1; q4: 0 -> 2/3.
    assert "pass@1    0.5000  over 4 input(s)" in out
    assert "pass@2    0.6667  over 3 input(s)" in out
    assert "a sample passes when reward >= 1; failed rollouts are not samples" in out
    assert "variance   2 of 4 complete group(s)" in out

    assert main(["stats", *cli, "--batch", batch, "--pass-k", "2", "--failures", "fail", "--json"]) == EXIT_OK
    stats = json.loads(capsys.readouterr().out)
    assert stats["pass_at_k"]["2"] == {"value": pytest.approx(0.75), "inputs": 4}  # q3 now n=2, c=1 -> 1
    assert main(["stats", *cli, "--batch", batch, "--pass-k", "0"]) == EXIT_ERROR
    assert "--pass-k: '0'" in capsys.readouterr().err
    with pytest.raises(BatchNotFound):
        experiment.stats("nope-000000000000")


def test_a_payload_stored_aside_reaches_the_reward_function(
    experiment: Experiment, resources: ExperimentResources, deps: LifecycleDeps, tmp_path: Path
) -> None:
    from rollout_pipeline.contracts import CLAIM_CHECK_BYTES

    batch_id = experiment.submit(
        [{"id": "q1", "q": "q1", "answer": "7", "context": "x" * (CLAIM_CHECK_BYTES + 10)}], group_size=2
    )
    drive(resources, deps)
    seen: list[Any] = []

    def reward(row: Any, result: Any) -> float:
        seen.append(row["payload"]["answer"])
        return 1.0

    export = experiment.rescore(batch_id, reward, tmp_path / "big")
    assert (export.rescored, seen) == (2, ["7", "7"])
    row = by_rollout(pq.read_table(tmp_path / "big" / "data"))["q1#0"]
    assert row["payload_json"] is None
    assert row["payload_ref"].startswith("s3://")


def test_a_failed_export_leaves_nothing_that_blocks_the_retry(
    experiment: Experiment, batch: str, tmp_path: Path
) -> None:
    """An export that fails (here the Parquet writer, as when pyarrow is missing) removes what it made, so the same
    command runs again without `--overwrite`."""
    from rollout_pipeline.sdk import parquet

    target = tmp_path / "retry"

    def missing(*args: Any, **kwargs: Any) -> None:
        raise ImportError("No module named 'pyarrow'")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(parquet, "ParquetFileWriter", missing)
        with pytest.raises(ImportError):
            experiment.export_dataset([batch], target)
    assert not target.exists()
    assert experiment.export_dataset([batch], target).rows == 8
