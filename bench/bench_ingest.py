# ruff: noqa: ARG002  (the in-memory stand-ins implement the ports' full signatures)
"""Benchmark dataset ingestion: throughput (rows/s) and peak memory on a generated dataset (default 100k rows).

Three measurements, reported separately so it is clear what each number covers:

1. reader: stream the file from local disk in 1 MiB chunks through the reader and `contracts.parse_row`
   (`.jsonl`, `.jsonl.gz`, `.json` array). Peak memory: tracemalloc of this pass.
2. logic: the real ingestion (`Ingestion.handle_message`: reader, validation, group specs, claim decisions,
   `RolloutMessage` bodies, checkpoints, errors log, events) over the whole file, with in-memory stand-ins for the
   AWS side: the object store reads the local file, the queue serialises and counts bodies, the ledger is a
   `Ledger` whose DynamoDB calls are replaced by an in-memory stand-in that keeps only the batch item (every
   group is accepted and not stored, so its memory does not grow with the file). Peak memory: tracemalloc.
   Why not moto here: moto's TransactWriteItems deep-copies the whole table on every call (quadratic in the
   number of group items) and its SQS costs ~70 ms per SendMessageBatch in server mode.
3. moto: the same ingestion with the real boto3 adapters against in-process moto (S3, DynamoDB transactions,
   SQS, EventBridge) on a smaller file (`--moto-rows`, default 2000): the end-to-end path, moto-bound.

The process peak RSS (ru_maxrss) is printed last; it includes boto3, pydantic and moto.

Usage: python bench/bench_ingest.py [--rows 100000] [--group-size 8] [--moto-rows 2000] [--skip-moto]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rollout_pipeline.contracts import RowError, parse_row  # noqa: E402
from rollout_pipeline.ingest.reader import DatasetKind, read_records  # noqa: E402

CHUNK = 1 << 20


def generate(directory: Path, rows: int) -> dict[str, Path]:
    """Write the dataset in three formats, streaming (never the whole file in memory)."""
    paths = {
        "jsonl": directory / f"bench-{rows}.jsonl",
        "jsonl.gz": directory / f"bench-{rows}.jsonl.gz",
        "json": directory / f"bench-{rows}.json",
    }
    with (
        paths["jsonl"].open("wb") as plain,
        gzip.open(paths["jsonl.gz"], "wb", compresslevel=6) as zipped,
        paths["json"].open("wb") as array,
    ):
        array.write(b"[\n")
        for index in range(rows):
            row = {
                "id": f"row-{index}",
                "question": f"What is {index} + {index * 7 % 1000}? Show your work step by step.",
                "answer": str(index + index * 7 % 1000),
                "meta": {"source": "bench", "difficulty": index % 5},
            }
            line = json.dumps(row).encode()
            plain.write(line + b"\n")
            zipped.write(line + b"\n")
            array.write((b",\n" if index else b"") + line)
        array.write(b"\n]\n")
    return paths


def file_chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            yield chunk


def bench_reader(path: Path, kind: DatasetKind, *, traced: bool) -> dict[str, Any]:
    """Reader + row validation only, from local disk (`traced`: measure the peak with tracemalloc)."""
    if traced:
        tracemalloc.start()
    started = time.perf_counter()
    accepted = rejected = 0
    for record in read_records(file_chunks(path), kind):
        try:
            parse_row(record.text, record.position)
            accepted += 1
        except RowError:
            rejected += 1
    elapsed = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] if traced else 0
    tracemalloc.stop()
    return {"rows": accepted, "rejected": rejected, "seconds": elapsed, "peak": peak, "size": path.stat().st_size}


class FileStore:
    """ObjectStore over local files (bucket ignored): streams like S3, so the reader path is the real one."""

    def __init__(self, paths: dict[str, Path]) -> None:
        self.paths = paths
        self.puts = 0

    def head(self, bucket: str, key: str, version_id: str | None = None) -> Any:
        from rollout_pipeline.ports import ObjectInfo

        return ObjectInfo(bucket=bucket, key=key, size=self.paths[key].stat().st_size, version_id=version_id)

    def iter_bytes(
        self, bucket: str, key: str, version_id: str | None = None, chunk_size: int = CHUNK
    ) -> Iterator[bytes]:
        return file_chunks(self.paths[key])

    def get_bytes(self, bucket: str, key: str, max_bytes: int) -> tuple[bytes, int]:
        return b"", 0

    def get_tail(self, bucket: str, key: str, max_bytes: int) -> bytes:
        return b""

    def put_bytes(self, bucket: str, key: str, body: bytes, content_type: str = "", metadata: Any = None) -> None:
        self.puts += 1


class CountingQueue:
    """MessageQueue that receives the serialised bodies and counts them (SendMessageBatch calls it would make)."""

    def __init__(self) -> None:
        import threading

        self.bodies = 0
        self.bytes = 0
        self.batch_calls = 0
        self._lock = threading.Lock()  # ingestion sends a chunk's slices from several threads

    def send_all(self, queue_url: str, bodies: Any, delay_seconds: int = 0) -> None:
        size = sum(len(b) for b in bodies)
        with self._lock:
            self.bodies += len(bodies)
            self.bytes += size
            self.batch_calls += (len(bodies) + 9) // 10


class NullPublisher:
    def __init__(self) -> None:
        self.details: list[Any] = []

    def publish(self, details: Any) -> None:
        self.details.extend(details)


class InMemoryBatchTable:
    """Stand-in for the DynamoDB client calls `BatchLedger` makes during one ingestion: keeps the batch item
    only; every group transaction succeeds (the generated ids are unique) and is not stored."""

    class exceptions:
        class ConditionalCheckFailedException(Exception):
            pass

        class TransactionCanceledException(Exception):
            response: dict[str, Any] = {}

    def __init__(self) -> None:
        self.batch: dict[str, Any] | None = None
        self.transactions = 0
        self.updates = 0

    def get_item(self, **kwargs: Any) -> dict[str, Any]:
        return {"Item": self.batch} if self.batch and kwargs["Key"]["sk"]["S"] == "BATCH" else {}

    def put_item(self, **kwargs: Any) -> dict[str, Any]:
        self.batch = dict(kwargs["Item"])
        return {}

    def query(self, **kwargs: Any) -> dict[str, Any]:
        """The batch view's Query (`begins_with(sk, "BATCH")`): the batch item, no control item, no counters."""
        wants_batch = kwargs["ExpressionAttributeValues"].get(":b") == {"S": "BATCH"}
        return {"Items": [self.batch] if self.batch and wants_batch else []}

    def update_item(self, **kwargs: Any) -> dict[str, Any]:
        assert self.batch is not None
        self.updates += 1
        values = kwargs["ExpressionAttributeValues"]
        names = kwargs.get("ExpressionAttributeNames", {})
        update = kwargs["UpdateExpression"]
        set_part, _, remove_part = update.partition(" REMOVE ")
        for assignment in set_part.removeprefix("SET ").split(", "):
            target, _, source = assignment.partition(" = ")
            if source.startswith("if_not_exists"):
                source = source.split(", ")[-1].rstrip(")")
            self.batch[names.get(target, target)] = values[source]
        for target in remove_part.split(", ") if remove_part else []:
            self.batch.pop(names.get(target, target), None)
        if ":after" in values:
            self.batch["status"] = values[":after"]
        return {"Attributes": dict(self.batch)}

    def transact_write_items(self, **kwargs: Any) -> dict[str, Any]:
        self.transactions += 1
        return {}


