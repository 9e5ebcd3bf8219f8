"""What every pipeline Lambda shares: one handler shape over the composition root (`rollout_pipeline.wiring`).

A function module (`lambdas/{name}.py`) declares `function = PipelineFunction(name, build, run)`: `build` picks
its stage from the `Wiring` (made once per container from the environment, lazily), `run` turns one event into
a `RunResult` (the response, a log line, metric counts). The shape around it is the same for all four: Powertools
logger and metrics (service per `observability.SERVICES`, namespace from the environment), the experiment id on
every log line, the stage's recorded metrics flushed, one summary line logged. Local mode and tests call
`function.bind(stage)` to run the very same code over a stage they built (no process-wide switch).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

from aws_lambda_powertools import Logger, Metrics

from rollout_pipeline import metric_names, topology
from rollout_pipeline.observability import SERVICES, clear_log_ids, install_log_ids
from rollout_pipeline.sqs_batch import PartialBatch, batch_response
from rollout_pipeline.wiring import Wiring

if TYPE_CHECKING:
    from rollout_pipeline.lifecycle.deps import LifecycleDeps
    from rollout_pipeline.metric_names import MetricsRecorder

#: Time kept back from the Lambda's remaining time: re-sending waiting messages and returning must fit in it.
SAFETY_S: Final = 20.0

Stage = TypeVar("Stage")
Handler = Callable[[dict[str, Any], Any], dict[str, Any]]


@dataclass(frozen=True)
class RunResult:
    """What one invocation did: the response to return, and what to log and count about it."""

    response: dict[str, Any]
    message: str
    extra: Mapping[str, Any] = field(default_factory=dict)
    counts: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of_batch(cls, message: str, records: int, batch: PartialBatch[Any], **counts: int) -> RunResult:
        """The partial batch response of an SQS batch, and a log line with its outcomes and failures."""
        extra = {"records": records, "outcomes": dict(batch.outcomes), "failures": dict(batch.failures)}
        return cls(batch_response(batch.failures), message, extra, counts)


class PipelineFunction(Generic[Stage]):
    """One pipeline Lambda: `handler` is its entry point (the stage built from the environment on first use)."""

    def __init__(
        self,
        name: topology.FunctionName,
        build: Callable[[Wiring], Stage],
        run: Callable[[Stage, dict[str, Any], Any], RunResult],
        *,
        experiment: Callable[[Stage], str],
        recorder: Callable[[Stage], MetricsRecorder | None] = lambda _stage: None,
    ) -> None:
        self.name = name
        self.logger = Logger(service=SERVICES[name])
        namespace = os.environ.get("POWERTOOLS_METRICS_NAMESPACE") or metric_names.METRICS_NAMESPACE
        self.metrics = Metrics(namespace=namespace, service=SERVICES[name])
        self._build = build
        self._run = run
        self._experiment = experiment
        self._recorder = recorder
        self._lock = threading.Lock()
        self._stage: Stage | None = None
        self._wiring: Wiring | None = None
        self._layout_checked = False
        self.handler: Handler = self.bind(None)

    def stage(self) -> Stage:
        """The container's stage, built on first use from the environment (`Wiring.from_environ`); no AWS call."""
        with self._lock:
            if self._stage is None:
                self._wiring = Wiring.from_environ()
                self._stage = self._build(self._wiring)
            return self._stage

    def require_layout(self) -> None:
        """Before the container's first message: the ledger's layout stamp is this code's
        (`ExperimentLedger.require_layout`, one GetItem). Another layout raises `LayoutMismatch` on every invocation, so
        the function fails loudly and its messages wait, instead of misreading the table."""
        from rollout_pipeline.ledger.experiment import LayoutMismatch

        self.stage()
        with self._lock:
            if self._layout_checked or self._wiring is None:
                return
            try:
                self._wiring.ledger().experiment.require_layout()
            except LayoutMismatch as exc:
                self.logger.error(str(exc))
                raise
            self._layout_checked = True

    def bind(self, stage: Stage | None) -> Handler:
        """The handler over `stage` (None: the container's, from the environment)."""

        @self.logger.inject_lambda_context(clear_state=True)
        @self.metrics.log_metrics(raise_on_empty_metrics=False)
        def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
            if stage is None:
                self.require_layout()
            current = self.stage() if stage is None else stage
            experiment = self._experiment(current)
            install_log_ids(self.logger, experiment)
            try:
                outcome = self._run(current, event, context)
            finally:
                clear_log_ids()
            recorder = self._recorder(current)
            counts, samples = recorder.drain() if recorder is not None else ({}, {})
            flush_metrics(self.metrics, experiment, {**counts, **outcome.counts}, samples)
            self.logger.info(outcome.message, extra=dict(outcome.extra))
            return outcome.response

        wrapped: Handler = handler
        return wrapped


def lifecycle_function(
    name: topology.FunctionName, run: Callable[[LifecycleDeps, dict[str, Any], Any], RunResult]
) -> PipelineFunction[LifecycleDeps]:
    """A function of the lifecycle stage (dispatch, completion, sweeper): the wiring's `LifecycleDeps`, whose
    recorded metrics are flushed after each invocation."""
    return PipelineFunction(
        name, Wiring.lifecycle, run, experiment=lambda deps: deps.config.name, recorder=lambda deps: deps.metrics
    )


def records(event: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The SQS records of an event (none for anything else)."""
    return list(event.get("Records") or [])


def wait_budget_s(context: Any, default_s: float = 60.0) -> float:
    """How long waiting work may wait in this invocation: the remaining time minus a safety margin."""
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    if remaining is None:
        return default_s
    return max(1.0, float(remaining()) / 1000.0 - SAFETY_S)


def flush_metrics(
    metrics: Metrics, experiment: str, counts: Mapping[str, float], samples: Mapping[str, list[float]]
) -> None:
    """Copy what the stage recorded into Powertools `Metrics` (flushed by its `log_metrics` decorator); amounts in
    US dollars (`metric_names.USD_METRICS`) go without a unit."""
    from aws_lambda_powertools.metrics import MetricUnit

    from rollout_pipeline.metric_names import USD_METRICS

    metrics.add_dimension(name="Experiment", value=experiment)
    for name, value in counts.items():
        metrics.add_metric(name=name, unit=MetricUnit.NoUnit if name in USD_METRICS else MetricUnit.Count, value=value)
    for name, values in samples.items():
        unit = MetricUnit.Milliseconds if name.endswith("Latency") else MetricUnit.Count
        for sample in values[:100]:
            metrics.add_metric(name=name, unit=unit, value=sample)
