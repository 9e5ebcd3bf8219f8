"""`exp.data`: what the experiment's rollouts left, read from the ledger and the results bucket: exports (JSON Lines,
the Parquet rollout dataset), re-scoring, batch statistics."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from rollout_pipeline.sdk._aws import aws_errors
from rollout_pipeline.sdk.errors import BatchNotFound, SdkError
from rollout_pipeline.sdk.handle import ExperimentHandle
from rollout_pipeline.sdk.stats import DEFAULT_PASS_THRESHOLD, BatchStats, FailurePolicy

if TYPE_CHECKING:
    from rollout_pipeline.sdk.dataset import DatasetExport, RowFilter
    from rollout_pipeline.sdk.rescore import RewardFunction


class Data:
    """The data of one experiment's batches (`exp.data`)."""

    def __init__(self, experiment: ExperimentHandle) -> None:
        self._exp = experiment

    def export(
        self,
        /,
        batch_id: str | Iterable[str] | None,
        out: str | os.PathLike[str] | IO[str],
        *,
        include_results: bool = True,
        include_payload: bool = False,
        format: str = "jsonl",
        **dataset_options: Any,
    ) -> int:
        """Export batches from the ledger (+ their result objects); return the rows written.

        `format="jsonl"`: one JSON line per rollout to `out` (a path, `-` for stdout, or a text stream).
        `format="parquet"`: the rollout dataset (docs/datasets.md, "The rollout dataset") in the directory `out`
        (`export_dataset`, whose options `dataset_options` are: `variance_only`, `succeeded_only`, `min_reward`,
        `result_fields`, `overwrite`); needs pyarrow (`pip install 'rollout-pipeline[data]'`). `batch_id`: one id,
        several, or None for every batch of the experiment.
        """
        if format == "parquet":
            if not isinstance(out, str | os.PathLike):
                raise SdkError("format='parquet' writes a directory: give its path")
            return self.export_dataset(batch_id, out, include_results=include_results, **dataset_options).rows
        if format != "jsonl":
            raise SdkError(f"format must be jsonl or parquet (got {format!r})")
        if dataset_options:
            raise SdkError(f"{', '.join(sorted(dataset_options))}: only with format='parquet'")
        from rollout_pipeline.sdk.export import export_rows, quiet_fetch, resolve_batches, write_jsonl

        batches = resolve_batches(self._exp, batch_id)
        ledger = self._exp.ledger()
        prices = self._exp.price_book()

        def rows() -> Iterator[dict[str, Any]]:
            for batch in batches:
                yield from export_rows(
                    groups=ledger.groups.batch_groups(batch),
                    rollouts=ledger.rollouts.batch_rollouts(batch),
                    prices=prices,
                    fetch_result=quiet_fetch(self._exp) if include_results else None,
                    include_payload=include_payload,
                )

        with aws_errors(f"export {len(batches)} batch(es)"):
            if isinstance(out, str | os.PathLike):
                if str(out) == "-":
                    return write_jsonl(rows(), sys.stdout)
                with Path(out).open("w", encoding="utf-8") as handle:
                    return write_jsonl(rows(), handle)
            return write_jsonl(rows(), out)

    def export_dataset(
        self,
        batch_id: str | Iterable[str] | None,
        directory: str | os.PathLike[str],
        *,
        include_results: bool = True,
        variance_only: bool = False,
        succeeded_only: bool = False,
        min_reward: float | None = None,
        result_fields: Sequence[str] = (),
        overwrite: bool = False,
    ) -> DatasetExport:
        """Write the rollout dataset of one batch, several, or every batch (None) to `directory`: one Parquet file
        per batch under `data/` (row groups written as they are read: memory stays bounded) and a dataset card
        `README.md`. One row per rollout, schema `sdk.dataset.COLUMNS` (docs/datasets.md); failures are rows with
        their typed reason and a null reward. Filters: `variance_only` (groups whose rewards differ),
        `succeeded_only`, `min_reward` (reward >= it). `result_fields`: top-level fields of the result object to add
        as columns `result_{field}`. A directory that is not empty is refused unless `overwrite`. Needs pyarrow."""
        from rollout_pipeline.sdk.export import export_dataset

        return export_dataset(
            self._exp,
            batch_id,
            directory,
            include_results=include_results,
            row_filter=_row_filter(variance_only, succeeded_only, min_reward),
            result_fields=result_fields,
            overwrite=overwrite,
        )

    def rescore(
        self,
        batch_id: str | Iterable[str] | None,
        reward: str | RewardFunction,
        directory: str | os.PathLike[str],
        *,
        variance_only: bool = False,
        succeeded_only: bool = False,
        min_reward: float | None = None,
        result_fields: Sequence[str] = (),
        overwrite: bool = False,
    ) -> DatasetExport:
        """Re-score stored rollouts with `reward` (a function `(row, result) -> number | per-turn list`, or its
        `module:function` / `file.py:function` name) and write the dataset as `export_dataset` does, with the new
        rewards, group statistics and advantages, and the agent's beside them (`original_*`). Runs no agent and
        writes nothing to the ledger, the buckets or the bus. A row whose function raised is marked
        (`rescore_error`) and counted (`DatasetExport.failed`, the first ones in `errors`); the run goes on."""
        from rollout_pipeline.sdk.export import export_dataset, quiet_payload
        from rollout_pipeline.sdk.rescore import Rescorer, load_reward_function

        if isinstance(reward, str):
            function, name = load_reward_function(reward)
        else:
            function, name = reward, f"{getattr(reward, '__module__', '?')}:{getattr(reward, '__qualname__', '?')}"
        return export_dataset(
            self._exp,
            batch_id,
            directory,
            row_filter=_row_filter(variance_only, succeeded_only, min_reward),
            result_fields=result_fields,
            overwrite=overwrite,
            rescorer=Rescorer(function, load_payload=quiet_payload(self._exp)),
            rescored_with=name,
        )

    def stats(
        self,
        batch_id: str,
        *,
        pass_k: Sequence[int] = (),
        threshold: float = DEFAULT_PASS_THRESHOLD,
        failures: FailurePolicy = "exclude",
    ) -> BatchStats:
        """A batch's rewards, groups with reward variance and pass@k for each k of `pass_k` (the unbiased estimator
        of Chen et al. 2021, per input, averaged over the inputs with at least k samples; a sample passes when its
        reward >= `threshold`; failed rollouts are not samples unless `failures="fail"`), from the group items."""
        from rollout_pipeline.sdk.stats import batch_stats

        with aws_errors(f"read the groups of batch {batch_id}"):
            ledger = self._exp.ledger()
            if ledger.batches.read_batch(batch_id) is None:
                raise BatchNotFound(f"no batch {batch_id!r} in experiment {self._exp.name!r}")
            try:
                return batch_stats(
                    batch_id, ledger.groups.batch_groups(batch_id), ks=pass_k, threshold=threshold, failures=failures
                )
            except ValueError as exc:
                raise SdkError(str(exc)) from None


def _row_filter(variance_only: bool, succeeded_only: bool, min_reward: float | None) -> RowFilter:
    """The dataset's row filter from `export`/`rescore`'s options; a bad combination is an SdkError."""
    from rollout_pipeline.sdk.dataset import RowFilter

    try:
        return RowFilter(variance_only, succeeded_only, min_reward)
    except ValueError as exc:
        raise SdkError(str(exc)) from None