def bench_logic(path: Path, key: str, group_size: int, *, traced: bool) -> dict[str, Any]:
    """The whole ingestion logic over the file with in-memory stand-ins for AWS (see the module docstring)."""
    from rollout_pipeline.config import ExperimentConfig, HandlerSettings
    from rollout_pipeline.feed.feed import Feed
    from rollout_pipeline.ingest import Ingestion, IngestPorts
    from rollout_pipeline.ledger.ledger import Ledger

    settings = HandlerSettings(
        table_name="ledger",
        input_bucket="input",
        results_bucket="results",
        rollout_queue_url="https://sqs.local/rollout",
        bus_name="bus",
        experiment=ExperimentConfig(name="bench", group_size=group_size),
    )
    table, queue, publisher = InMemoryBatchTable(), CountingQueue(), NullPublisher()
    ledger = Ledger.open("ledger", table)
    ingestion = Ingestion(
        IngestPorts(
            store=FileStore({key: path}),
            queue=queue,
            publisher=publisher,
            ledger=ledger,
            settings=settings,
            feed=Feed(ledger, queue, settings),
        )
    )
    event = {
        "source": "aws.s3",
        "detail-type": "Object Created",
        "detail": {"bucket": {"name": "input"}, "object": {"key": key, "version-id": "v1"}},
    }
    if traced:
        tracemalloc.start()
    started = time.perf_counter()
    result = ingestion.handle_message(event, owner="bench")
    elapsed = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] if traced else 0
    tracemalloc.stop()
    return {
        "outcome": result.outcome,
        "rows": result.rows_accepted,
        "rollouts": queue.bodies,
        "mib_sent": queue.bytes / (1 << 20),
        "sqs_calls": queue.batch_calls,
        "transactions": table.transactions,
        "checkpoints": table.updates,
        "seconds": elapsed,
        "peak": peak,
    }


