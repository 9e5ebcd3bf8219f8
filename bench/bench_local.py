"""Local mode under the faithful AWS profile with the fake ACR: throughput as the ledger fills, and big runs.

What runs: `LocalPipeline` (moto server, the Lambda handlers as queue consumers, the sweeper) with
`aws_profile="faithful"` and the fake ACR (no model, no agent processes). The ledger is padded with inert items
of another batch partition up to each `--ledger-sizes` value, then a batch of `--rows` x `--group-size` rollouts
is uploaded as a file and timed from upload to `Batch Completed`. Printed per size: rollouts/s, and at the end
lost / dead-lettered counts, conflict retries per 1,000 rollouts and the busiest ledger items' write rates.

Usage: python bench/bench_local.py [--ledger-sizes 1000,10000,50000] [--rows 100] [--group-size 4]
       python bench/bench_local.py --ledger-sizes 0 --rows 100000 --group-size 1   # a 100k-row ingest
       python bench/bench_local.py --moto-ops 200   # only the moto server: median ms per ledger call, per size
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MAX_ROWS = 200_000


def pad_ledger(table: str, current: int, target: int) -> int:
    """Write inert items until the table holds about `target` items; return the new count."""
    from rollout_pipeline.adapters import clients

    ddb = clients.client("dynamodb")
    while current < target:
        n = min(25, target - current)
        requests = [
            {"PutRequest": {"Item": {"pk": {"S": "B#padding"}, "sk": {"S": f"R#pad#{current + i}"}, "x": {"N": "1"}}}}
            for i in range(n)
        ]
        ddb.batch_write_item(RequestItems={table: requests})
        current += n
    return current


def time_moto_ops(sizes: list[int], repeats: int) -> int:
    """Median server time of the ledger's kinds of DynamoDB call on local mode's moto server, per ledger size.

    No pipeline: one loopback moto server (as local mode starts it), the ledger table, a live batch partition of
    500 rollout items (125 of them in each of 4 deadline-index shards) and the inert padding of `pad_ledger`.
    """
    import statistics

    from rollout_pipeline.adapters import clients
    from rollout_pipeline.ledger import keys
    from rollout_pipeline.ledger.schema import create_table_kwargs
    from rollout_pipeline.local.moto_server import local_aws_environ, moto_server, patched_environ

    table = "bench-ledger"
    with moto_server() as endpoint, patched_environ(local_aws_environ(endpoint, "us-east-1")):
        clients.reset()
        ddb = clients.client("dynamodb")
        ddb.create_table(**create_table_kwargs(table))
        live = [
            {
                **keys.rollout_key("live", f"q{i // 4}", i % 4),
                keys.DEADLINE_PK: {"S": f"DL#{i % keys.INDEX_SHARDS}"},
                keys.DEADLINE_SK: {"N": str(i)},
                "state": {"S": "DISPATCHED"},
            }
            for i in range(500)
        ]
        for start in range(0, len(live), 25):
            ddb.batch_write_item(RequestItems={table: [{"PutRequest": {"Item": i}} for i in live[start : start + 25]]})
        counter = {**keys.batch_key("live")}
        calls: dict[str, Any] = {
            "GetItem": lambda: ddb.get_item(TableName=table, Key=counter, ConsistentRead=True),
            "UpdateItem": lambda: ddb.update_item(
                TableName=table,
                Key=counter,
                UpdateExpression="ADD n :one",
                ExpressionAttributeValues={":one": {"N": "1"}},
            ),
            "Transact2": lambda: ddb.transact_write_items(
                TransactItems=[
                    {
                        "Update": {
                            "TableName": table,
                            "Key": key,
                            "UpdateExpression": "ADD n :one",
                            "ExpressionAttributeValues": {":one": {"N": "1"}},
                        }
                    }
                    for key in (counter, keys.session_shard_key(0))
                ]
            ),
            "QueryIndex": lambda: ddb.query(
                TableName=table,
                IndexName=keys.DEADLINE_INDEX,
                KeyConditionExpression="#p = :p AND #s < :s",
                ExpressionAttributeNames={"#p": keys.DEADLINE_PK, "#s": keys.DEADLINE_SK},
                ExpressionAttributeValues={":p": {"S": "DL#0"}, ":s": {"N": "1000"}},
                Limit=50,
            ),
            "QueryTable": lambda: ddb.query(
                TableName=table,
                KeyConditionExpression="pk = :p AND begins_with(sk, :r)",
                ExpressionAttributeValues={":p": {"S": keys.batch_pk("live")}, ":r": {"S": keys.ROLLOUT_PREFIX}},
                ConsistentRead=True,
                Limit=100,
            ),
        }
        items = 500
        print(f"moto server ops, median ms of {repeats} calls (load average {os.getloadavg()[0]:.1f})", flush=True)
        print(f"{'ledger items':>14}  " + "  ".join(f"{name:>12}" for name in calls))
        for size in sizes:
            items = pad_ledger(table, items, size)
            medians = []
            for call in calls.values():
                took = []
                for _ in range(repeats):
                    started = time.perf_counter()
                    call()
                    took.append(time.perf_counter() - started)
                medians.append(1000 * statistics.median(took))
            print(f"{items:>14}  " + "  ".join(f"{m:>12.2f}" for m in medians), flush=True)
        print(
            "Transact2: TransactWriteItems of 2 updates; QueryIndex: a deadline-index shard as the sweeper reads it "
            "(Limit 50); QueryTable: the live batch partition's first page of rollouts (Limit 100)"
        )
    return 0


def run_batch(pipeline: Any, rows: int, group_size: int, timeout_s: float, tag: str) -> tuple[float, dict[str, Any]]:
    """Upload one dataset and wait for its `Batch Completed`; return (seconds, its detail)."""
    from rollout_pipeline.contracts import DetailType

    path = Path(tempfile.mkdtemp()) / f"bench-{tag}.jsonl"
    path.write_text("".join(json.dumps({"id": f"{tag}-{i}", "q": i}) + "\n" for i in range(rows)))
    started = time.monotonic()
    batch_id = pipeline.experiment.batches.submit_file(path, group_size=group_size)
    # consume_others: events of an earlier batch that arrive after its `Batch Completed` are taken here, as a
    # trainer reading every event would, instead of being released until the trainer queue dead-letters them.
    for event in pipeline.experiment.events(batch_id=batch_id, timeout=timeout_s, consume_others=True):
        if event.detail_type is DetailType.BATCH_COMPLETED:
            return time.monotonic() - started, event.detail.model_dump(mode="json")
    raise TimeoutError(f"batch {batch_id} did not complete within {timeout_s} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ledger-sizes", default="1000,10000,50000")
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-sessions", type=int, default=50)
    parser.add_argument("--tps", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--moto-ops", type=int, default=0, metavar="N", help="time N calls of each kind, no pipeline")
    args = parser.parse_args(argv)
    if not 1 <= args.rows * args.group_size <= MAX_ROWS:
        parser.error(f"rows x group size must be within 1..{MAX_ROWS}")
    sizes = [int(s) for s in args.ledger_sizes.split(",") if s.strip()]
    if args.moto_ops:
        return time_moto_ops(sizes, min(args.moto_ops, 2000))

    from rollout_pipeline.fakes import faithful
    from rollout_pipeline.fakes.acr import AgentBehaviour, FakeAgentRuntime
    from rollout_pipeline.ledger import retry
    from rollout_pipeline.local.pipeline import LocalPipeline, LocalSettings

    settings = LocalSettings(
        experiment="bench-local",
        group_size=args.group_size,
        tps_limit=args.tps,
        max_sessions=args.max_sessions,
        model_url="http://127.0.0.1:9/v1",
        runtime_factory=lambda _resources: FakeAgentRuntime(behaviour=AgentBehaviour(rewards=1.0)),
        aws_profile=faithful.FAITHFUL,
        aws_profile_seed=args.seed,
        dispatch_concurrency=4,
        sweep_interval_s=5.0,
    )
    failures = 0
    total_rollouts = 0
    total_s = 0.0
    with LocalPipeline(settings) as pipeline:
        assert pipeline.resources is not None
        table = pipeline.resources.table_name
        items = 0
        print(f"local mode, faithful profile, fake ACR: {args.rows} rows x {args.group_size} per batch", flush=True)
        for index, size in enumerate(sizes):
            items = pad_ledger(table, items, size)
            seconds, done = run_batch(pipeline, args.rows, args.group_size, args.timeout, f"s{index}")
            n = done["rollouts_total"]
            lost = n - done["succeeded"] - done["failed"]
            failures += int(lost != 0 or done["failed"] != 0 or n != args.rows * args.group_size)
            total_rollouts += n
            total_s += seconds
            print(
                f"ledger ~{size:>6} items: {n} rollouts in {seconds:6.1f} s = {n / seconds:6.1f} rollouts/s "
                f"(succeeded {done['succeeded']}, failed {done['failed']}, lost {lost}; "
                f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)",
                flush=True,
            )
        dead = pipeline.dead_letters()
        print(f"dead-lettered              {dead}")
        failures += int(any(dead.values()))
        profile = faithful.active()
        assert profile is not None
        per_k = 1000 / max(total_rollouts, 1)
        print(
            f"conflict retries           {retry.stats.total * per_k:.1f} per 1,000 rollouts "
            f"(injected: {profile.stats.plain_conflicts} plain, {profile.stats.transaction_conflicts} transaction; "
            f"{profile.stats.keys_encoded} event keys encoded, {profile.stats.access_denied} 403s)"
        )
        writes = profile.plain_writes + profile.transaction_writes
        print("busiest ledger items       writes/s over the timed batches (WCU/s)")
        for item, count in writes.most_common(4):
            key = json.loads(item)
            wcu = profile.plain_writes[item] + 2 * profile.transaction_writes[item]
            label = f"{key['pk']['S'][:30]}/{key['sk']['S'][:20]}"
            print(f"  {label:<52} {count / total_s:7.1f}  ({wcu / total_s:.1f} WCU/s)")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
