"""The dataset as Parquet files and a dataset card: `DIR/data/{batch}.parquet` (one file per batch, written row group
by row group as its rows are read) and `DIR/README.md` (the Hugging Face dataset card: what was exported, the
schema, how to load it). Needs pyarrow (`pip install 'rollout-pipeline[data]'`), imported on first use only: the
Lambdas never load this module and pyarrow is never in their bundle.

The files are plain Parquet: `pyarrow.parquet.read_table(DIR/data)`, `pandas.read_parquet(DIR/data)`,
`polars.read_parquet(DIR/data/*.parquet)`, `datasets.load_dataset("parquet", data_files=...)` or
`datasets.load_dataset(DIR)` (the card's `configs` names the files) read them as they are.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Final

from rollout_pipeline.contracts import iso, utcnow
from rollout_pipeline.sdk.dataset import (
    METADATA_BATCH,
    METADATA_EXPERIMENT,
    METADATA_FILTERS,
    METADATA_RESCORED_WITH,
    METADATA_SCHEMA_VERSION,
    SCHEMA_VERSION,
    Column,
    Row,
)
from rollout_pipeline.sdk.errors import SdkError

#: A row group is written once it holds this many rows ...
ROW_GROUP_ROWS: Final = 2_048
#: ... or about this many bytes of text (result objects and payloads dominate), whichever comes first: the memory
#: an export holds is about one row group plus the rows of the group being read.
ROW_GROUP_BYTES: Final = 32 * 1024 * 1024
#: Where the files go inside the export's directory (the card's `configs` points there).
DATA_DIR: Final = "data"
CARD: Final = "README.md"
_ROW_OVERHEAD_BYTES: Final = 256
_INSTALL_HINT: Final = "pip install 'rollout-pipeline[data]'"


def require_pyarrow() -> tuple[ModuleType, ModuleType]:
    """`(pyarrow, pyarrow.parquet)`, or `SdkError` saying how to install them."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise SdkError(f"writing Parquet needs pyarrow: {_INSTALL_HINT}") from None
    return pyarrow, pyarrow.parquet


def arrow_type(pa: ModuleType, column: Column) -> Any:
    """The Arrow type of a schema column (`dataset.COLUMN_TYPES`)."""
    types: dict[str, Any] = {
        "string": pa.string(),
        "int32": pa.int32(),
        "int64": pa.int64(),
        "float64": pa.float64(),
        "bool": pa.bool_(),
        "timestamp": pa.timestamp("us", tz="UTC"),
        "list<float64>": pa.list_(pa.float64()),
    }
    return types[column.type]


def arrow_schema(columns: Sequence[Column], metadata: dict[str, str] | None = None) -> Any:
    """The Arrow schema of `columns` (every field nullable) with `metadata` (key-value, in every file)."""
    pa, _ = require_pyarrow()
    return pa.schema([pa.field(c.name, arrow_type(pa, c), nullable=True) for c in columns], metadata=metadata)


def _row_bytes(row: Row) -> int:
    size = _ROW_OVERHEAD_BYTES
    for value in row.values():
        if isinstance(value, str):
            size += len(value)
    return size


@dataclass
class FileSummary:
    """What one file holds: rows by status, failures by reason, the successful rewards' sum."""

    batch_id: str
    path: str
    rows: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    failure_reasons: Counter[str] = field(default_factory=Counter)
    reward_sum: float = 0.0
    reward_count: int = 0
    rescore_errors: int = 0

    def count(self, row: Row) -> None:
        self.rows += 1
        self.statuses[str(row["status"])] += 1
        if row.get("failure_reason"):
            self.failure_reasons[str(row["failure_reason"])] += 1
        if row.get("reward") is not None:
            self.reward_sum += float(row["reward"])
            self.reward_count += 1
        if row.get("rescore_error"):
            self.rescore_errors += 1

    @property
    def reward_mean(self) -> float | None:
        return self.reward_sum / self.reward_count if self.reward_count else None


class ParquetFileWriter:
    """One Parquet file written row group by row group: rows are buffered until `row_group_rows` rows or about
    `row_group_bytes` of text, then written (`buffered_rows` is what memory holds). The file appears under its name
    only once complete (`close`): it is written aside and renamed, so a failed export leaves no partial file."""

    def __init__(
        self,
        path: Path,
        columns: Sequence[Column],
        metadata: dict[str, str],
        *,
        batch_id: str,
        row_group_rows: int = ROW_GROUP_ROWS,
        row_group_bytes: int = ROW_GROUP_BYTES,
    ) -> None:
        self._pa, pq = require_pyarrow()
        self.path = path
        self._partial = path.with_name(path.name + ".partial")
        self._columns = [c.name for c in columns]
        self.schema = arrow_schema(columns, metadata)
        self._writer = pq.ParquetWriter(str(self._partial), self.schema, compression="zstd")
        self._buffer: list[Row] = []
        self._buffered_bytes = 0
        self._row_group_rows = max(1, row_group_rows)
        self._row_group_bytes = max(1, row_group_bytes)
        self.row_groups = 0
        self.summary = FileSummary(batch_id=batch_id, path=str(path))

    @property
    def buffered_rows(self) -> int:
        return len(self._buffer)

    def add(self, rows: Iterable[Row]) -> None:
        for row in rows:
            self._buffer.append(row)
            self._buffered_bytes += _row_bytes(row)
            self.summary.count(row)
            if len(self._buffer) >= self._row_group_rows or self._buffered_bytes >= self._row_group_bytes:
                self._flush()

    def _flush(self) -> None:
        if not self._buffer:
            return
        columns = {name: [row.get(name) for row in self._buffer] for name in self._columns}
        table = self._pa.Table.from_pydict(columns, schema=self.schema)
        self._writer.write_table(table, row_group_size=len(self._buffer))
        self.row_groups += 1
        self._buffer = []
        self._buffered_bytes = 0

    def close(self) -> FileSummary:
        """Write what is buffered and put the file in place."""
        self._flush()
        self._writer.close()
        os.replace(self._partial, self.path)
        return self.summary

    def abort(self) -> None:
        """Drop the partial file (after an error)."""
        try:
            self._writer.close()
        finally:
            self._partial.unlink(missing_ok=True)


