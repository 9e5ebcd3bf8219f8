"""The rollout dataset export: rows per second and peak memory as the number of rollouts grows.

The real export code (`sdk.export.write_dataset`: the streaming join of group and rollout items, result objects
read in threads, rows, group statistics, the Parquet writer, the dataset card) runs over an in-memory stand-in for
the ledger's two sorted Queries (no AWS, no moto: DynamoDB's speed is not what is measured) and a result reader
that builds each rollout's result object (about `--result-bytes` of JSON) on demand, as S3 GETs would return them.
Peak memory is measured twice: Python's allocations (tracemalloc) and Arrow's memory pool (`max_memory`). If the
export held a batch in memory, both would grow with the rollouts; streamed, they stay flat.

Usage: python bench/bench_export.py [--rollouts 20000,200000] [--group-size 8] [--result-bytes 2048]
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rollout_pipeline.ledger.items import GroupItem, RolloutRecord, RolloutState  # noqa: E402
from rollout_pipeline.sdk.export import write_dataset  # noqa: E402

BATCH = "bench-000000000000"
T0 = datetime(2026, 11, 1, tzinfo=UTC)


class StandInLedger:
    """What `write_dataset` reads of a `Ledger`: `groups.batch_groups(batch)` and `rollouts.batch_rollouts(batch)`,
    each a generator in sort-key order (input ids zero-padded, so their order is their number's)."""

    def __init__(self, groups: int, group_size: int) -> None:
        self.groups_n, self.group_size = groups, group_size
        self.groups = type("Groups", (), {"batch_groups": lambda _self, _batch: self._groups()})()
        self.rollouts = type("Rollouts", (), {"batch_rollouts": lambda _self, _batch: self._rollouts()})()

    def _groups(self) -> Iterator[GroupItem]:
        for g in range(self.groups_n):
            yield GroupItem(
                exp_id="bench",
                batch_id=BATCH,
                input_id=f"q{g:08d}",
                line=g + 1,
                group_size=self.group_size,
                payload={"question": f"{g % 10} + {g % 7}", "answer": str(g % 10 + g % 7)},
            )

    def _rollouts(self) -> Iterator[RolloutRecord]:
        for g in range(self.groups_n):
            # DynamoDB's order within a group: the index as text (0, 1, 10, 11, 2, ...)
            for index in sorted(range(self.group_size), key=str):
                failed = (g + index) % 17 == 0
                yield RolloutRecord(
                    batch_id=BATCH,
                    input_id=f"q{g:08d}",
                    index=index,
                    state=RolloutState.FAILED if failed else RolloutState.SUCCEEDED,
                    attempt=1,
                    exp_id="bench",
                    reward=None if failed else float((g * 7 + index) % 3 == 0),
                    reason="timeout" if failed else None,
                    error="deadline passed" if failed else None,
                    session_id=f"{BATCH}-{index}-1-{g:016x}",
                    result_uri=None if failed else f"s3://results/bench/q{g:08d}/{index}.json",
                    result_size=2048,
                    submitted_at=T0,
                    dispatched_at=T0 + timedelta(seconds=1),
                    finished_at=T0 + timedelta(seconds=5 + index),
                )


def results(result_bytes: int) -> Any:
    """A result object per URI, its `response` `result_bytes` of hex text that does not compress away."""

    def fetch(uri: str) -> dict[str, Any]:
        seed = hashlib.sha256(uri.encode()).hexdigest()
        text = (seed * (result_bytes // len(seed) + 1))[:result_bytes]
        return {"status_code": 200, "stop_reason": "end_turn", "rewards": 1.0, "response": text, "uri": uri}

    return fetch


def run(rollouts: int, group_size: int, result_bytes: int, *, trace: bool) -> dict[str, float]:
    """One export of `rollouts` rollouts; with `trace`, Python's allocations are traced (slower: rates come from the
    untraced run)."""
    import pyarrow as pa

    pool = pa.default_memory_pool()
    ledger = StandInLedger(max(1, rollouts // group_size), group_size)
    with tempfile.TemporaryDirectory() as tmp:
        if trace:
            tracemalloc.start()
        start = time.perf_counter()
        export = write_dataset(
            ledger,  # type: ignore[arg-type]
            exp_id="bench",
            batch_ids=[BATCH],
            directory=Path(tmp) / "ds",
            fetch=results(result_bytes),
            result_fields=("response",),
        )
        elapsed = time.perf_counter() - start
        python_peak = tracemalloc.get_traced_memory()[1] if trace else 0
        tracemalloc.stop()
        size = sum(p.stat().st_size for p in (Path(tmp) / "ds" / "data").glob("*.parquet"))
    return {
        "rows": export.rows,
        "seconds": elapsed,
        "python_peak_mib": python_peak / 2**20,
        "arrow_peak_mib": pool.max_memory() / 2**20,
        "file_mib": size / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", default="20000,200000", help="comma-separated sizes (default 20000,200000)")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--result-bytes", type=int, default=2048, help="size of each result object's text field")
    args = parser.parse_args()
    print(f"rollout dataset export: group size {args.group_size}, results ~{args.result_bytes} B each, one batch")
    run(args.group_size * 10, args.group_size, args.result_bytes, trace=False)  # warm-up: imports, first allocations
    for size in (int(s) for s in args.rollouts.split(",")):
        speed = run(size, args.group_size, args.result_bytes, trace=False)
        memory = run(size, args.group_size, args.result_bytes, trace=True)
        rate = speed["rows"] / speed["seconds"]
        print(
            f"{speed['rows']:>8.0f} rollouts: {speed['seconds']:6.1f} s ({rate:>6.0f} rows/s); "
            f"peak memory: Python {memory['python_peak_mib']:5.1f} MiB, Arrow pool {memory['arrow_peak_mib']:5.1f} MiB "
            f"(process max); file {speed['file_mib']:5.1f} MiB"
        )


if __name__ == "__main__":
    main()