def bench_moto(rows: int, group_size: int, directory: Path) -> dict[str, Any]:
    """The ingestion with the real adapters against in-process moto."""
    from moto import mock_aws

    os.environ.update(
        {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
    )
    os.environ.pop("AWS_ENDPOINT_URL", None)
    paths = generate(directory, rows)
    with mock_aws():
        from rollout_pipeline.adapters import clients
        from rollout_pipeline.adapters.eventbridge import EventBridgePublisher
        from rollout_pipeline.adapters.s3 import S3ObjectStore
        from rollout_pipeline.adapters.sqs import SqsQueue
        from rollout_pipeline.config import ExperimentConfig
        from rollout_pipeline.feed.feed import Feed
        from rollout_pipeline.ingest import Ingestion, IngestPorts
        from rollout_pipeline.ledger.ledger import Ledger
        from rollout_pipeline.local.resources import create_resources

        clients.reset()
        resources = create_resources(
            ExperimentConfig(name="bench", group_size=group_size), region="us-east-1", client=clients.client
        )
        clients.client("s3").upload_file(str(paths["jsonl.gz"]), resources.input_bucket, "datasets/bench.jsonl.gz")
        message = clients.client("sqs").receive_message(QueueUrl=resources.ingest_queue_url)["Messages"][0]
        settings = resources.settings()
        queue, ledger = SqsQueue(), Ledger.open(settings.table_name)
        ingestion = Ingestion(
            IngestPorts(
                store=S3ObjectStore(),
                queue=queue,
                publisher=EventBridgePublisher(settings.bus_name),
                ledger=ledger,
                settings=settings,
                feed=Feed(ledger, queue, settings),
            )
        )
        started = time.perf_counter()
        result = ingestion.handle_message(json.loads(message["Body"]), owner="bench")
        elapsed = time.perf_counter() - started
        batch = ledger.batches.read_batch(result.batch_id or "")
        depth = clients.client("sqs").get_queue_attributes(
            QueueUrl=resources.rollout_queue_url, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]["ApproximateNumberOfMessages"]
        groups = sum(1 for _ in ledger.groups.batch_groups(result.batch_id or ""))
        clients.reset()
    return {
        "outcome": result.outcome,
        "rows": batch.rows_accepted if batch is not None else 0,
        "rollouts": (batch.rollouts_total or 0) if batch is not None else 0,
        "groups": groups,
        "queue_depth": int(depth),
        "sqs_calls": queue.calls,
        "seconds": elapsed,
    }


def mib(value: float) -> str:
    return f"{value / (1 << 20):.1f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000, help="rows of the generated dataset")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per row in the logic run")
    parser.add_argument("--moto-rows", type=int, default=300, help="rows of the end-to-end run on moto")
    parser.add_argument("--moto-group-size", type=int, default=2, help="rollouts per row on moto (keep it shallow)")
    parser.add_argument("--skip-moto", action="store_true", help="skip the end-to-end run on moto")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    try:
        print(f"generating {args.rows:,} rows (jsonl, jsonl.gz, json) in {workdir} ...", flush=True)
        paths = generate(workdir, args.rows)

        print("\n1. reader + parse_row, file streamed from local disk (time untraced; peak: tracemalloc, 2nd pass)")
        for kind, path in paths.items():
            timed = bench_reader(path, kind, traced=False)  # type: ignore[arg-type]
            traced = bench_reader(path, kind, traced=True)  # type: ignore[arg-type]
            print(
                f"   {kind:9} {mib(timed['size']):>10}  {timed['rows']:>7,} rows  {timed['seconds']:6.2f} s  "
                f"{timed['rows'] / timed['seconds']:>9,.0f} rows/s  peak {mib(traced['peak'])}",
                flush=True,
            )

        print(
            f"\n2. ingestion logic, whole file, group size {args.group_size}; AWS replaced by in-memory stand-ins "
            "(queue counts serialised bodies, ledger keeps only the batch item); time untraced"
        )
        for kind, path in paths.items():
            stats = bench_logic(path, f"datasets/bench.{kind}", args.group_size, traced=False)
            print(
                f"   {kind:9} {stats['outcome']}: {stats['rows']:,} rows -> {stats['rollouts']:,} messages "
                f"({stats['mib_sent']:.0f} MiB, {stats['sqs_calls']:,} SendMessageBatch, {stats['transactions']:,} "
                f"group transactions, {stats['checkpoints']:,} batch updates)  {stats['seconds']:6.1f} s  "
                f"{stats['rows'] / stats['seconds']:>7,.0f} rows/s  {stats['rollouts'] / stats['seconds']:>8,.0f} "
                "messages/s",
                flush=True,
            )
        kind = "jsonl.gz"
        stats = bench_logic(paths[kind], f"datasets/bench.{kind}", args.group_size, traced=True)
        print(
            f"   {kind:9} again under tracemalloc: peak {mib(stats['peak'])} of Python allocations for the whole "
            f"{stats['rows']:,}-row ingestion ({stats['seconds']:.1f} s traced)",
            flush=True,
        )

        if not args.skip_moto:
            print(
                f"\n3. end to end with the real boto3 adapters on in-process moto (S3 gzip object, DynamoDB "
                f"transactions, SQS, EventBridge): {args.moto_rows:,} rows x group {args.moto_group_size}; "
                "moto-bound (its SQS slows with queue depth)"
            )
            (workdir / "moto").mkdir()
            stats = bench_moto(args.moto_rows, args.moto_group_size, workdir / "moto")
            ok = (
                stats["rows"] == args.moto_rows
                and stats["groups"] == args.moto_rows
                and stats["queue_depth"] == args.moto_rows * args.moto_group_size
            )
            print(
                f"   jsonl.gz  {stats['outcome']}: {stats['rows']:,} rows, {stats['groups']:,} group items, "
                f"{stats['rollouts']:,} rollouts (queue depth {stats['queue_depth']:,}, {stats['sqs_calls']:,} "
                f"SendMessageBatch)  {stats['seconds']:6.1f} s  {stats['rows'] / stats['seconds']:>6,.0f} rows/s  "
                f"{'counts OK' if ok else 'COUNT MISMATCH'}",
                flush=True,
            )
        maxrss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"\nprocess peak RSS (ru_maxrss, whole process incl. boto3, pydantic, moto): {maxrss_mib:.0f} MiB")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
