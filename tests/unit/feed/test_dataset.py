"""The rollout dataset without AWS: the ledger join in sort-key order, rows (failures never reward 0), group
statistics with the SDK's advantage formula, filters, reward checks, re-scoring, pass@k against hand computations,
the Parquet writer's bounded buffer, and docs/datasets.md against the schema constant."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from rollout_pipeline.contracts import GroupCompleted, grpo_advantages
from rollout_pipeline.ledger.items import GroupItem, RolloutRecord, RolloutState
from rollout_pipeline.sdk.dataset import (
    COLUMNS,
    COST_COLUMNS,
    RESCORE_COLUMNS,
    SCHEMA_VERSION,
    RowFilter,
    checked_rewards,
    group_rows,
    join_groups,
    result_field_columns,
    schema_columns,
)
from rollout_pipeline.sdk.groups import Group
from rollout_pipeline.sdk.rescore import Rescorer, load_reward_function
from rollout_pipeline.sdk.stats import batch_stats, parse_ks, pass_at_k

REPO = Path(__file__).resolve().parents[3]
B = "b-000000000001"
T0 = datetime(2026, 11, 1, tzinfo=UTC)


def group(input_id: str, size: int, **kwargs: object) -> GroupItem:
    return GroupItem(exp_id="e", batch_id=B, input_id=input_id, line=1, group_size=size, **kwargs)  # type: ignore[arg-type]


def done(
    input_id: str, index: int, reward: float | list[float] | None = None, reason: str | None = None
) -> RolloutRecord:
    ok = reason is None
    scalar = (reward[-1] if isinstance(reward, list) else reward) if ok else None
    return RolloutRecord(
        batch_id=B,
        input_id=input_id,
        index=index,
        state=RolloutState.SUCCEEDED if ok else RolloutState.FAILED,
        attempt=1,
        exp_id="e",
        reward=scalar,
        rewards=reward if ok else None,
        reason=reason,
        error=None if ok else "boom",
        session_id=f"s-{input_id}-{index}",
        result_uri=f"s3://r/e/{input_id}/{index}.json",
        dispatched_at=T0,
        finished_at=T0 + timedelta(seconds=2.5),
    )


# ------------------------------------------------------------------------------------------------------ join


def test_the_join_follows_dynamodb_sort_order_with_prefix_ids_and_two_digit_indices() -> None:
    """Sort keys are strings: `R#a#10` sorts before `R#a#2`, and `a` is a prefix of `a-b`, `a.b` and `a0`; the
    streaming join must still give every group exactly its own rollouts."""
    ids = ["a", "a-b", "a.b", "a0", "a:x", "b"]
    size = 12
    groups = sorted((group(i, size) for i in ids), key=lambda g: f"G#{g.input_id}")
    rollouts = sorted(
        (done(i, n, float(n)) for i in ids for n in range(size) if (i, n) != ("a.b", 3)),
        key=lambda r: f"R#{r.input_id}#{r.index}",
    )
    orphan = done("a-a", 0, 1.0)  # a rollout item without its group item: skipped
    rollouts.insert(next(k for k, r in enumerate(rollouts) if r.input_id == "a-b"), orphan)

    joined = list(join_groups(iter(groups), iter(rollouts)))

    assert [g.input_id for g, _ in joined] == ids
    for g, members in joined:
        expected = set(range(size)) - ({3} if g.input_id == "a.b" else set())
        assert set(members) == expected, g.input_id
        assert all(rec.input_id == g.input_id and rec.index == n for n, rec in members.items())


# ------------------------------------------------------------------------------------------------------ rows


def test_rows_carry_failures_with_their_reason_and_no_reward_and_the_sdks_advantages() -> None:
    g = group("q", 4, payload={"question": "1+1", "answer": "2"})
    members = {
        0: done("q", 0, 1.0),
        1: done("q", 1, [0.0, 0.5]),
        2: done("q", 2, reason="timeout"),
        3: done("q", 3, 0.0),
    }
    rows = group_rows(g, members, results={0: {"status_code": 200, "stop_reason": "end_turn", "rewards": 1.0}})

    assert [r["rollout_id"] for r in rows] == ["q#0", "q#1", "q#2", "q#3"]
    failed = rows[2]
    assert (failed["status"], failed["failure_reason"], failed["error"], failed["reward"]) == (
        "failed",
        "timeout",
        "boom",
        None,
    )
    assert failed["advantage"] is None
    assert rows[1]["reward"] == 0.5
    assert rows[1]["turn_rewards"] == [0.0, 0.5]
    assert rows[0]["turn_rewards"] is None
    # Hand computation over the successful rewards 1.0, 0.5, 0.0: mean 0.5, population std sqrt(1/6).
    std = math.sqrt(((0.5) ** 2 + 0 + (0.5) ** 2) / 3)
    assert rows[0]["group_reward_mean"] == pytest.approx(0.5)
    assert rows[0]["group_reward_std"] == pytest.approx(std)
    assert [r["advantage"] for r in rows] == pytest.approx([0.5 / (std + 1e-6), 0.0, None, -0.5 / (std + 1e-6)])
    completed = GroupCompleted.model_construct(rewards=[1.0, 0.5, None, 0.0])
    assert [r["advantage"] for r in rows] == Group(completed=completed).advantages(), "one formula"
    assert rows[0]["result_status_code"] == 200
    assert rows[0]["result_stop_reason"] == "end_turn"
    assert rows[1]["result_json"] is None
    assert rows[0]["payload_json"] == '{"question":"1+1","answer":"2"}'
    assert rows[0]["duration_s"] == 2.5
    assert set(rows[0]) == {c.name for c in (*COLUMNS, *COST_COLUMNS)}


def test_an_incomplete_group_has_no_statistics_and_its_unstarted_rollouts_are_queued() -> None:
    rows = group_rows(group("q", 3), {0: done("q", 0, 1.0), 1: done("q", 1, 0.0)})
    assert [r["status"] for r in rows] == ["succeeded", "succeeded", "queued"]
    assert {(r["group_complete"], r["group_reward_mean"], r["advantage"]) for r in rows} == {(False, None, None)}
    assert rows[2]["attempt"] is None


def test_grpo_advantages_of_a_group_without_successes_are_none() -> None:
    assert grpo_advantages([None, None]) == [None, None]
    assert grpo_advantages([2.0, 2.0]) == [0.0, 0.0]


# --------------------------------------------------------------------------------------------------- filters


def _group_of(*rewards: float | None) -> list[dict[str, object]]:
    members = {
        n: done("q", n, r) if r is not None else done("q", n, reason="agent_error") for n, r in enumerate(rewards)
    }
    return group_rows(group("q", len(rewards)), members)


def test_filters_keep_what_they_say_after_the_statistics_are_computed() -> None:
    mixed = _group_of(1.0, 0.0, None, 0.5)
    flat = _group_of(0.1, 0.1, 0.1)  # a float mean of equal values: no variance, whatever the std rounds to
    assert RowFilter(variance_only=True).keep(flat) == []
    assert RowFilter(variance_only=True).keep(mixed) == mixed
    assert RowFilter(variance_only=True).keep(_group_of(1.0, None)) == [], "one success: no spread"
    kept = RowFilter(succeeded_only=True).keep(mixed)
    assert [r["index"] for r in kept] == [0, 1, 3]
    assert kept[0]["advantage"] == mixed[0]["advantage"], "filters do not change advantages"
    assert [r["index"] for r in RowFilter(min_reward=0.5).keep(mixed)] == [0, 3]
    assert RowFilter().describe() == "none"
    assert (
        RowFilter(True, True, 0.5).describe()
        == "groups with reward variance only; succeeded rollouts only; reward >= 0.5"
    )
    with pytest.raises(ValueError, match="finite"):
        RowFilter(min_reward=math.nan)


def test_result_field_columns_are_checked() -> None:
    assert [c.name for c in result_field_columns(["response", "turns"])] == ["result_response", "result_turns"]
    for bad in (["json"], ["status_code"], ["a b"], ["_x"], ["response", "response"]):
        with pytest.raises(ValueError, match="result field"):
            result_field_columns(bad)
    names = [c.name for c in schema_columns(result_fields=["response"], rescored=True)]
    assert names[-len(RESCORE_COLUMNS) - 1 :] == ["result_response", *(c.name for c in RESCORE_COLUMNS)]


# -------------------------------------------------------------------------------------------------- rescore


def test_reward_values_are_checked_like_an_agents() -> None:
    assert checked_rewards(1) == 1.0
    assert checked_rewards((0, 1.5)) == [0.0, 1.5]
    for bad in (None, True, "1", [], [1, "x"], math.inf, 1e61):
        with pytest.raises(ValueError, match="expected a finite number"):
            checked_rewards(bad)


def test_rescoring_marks_the_rows_whose_function_raised_and_recomputes_the_advantages() -> None:
    g = group("q", 4, payload={"answer": "7"})
    members = {0: done("q", 0, 0.0), 1: done("q", 1, 0.0), 2: done("q", 2, 0.0), 3: done("q", 3, reason="timeout")}
    results = {0: {"response": "7"}, 1: {"response": "x"}, 2: {"response": None}, 3: {"status_code": 500}}
    rows = group_rows(g, members)

    def exact(row: dict[str, object], result: dict[str, object]) -> float:
        assert row["payload"] == {"answer": "7"}
        response = result["response"]
        if response is None:
            raise KeyError("no response")
        return 1.0 if response == "7" else 0.0

    rescorer = Rescorer(exact)  # type: ignore[arg-type]
    out = rescorer(rows, results)

    assert [r["reward"] for r in out] == [1.0, 0.0, None, None]
    assert [r["original_reward"] for r in out] == [0.0, 0.0, 0.0, None]
    assert out[2]["rescore_error"] == "KeyError: 'no response'"
    assert out[3]["rescore_error"] is None, "a failed rollout is not re-scored: not an error of the function"
    # Hand computation: new rewards 1.0 and 0.0 -> mean 0.5, std 0.5 -> advantages +-0.5 / (0.5 + 1e-6).
    assert [r["advantage"] for r in out] == pytest.approx([0.5 / 0.500001, -0.5 / 0.500001, None, None])
    assert [r["original_advantage"] for r in out] == [0.0, 0.0, 0.0, None]
    assert (rescorer.rescored, rescorer.failed) == (2, 1)
    assert rescorer.errors == {f"{B}/q#2": "KeyError: 'no response'"}


def test_reward_functions_load_by_module_or_file_with_one_line_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_rewards.py").write_text("def score(row, result):\n    return 2.0\nvalue = 3\n")
    monkeypatch.chdir(tmp_path)
    function, name = load_reward_function("my_rewards:score")
    assert function({}, {}) == 2.0
    assert name == "my_rewards:score"
    assert load_reward_function(f"{tmp_path / 'my_rewards.py'}:score")[0]({}, {}) == 2.0
    from rollout_pipeline.sdk.errors import SdkError

    for spec, message in [
        ("nocolon", "expected MODULE:FUNCTION"),
        ("no_such_module_xyz:f", "no module named 'no_such_module_xyz'"),
        ("my_rewards:missing", "has no 'missing'"),
        ("my_rewards:value", "is not a function"),
        ("nowhere/x.py:f", "no file nowhere/x.py"),
    ]:
        with pytest.raises(SdkError, match=re.escape(message)):
            load_reward_function(spec)


# ---------------------------------------------------------------------------------------------------- pass@k


def test_pass_at_k_matches_the_binomial_formula_by_hand() -> None:
    assert pass_at_k(4, 1, 1) == pytest.approx(1 / 4)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(8, 3, 4) == pytest.approx(1 - 5 / 70)  # 1 - C(5,4)/C(8,4)
    for n, c, k in [(3, 0, 4), (3, 4, 1), (3, 1, 0)]:
        with pytest.raises(ValueError, match="pass@k needs"):
            pass_at_k(n, c, k)
    assert parse_ks("8, 1,4,1") == (1, 4, 8)
    with pytest.raises(ValueError, match="not a positive integer"):
        parse_ks("1,0")


def test_batch_pass_at_k_averages_over_inputs_with_enough_samples() -> None:
    groups = [
        group("a", 4, terminal=4, rewards={0: 1.0, 1: 0.0, 2: 0.0, 3: 0.0}),  # c=1 of n=4
        group("b", 4, terminal=4, rewards={0: 1.0, 1: 1.0, 2: 0.5, 3: 0.0}),  # c=2 (0.5 is no pass at 1.0)
        group("c", 4, terminal=4, rewards={0: 0.0, 1: 0.0}, failures={2: "timeout", 3: "agent_error"}),  # n=2
        group("d", 4, terminal=1, rewards={0: 1.0}),  # incomplete: left out
    ]
    stats = batch_stats(B, groups, ks=(1, 2, 4))
    by_k = {p.k: p for p in stats.pass_at}
    assert by_k[1].value == pytest.approx((1 / 4 + 2 / 4 + 0 / 2) / 3)
    assert by_k[2].value == pytest.approx(((1 - 3 / 6) + (1 - 1 / 6) + 0.0) / 3)
    assert (by_k[4].value, by_k[4].inputs) == (pytest.approx(1.0), 2)  # c's n=2 < 4
    assert (stats.groups, stats.complete_groups, stats.groups_with_variance) == (4, 3, 2)
    assert (stats.succeeded, stats.failed) == (11, 2)

    as_failures = batch_stats(B, groups, ks=(4,), failures="fail", threshold=0.5)
    assert as_failures.pass_at[0].value == pytest.approx((1.0 + 1.0 + 0.0) / 3)  # c: n=4, c=0
    with pytest.raises(ValueError, match="failures must be one of"):
        batch_stats(B, groups, failures="maybe")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- Parquet file


def test_the_writer_holds_at_most_one_row_group_and_writes_as_it_goes(tmp_path: Path) -> None:
    import pyarrow.parquet as pq  # the `data` extra: `make setup` installs it (a missing extra fails, never skips)

    from rollout_pipeline.sdk.parquet import ParquetFileWriter, file_metadata

    path = tmp_path / "b.parquet"
    writer = ParquetFileWriter(
        path, COLUMNS, file_metadata("e", B, filters="none", rescored_with=None), batch_id=B, row_group_rows=5
    )
    most = 0
    for n in range(8):  # 8 groups of 3 rows
        writer.add(group_rows(group(f"q{n}", 3), {i: done(f"q{n}", i, float(i)) for i in range(3)}))
        most = max(most, writer.buffered_rows)
        assert not path.exists(), "the file appears only once complete"
    summary = writer.close()
    assert most < 5
    assert writer.row_groups == 5  # 24 rows: 4 full row groups of 5 written along the way, then the last 4
    meta = pq.ParquetFile(path).metadata
    assert (meta.num_rows, meta.num_row_groups, summary.rows) == (24, 5, 24)
    assert meta.metadata[b"rollout_pipeline.schema_version"] == SCHEMA_VERSION.encode()
    assert not list(tmp_path.glob("*.partial"))


def test_pyarrow_is_an_extra_never_in_the_lambda_bundle_and_the_library_imports_it_lazily() -> None:
    import subprocess
    import sys
    import tomllib

    from stacks.locks import LAMBDA_LOCK, lambda_requirements, read_pins

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert any(r.startswith("pyarrow") for r in pyproject["project"]["optional-dependencies"]["data"])
    assert not any("pyarrow" in r for r in lambda_requirements())
    assert not any(pin.name in ("pyarrow", "pandas", "polars", "datasets") for pin in read_pins(LAMBDA_LOCK))
    probe = (
        "import sys; import rollout_pipeline.sdk, rollout_pipeline.sdk.export, rollout_pipeline.sdk.parquet, "
        "rollout_pipeline.cli.data; print('pyarrow' in sys.modules)"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO)
    assert loaded.stdout.strip() == "False", "pyarrow is imported on first use only"


# ---------------------------------------------------------------------------------------------------- docs


def test_docs_list_every_column_with_its_type_and_the_schema_version() -> None:
    text = (REPO / "docs" / "datasets.md").read_text(encoding="utf-8")
    documented = dict(re.findall(r"^\| `([a-z_]+)` \| ([a-z0-9<>]+) \|", text, re.MULTILINE))
    for column in (*COLUMNS, *COST_COLUMNS, *RESCORE_COLUMNS):
        assert documented.get(column.name) == column.type, f"docs/datasets.md: column {column.name}"
    assert f"schema version **{SCHEMA_VERSION}**" in text