def prepare_directory(directory: Path, *, overwrite: bool) -> Path:
    """Make `directory/data`; refuse a directory holding files unless `overwrite` (then the `.parquet` files of
    `data/` and the card of an earlier export are removed: readers of `data/` would otherwise mix the two)."""
    data = directory / DATA_DIR
    if directory.exists() and not directory.is_dir():
        raise SdkError(f"{directory} exists and is not a directory")
    existing = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
    if existing and not overwrite:
        shown = ", ".join(existing[:5]) + (" ..." if len(existing) > 5 else "")
        raise SdkError(f"{directory} is not empty ({shown}): choose an empty directory or pass overwrite (--overwrite)")
    if overwrite and data.is_dir():
        for old in data.glob("*.parquet*"):
            old.unlink()
    if overwrite and (directory / CARD).is_file():
        (directory / CARD).unlink()
    data.mkdir(parents=True, exist_ok=True)
    return data


def file_metadata(exp_id: str, batch_id: str, *, filters: str, rescored_with: str | None) -> dict[str, str]:
    """The key-value metadata of one file."""
    metadata = {
        METADATA_SCHEMA_VERSION: SCHEMA_VERSION,
        METADATA_EXPERIMENT: exp_id,
        METADATA_BATCH: batch_id,
        METADATA_FILTERS: filters,
    }
    if rescored_with:
        metadata[METADATA_RESCORED_WITH] = rescored_with
    return metadata


# ----------------------------------------------------------------------------------------------- the card


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def dataset_card(
    *,
    exp_id: str,
    files: Sequence[FileSummary],
    columns: Sequence[Column],
    filters: str,
    rescored_with: str | None,
    directory: Path,
) -> str:
    """The dataset card (`README.md`): Hugging Face front matter (the files as the `train` split), what was
    exported, the schema and how to load it."""
    total = sum(f.rows for f in files)
    lines = [
        "---",
        "configs:",
        "- config_name: default",
        "  data_files:",
        "  - split: train",
        f"    path: {DATA_DIR}/*.parquet",
        "tags:",
        "- reinforcement-learning",
        "- rollouts",
        "- rollout-pipeline",
        "---",
        "",
        f"# Rollouts of experiment `{exp_id}`",
        "",
        f"{total} rollouts of {len(files)} batch(es), one row per rollout, exported from the experiment's ledger "
        f"and results bucket by rollout-pipeline on {iso(utcnow())}. Schema version **{SCHEMA_VERSION}** "
        "(rollout-pipeline's docs/datasets.md, \"The rollout dataset\"); every file's Parquet metadata carries it "
        f"(`{METADATA_SCHEMA_VERSION}`).",
        "",
        f"- Filters: {filters}.",
    ]
    if rescored_with:
        lines.append(
            f"- Re-scored with `{rescored_with}`: `reward`, `turn_rewards`, the group statistics and `advantage` are "
            "the function's; the agent's are in `original_reward`, `original_turn_rewards`, `original_advantage`. "
            "A row whose function failed has `rescore_error` set and a null `reward`."
        )
    lines += [
        "- Failures are rows with `status` `failed`, their `failure_reason` and `error`, and a null `reward` "
        "(never 0).",
        "",
        "| batch | rows | succeeded | failed (by reason) | other | reward mean | file |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in files:
        reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(f.failure_reasons.items()))
        failed = f.statuses.get("failed", 0)
        other = f.rows - f.statuses.get("succeeded", 0) - failed
        mean = "-" if f.reward_mean is None else f"{f.reward_mean:.4f}"
        lines.append(
            f"| `{f.batch_id}` | {f.rows} | {f.statuses.get('succeeded', 0)} | {failed}"
            f"{f' ({reasons})' if reasons else ''} | {other} | {mean} | `{Path(f.path).relative_to(directory)}` |"
        )
    lines += ["", "## Columns", "", "| column | type | meaning |", "|---|---|---|"]
    lines += [f"| `{c.name}` | {c.type} | {_cell(c.description)} |" for c in columns]
    lines += [
        "",
        "## Load it",
        "",
        "```python",
        "import pandas as pd",
        f'df = pd.read_parquet("{DATA_DIR}")',
        "",
        "import polars as pl",
        f'df = pl.read_parquet("{DATA_DIR}/*.parquet")',
        "",
        "import datasets",
        'ds = datasets.load_dataset(".")["train"]  # this directory; or:',
        f'ds = datasets.load_dataset("parquet", data_files="{DATA_DIR}/*.parquet")["train"]',
        "```",
        "",
    ]
    return "\n".join(lines)
