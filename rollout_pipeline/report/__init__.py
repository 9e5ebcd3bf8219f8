"""`rollouts report`: one self-contained HTML file of charts for a batch (needs the `report` extra: matplotlib).

`collect` reads a batch through the SDK (status, export) plus recorded events; `render` draws it; `write_report`
does both. Only `render` imports matplotlib, so reading and recording a batch work without the extra.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rollout_pipeline.report.data import ReportData, collect, read_events


class ReportUnavailable(RuntimeError):
    """The plotting library is not installed."""


def render(data: ReportData) -> str:
    """The report of `data` as an HTML document; `ReportUnavailable` without matplotlib."""
    try:
        from rollout_pipeline.report import html
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
        raise ReportUnavailable(_missing(exc)) from None
    try:
        return html.render(data)
    except ModuleNotFoundError as exc:
        raise ReportUnavailable(_missing(exc)) from None


def _missing(exc: ModuleNotFoundError) -> str:
    return f"the report needs {exc.name}: pip install 'rollout-pipeline[report]'"


def write_report(experiment: Any, batch_id: str, output: Path, events: Iterable[Mapping[str, Any]] = ()) -> ReportData:
    """Read the batch through `experiment` (an attached SDK `Experiment`), write its report to `output`."""
    data = collect(experiment, batch_id, events)
    output.write_text(render(data), encoding="utf-8")
    return data


__all__ = ["ReportData", "ReportUnavailable", "collect", "read_events", "render", "write_report"]
