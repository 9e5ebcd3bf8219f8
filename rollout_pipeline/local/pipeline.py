"""The whole pipeline on one machine, no AWS account.

`LocalPipeline` starts, in order: a moto server on loopback; the experiment's buckets, queues, bus, rules and
ledger, created from the same `ExperimentConfig` the stack uses (`local.resources`); the real local model
(SmolLM2 through llama.cpp) unless a model URL is given; the agent from `agent_image/` as local processes behind
the local ACR adapter; and the very Lambda handler modules (`lambdas/*.py`) as consumers of the same queues with
Lambda's SQS semantics, plus the sweeper on its schedule. The trainer side is the SDK, attached to the local
experiment. Everything it started is stopped on exit, also on Ctrl-C and on failure.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any

from rollout_pipeline import metric_names, topology
from rollout_pipeline.adapters.clients import ClientFactory
from rollout_pipeline.adapters.runtime import register_local_runtime
from rollout_pipeline.agent.credentials import API_KEY_ENV
from rollout_pipeline.config import (
    DEFAULT_AGENT_MODULES,
    MTRL_RUNTIME_ENV,
    ConfigError,
    ExperimentConfig,
    derived_dispatch_concurrency,
    validate_config,
)
from rollout_pipeline.fakes import faithful
from rollout_pipeline.local import lifeline
from rollout_pipeline.local.lambda_runtime import LambdaContext, QueueConsumer, Schedule
from rollout_pipeline.local.model_server import DEFAULT_MAX_TOKENS, MODEL_ID, LocalModelServer
from rollout_pipeline.local.moto_server import local_aws_environ, moto_server, patched_environ
from rollout_pipeline.local.resources import (
    LOCAL_ACCOUNT,
    ExperimentResources,
    create_pool,
    create_resources,
    register_stack,
)
from rollout_pipeline.local.sinks import SinkConsumer, create_sink_resources
from rollout_pipeline.quotas import DEFAULT_RESERVE, AccountQuotas, PoolSettings
from rollout_pipeline.wiring import Wiring

log = logging.getLogger(__name__)

REGION = "us-east-1"
#: How long `stop` waits, in all, for the consumers' work in progress (begun before `begin_stop`) to end.
STOP_GRACE_S = 10.0


@dataclass
class LocalSettings:
    """What a local run looks like. Limits and options mean what they mean in the deployed stack."""

    experiment: str = "local-demo"
    group_size: int = 4
    tps_limit: int = 20
    max_sessions: int = 4
    rollout_timeout_s: int = 300
    max_attempts: int = 2
    #: An OpenAI-compatible base URL; None starts the real local model (SmolLM2-135M via llama.cpp).
    model_url: str | None = None
    model_id: str = MODEL_ID
    sampling_params: dict[str, Any] = field(
        default_factory=lambda: {"temperature": 0.7, "max_tokens": DEFAULT_MAX_TOKENS}
    )
    agent_module: str = DEFAULT_AGENT_MODULES["art"]
    #: Every agent process runs the agent host (`rollout_pipeline.agent.host`, as the image does), which imports the
    #: module and serves its app. Kind: "auto" (read the module's source: SageMaker RFT SDK / `@app.entrypoint`
    #: agents -> "rft"), "art" or "rft" (the RFT adapter's front door starts before the module is imported).
    agent_kind: str = "auto"
    #: A new agent process not answering `/ping` by then fails its rollout (`agent_error`); at start, the run.
    agent_startup_timeout_s: float = 60.0
    #: "process": one agent process per session, stop kills it (ACR-faithful); "shared": one process.
    isolation: str = "process"
    warm_processes: int = 2
    agent_env: dict[str, str] = field(default_factory=dict)
    #: The model API key, given to the agent processes through their environment (`OPENAI_API_KEY`), never in
    #: payloads; the deployed stack reads it from Secrets Manager instead (`model_secret_name`).
    model_api_key: str | None = None
    #: "faithful": moto answers like real AWS where it differs (fakes/faithful.py); "moto": plain moto.
    aws_profile: str = field(default_factory=faithful.profile_from_env)
    #: Seed of the faithful profile's random choices (hot-item conflicts), so a run reproduces.
    aws_profile_seed: int = 0
    #: None: derived from the experiment's new-session rate and the local account's quota, as synth derives it
    #: (`config.derived_dispatch_concurrency`); local mode's small `max_sessions` keeps it at 2.
    dispatch_concurrency: int | None = None
    #: Consumers per queue where local mode runs fewer than the stack's event source mappings (a small machine
    #: runs the whole pipeline). Explicit, and logged at start; every other number is the stack's
    #: (`topology.function_specs`). The dispatcher's is `dispatch_concurrency` (the experiment's, as deployed).
    concurrency_overrides: dict[str, int] = field(default_factory=lambda: {"ingest": 1, "completion": 2})
    sweep_interval_s: float = 10.0
    #: The warm pool (`warm_sessions`: a count, "auto", 0 = off) and how often local mode ticks it (the stack: the
    #: sweeper's schedule). Local mode ticks it on its own schedule, so the sweeper does not loop on it.
    warm_sessions: int | str = 0
    warm_interval_s: float = 2.0
    #: Rollouts held on a spent budget come back this much later (deployed: a minute, `LifecycleDeps`).
    budget_recheck_s: int = 3
    work_dir: Path | None = None
    #: The port of the local AWS endpoint (`http://127.0.0.1:PORT`); None: a free one.
    port: int | None = None
    #: Use this `ports.AgentRuntime` instead of agent processes (benchmarks, dry runs with the fake ACR). It is
    #: built after the AWS resources exist: a callable taking the `ExperimentResources`.
    runtime_factory: Callable[[ExperimentResources], Any] | None = None
    #: Other `ExperimentConfig` fields, as the deployed stack would take them (`Experiment.launch(mode="local")`).
    experiment_settings: dict[str, Any] = field(default_factory=dict)
    #: More experiments on the same local account (same settings but the name): one moto endpoint, one account
    #: pool, one local AgentCore whose quotas are the account's, each experiment with its own resources and Lambdas.
    also: tuple[str, ...] = ()
    #: Settings of one experiment of the run over `experiment_settings` (name -> `ExperimentConfig` fields: its
    #: `capacity_weight`, `session_rate_limit`, `max_sessions`, ...), as each deployed stack takes its own.
    per_experiment: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The local account's AgentCore quotas (every experiment together; the local AgentCore refuses beyond them as
    #: AgentCore does: new sessions/s with ThrottlingException, active sessions with ServiceQuotaExceededException):
    #: None, AgentCore's documented ones (25/s, 1,000 data-plane calls/s, the region's active sessions).
    account_new_sessions_per_s: float | None = None
    account_data_plane_per_s: float | None = None
    account_active_sessions: int | None = None
    #: The share of each budget the account pool leaves unused (None: `quotas.DEFAULT_RESERVE`).
    capacity_reserve: float | None = None
    #: False: no account pool, each experiment keeps its own limits as if it owned the account (comparisons only).
    account_pool: bool = True
    #: MTRL environment mode (`experiment_settings={"mtrl_environment": True, "agent_kind": "rft"}`): the SageMaker
    #: job runtime the agents forward MTRL rollouts to and the MTRL reporter reports to (a stand-in on loopback,
    #: `local.mtrl.MtrlStandIn`); `LocalPipeline.invoke_mtrl_forwarder` is the forwarder Lambda.
    mtrl_runtime_url: str | None = None

    def names(self) -> tuple[str, ...]:
        """Every experiment of the run, the first one (`experiment`) first."""
        return (self.experiment, *(name for name in self.also if name != self.experiment))

    def pool_settings(self) -> PoolSettings:
        """The local account pool: AgentCore's documented quotas of the local region, the new-session one as set."""
        quotas = AccountQuotas.defaults(REGION).overridden(
            new_sessions_per_s=self.account_new_sessions_per_s,
            data_plane_per_s=self.account_data_plane_per_s,
            active_sessions=self.account_active_sessions,
        )
        reserve = DEFAULT_RESERVE if self.capacity_reserve is None else self.capacity_reserve
        return PoolSettings(quotas, reserve=reserve)

    def experiment_config(self, model_url: str, name: str | None = None) -> ExperimentConfig:
        """The experiment's configuration (`name`: one of `names()`, the first by default), as the stack would take
        it; `ConfigError` (one line naming every bad setting) when a setting is invalid: `LocalPipeline.start` checks
        it before it starts anything."""
        name = name or self.experiment
        return validate_config(
            {
                **self.experiment_settings,
                **self.per_experiment.get(name, {}),
                "name": name,
                "group_size": self.group_size,
                "tps_limit": self.tps_limit,
                "max_sessions": self.max_sessions,
                "rollout_timeout_s": self.rollout_timeout_s,
                "max_attempts": self.max_attempts,
                "model_base_url": model_url,
                "model_id": self.model_id,
                "sampling_params": dict(self.sampling_params),
                "dispatch_concurrency": self._dispatch_concurrency(),
                **({"warm_sessions": self.warm_sessions} if self.warm_sessions else {}),
            }
        )

    def _dispatch_concurrency(self) -> int:
        if self.dispatch_concurrency is not None:
            return max(2, self.dispatch_concurrency)
        rate = self.experiment_settings.get("session_rate_limit")
        try:
            session_rate_limit = None if rate in (None, "") else float(rate)
        except (TypeError, ValueError):
            session_rate_limit = None  # validate_config names the bad setting
        return derived_dispatch_concurrency(
            session_rate_limit=session_rate_limit,
            tps_limit=self.tps_limit,
            max_sessions=self.max_sessions,
            account_sessions_per_s=self.pool_settings().budget("sessions"),
        )

    def validate(self) -> None:
        """Raise `ConfigError` (one line) when a setting is invalid, before anything is started."""
        unknown = sorted(set(self.per_experiment) - set(self.names()))
        if unknown:
            raise ConfigError(
                f"settings for {', '.join(unknown)}: not an experiment of this run ({', '.join(self.names())})"
            )
        config = self.experiment_config(self.model_url or "http://127.0.0.1/v1")
        for name in self.names()[1:]:
            self.experiment_config(self.model_url or "http://127.0.0.1/v1", name)
        if config.mtrl_environment and not self.mtrl_runtime_url:
            raise ConfigError("mtrl_environment in local mode needs mtrl_runtime_url (the job runtime to report to)")


class LocalPipeline:
    """Start with `with LocalPipeline(settings) as pipeline:`; `pipeline.experiment` is the SDK handle."""

    def __init__(self, settings: LocalSettings | None = None) -> None:
        self.settings = settings or LocalSettings()
        #: A work directory of our own (never the settings'): kept by a stop (its logs), removed by a failed start,
        #: and removed when this process ends without a stop (killed with SIGKILL: `lifeline.OwnedPath`).
        self._own_work_dir: lifeline.OwnedPath | None = None
        work_dir = self.settings.work_dir
        if work_dir is None:
            self._own_work_dir = lifeline.OwnedPath(Path(tempfile.mkdtemp(prefix="rollouts-local-")))
            work_dir = self._own_work_dir.path
        self.work_dir = work_dir
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.endpoint_url = ""
        self.model_url = ""
        self.resources: ExperimentResources | None = None
        self.clients = ClientFactory()
        self.wiring: Wiring | None = None
        self.runtime: Any = None
        self.experiment: Any = None
        self.consumers: list[QueueConsumer] = []
        self.sweeper: Schedule | None = None
        #: The first experiment's warm-pool schedule (every experiment's: `_warm_schedules`).
        self.warm: Schedule | None = None
        self._warm_schedules: list[Schedule] = []
        #: Every experiment of the local account by name (the first is `resources`, `wiring`, `experiment`).
        self.experiments: dict[str, LocalExperiment] = {}
        self._lifecycles: list[Any] = []
        self._sweepers: list[Schedule] = []
        #: The HTTP sinks' local consumers (`local.sinks`), every experiment's.
        self.sinks: list[SinkConsumer] = []
        #: The agent processes this run started (not a `runtime_factory`'s runtime, which its caller owns).
        self._agents: Any = None
        self._stop_by = 0.0
        self._stack = contextlib.ExitStack()
        #: MTRL forwarder handlers by experiment (`invoke_mtrl_forwarder`), bound on first use.
        self._forwarders: dict[str, Callable[[dict[str, Any], Any], dict[str, Any]]] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------------------- start / stop

    def start(self) -> LocalPipeline:
        """Start everything (see the module doc). On a failure, whatever started is stopped and a work directory
        this run made is removed (the error says what failed: an agent that cannot start, `AgentStartError`, carries
        its output's tail)."""
        try:
            self.settings.validate()
            self._start()
        except BaseException:
            self.stop()
            if self._own_work_dir is not None:
                self._own_work_dir.remove()
            raise
        return self

    def _start(self) -> None:
        stack = self._stack
        started = time.monotonic()
        if self.settings.aws_profile == faithful.FAITHFUL:
            stack.enter_context(faithful.activate(faithful.FaithfulProfile(seed=self.settings.aws_profile_seed)))
        try:
            self.endpoint_url = stack.enter_context(moto_server(self.settings.port))
        except OSError as exc:
            from rollout_pipeline.sdk import SdkError

            raise SdkError(
                f"local mode cannot listen on 127.0.0.1:{self.settings.port}: {exc.strerror or exc} "
                "(is another `rollouts local up` running there? pass another --port)"
            ) from None
        aws_env = local_aws_environ(self.endpoint_url, REGION)
        # For code of this process given no client (adapters built by a `runtime_factory`): the default factory.
        stack.enter_context(patched_environ(aws_env))
        self.clients = ClientFactory(endpoint_url=self.endpoint_url, region=REGION)
        log.info("moto server on %s", self.endpoint_url)

        if self.settings.model_url:
            self.model_url = self.settings.model_url.rstrip("/")
        else:
            model = LocalModelServer(log_path=self.work_dir / "model.log")
            stack.callback(model.stop)
            self.model_url = model.start()
        log.info("model at %s", self.model_url)

        pool = self.settings.pool_settings()
        create_pool(self.clients.client, region=REGION, settings=pool)
        configs = [self.settings.experiment_config(self.model_url, name) for name in self.settings.names()]
        shared = pool if self.settings.account_pool else False
        every = [create_resources(config, region=REGION, client=self.clients.client, pool=shared) for config in configs]
        for resources in every:
            register_stack(resources, client=self.clients.client)  # a second process attaches by name
        self.resources = every[0]
        handler_env = {  # Powertools reads its own; the handlers get everything else from the wiring
            "POWERTOOLS_SERVICE_NAME": "rollouts-local",
            "POWERTOOLS_METRICS_NAMESPACE": metric_names.METRICS_NAMESPACE,
            "POWERTOOLS_METRICS_DISABLED": "true",
            "POWERTOOLS_LOG_LEVEL": os.environ.get("POWERTOOLS_LOG_LEVEL", "WARNING"),
        }
        stack.enter_context(patched_environ(handler_env))
        # Metrics are off locally, and Powertools says so at every flush of an empty store: noise on `up`'s console.
        warnings.filterwarnings("ignore", message="No application metrics to publish", category=UserWarning)

        # One local AgentCore for the account: every experiment's sessions, under the account's quotas.
        if self.settings.runtime_factory is not None:
            self.runtime = self.settings.runtime_factory(self.resources)
        else:
            self.runtime = self._start_agents(aws_env, pool, configs)
        # An SDK experiment of this process attached to this endpoint (the ART backend) cancels through it too.
        register_local_runtime(self.endpoint_url, self.runtime)
        stack.callback(register_local_runtime, self.endpoint_url, None)

        from rollout_pipeline.sdk import Experiment

        for resources in every:
            # The attempt-token key: random per run and experiment (the stack's is a generated secret).
            key = _key(secrets.token_bytes(32))
            wiring = Wiring(resources.settings(), self.clients, runtime=self.runtime, attempt_key=key)
            consumers, sweeper = self._start_consumers(resources, wiring)
            sdk = Experiment.local(self.endpoint_url, outputs=resources.stack_outputs(), region=REGION)
            # A stream left open (a loop that broke out) removes its subscription while the endpoint is still up.
            stack.callback(sdk.close_streams)
            self.experiments[resources.config.name] = LocalExperiment(resources, wiring, consumers, sweeper, sdk)
        first = self.experiments[self.resources.config.name]
        self.wiring, self.sweeper, self.experiment = first.wiring, first.sweeper, first.sdk
        log.info("local pipeline up in %.1f s (work dir %s)", time.monotonic() - started, self.work_dir)

    def _start_agents(self, aws_env: Mapping[str, str], pool: PoolSettings, configs: Sequence[ExperimentConfig]) -> Any:
        """The local runtime every experiment shares: their sessions together, each session ended at the longest of
        their `max_lifetime_s` (one runtime: AgentCore's is one per experiment)."""
        from rollout_pipeline.local.acr import LocalAgentRuntime

        max_sessions = sum(config.max_sessions for config in configs)

        runtime = LocalAgentRuntime(
            self.settings.agent_module,
            kind=self.settings.agent_kind,
            env={
                **aws_env,
                **({MTRL_RUNTIME_ENV: self.settings.mtrl_runtime_url} if self.settings.mtrl_runtime_url else {}),
                **self.settings.agent_env,
                **({API_KEY_ENV: self.settings.model_api_key} if self.settings.model_api_key else {}),
            },
            # One more process than the experiments' session limits (the ledger's limits are the binding ones), or
            # the account's active sessions when fewer: AgentCore refuses beyond them.
            max_sessions=min(max_sessions + 1, pool.quotas.active_sessions),
            new_sessions_per_s=pool.quotas.new_sessions_per_s,
            max_lifetime_s=max(config.max_lifetime_s for config in configs),
            warm_processes=self.settings.warm_processes,
            isolation="shared" if self.settings.isolation == "shared" else "process",
            startup_timeout_s=self.settings.agent_startup_timeout_s,
            log_dir=self.work_dir / "agents",
        )
        self._stack.callback(runtime.close)
        self._agents = runtime
        runtime.start()
        return runtime

    def _start_consumers(self, res: ExperimentResources, wiring: Wiring) -> tuple[list[QueueConsumer], Schedule]:
        """One experiment's Lambdas: the very handler code, over its wiring (passed down, not installed
        process-wide), with the stack's batch sizes and timeouts (topology), concurrency as the stack's unless
        overridden; and its sweeper on a schedule."""
        import lambdas.completion
        import lambdas.dispatch
        import lambdas.ingest
        import lambdas.sweeper

        specs = consumer_specs(res.config, self.settings.concurrency_overrides)
        queues = {
            "ingest": res.ingest_queue_url,
            "dispatch": res.rollout_queue_url,
            "completion": res.completion_queue_url,
        }
        lifecycle = wiring.lifecycle()
        lifecycle.budget_recheck_s = self.settings.budget_recheck_s
        self._lifecycles.append(lifecycle)
        handlers = {
            "ingest": lambdas.ingest.function.bind(wiring.ingestion()),
            "dispatch": lambdas.dispatch.function.bind(lifecycle),
            "completion": lambdas.completion.function.bind(lifecycle),
        }
        consumers = [
            QueueConsumer(
                name,
                queues[name],
                handlers[name],
                region=REGION,
                clients=self.clients,
                batch_size=spec.batch_size or 1,
                max_concurrency=spec.max_concurrency or 1,
                timeout_s=spec.timeout_s,
            )
            for name, spec in specs.items()
        ]
        if res.config.mtrl_environment:
            consumers.append(self._mtrl_reporter(res, wiring))
        for consumer in consumers:
            consumer.handler = _clearing_metrics(consumer.handler)
            consumer.start()
            self._stack.callback(self._stop_within_grace, consumer.stop)
        self.consumers.extend(consumers)
        self._stack.callback(_clear_metrics)
        sweeper = Schedule(
            "sweeper",
            _clearing_metrics(lambdas.sweeper.function.bind(lifecycle)),
            interval_s=self.settings.sweep_interval_s,
            timeout_s=topology.FUNCTIONS["sweeper"].timeout_s,
        )
        sweeper.start()
        self._sweepers.append(sweeper)
        self._stack.callback(self._stop_within_grace, sweeper.stop)
        for sink_queues in create_sink_resources(res.config, res.bus_name, self.clients.client):
            sink = SinkConsumer(sink_queues, self.clients.client).start()
            self.sinks.append(sink)
            self._stack.callback(self._stop_within_grace, sink.stop)
        lifecycle.warm_loop_s = 0.0  # the warm pool ticks on its own schedule here (the stack: in the sweeper)
        if res.config.warm_pool_on:
            warm = Schedule("warm-pool", _warm_tick(lifecycle), interval_s=self.settings.warm_interval_s)
            warm.start()
            self._warm_schedules.append(warm)
            self.warm = self.warm or warm
            self._stack.callback(self._stop_within_grace, warm.stop)
        return consumers, sweeper

    def _mtrl_reporter(self, res: ExperimentResources, wiring: Wiring) -> QueueConsumer:
        """MTRL environment mode's reporter (the stack's numbers), reporting to `mtrl_runtime_url`."""
        import lambdas.mtrl_reporter

        assert self.settings.mtrl_runtime_url, "LocalSettings.validate requires it in MTRL environment mode"
        spec = topology.MTRL_FUNCTIONS["mtrl_reporter"]
        return QueueConsumer(
            "mtrl_reporter",
            res.queue_urls[topology.MTRL_REPORT_QUEUE],
            lambdas.mtrl_reporter.function.bind(wiring.mtrl_reporter(self.settings.mtrl_runtime_url)),
            region=REGION,
            clients=self.clients,
            batch_size=spec.batch_size or 1,
            max_concurrency=spec.max_concurrency or 1,
            timeout_s=spec.timeout_s,
        )

    def invoke_mtrl_forwarder(self, event: Any, experiment: str | None = None) -> dict[str, Any]:
        """Invoke the MTRL forwarder Lambda of `experiment` (the first by default) as SageMaker MTRL does: the very
        handler, synchronously, with a Lambda context whose ARN is the local account's and region's."""
        import lambdas.mtrl_forwarder

        local = self.experiments[experiment or self.settings.experiment]
        if not local.resources.config.mtrl_environment:
            raise ConfigError(f"experiment {local.resources.config.name} is not in MTRL environment mode")
        with self._lock:
            bound = self._forwarders.get(local.resources.config.name)
            if bound is None:
                bound = lambdas.mtrl_forwarder.function.bind(local.wiring.mtrl_forwarder())
                self._forwarders[local.resources.config.name] = bound
        name = f"{topology.resource_base(local.resources.config.name)}-mtrl-forwarder"
        context = LambdaContext(
            function_name=name,
            timeout_s=topology.MTRL_FUNCTIONS["mtrl_forwarder"].timeout_s,
            invoked_function_arn=f"arn:aws:lambda:{REGION}:{LOCAL_ACCOUNT}:function:{name}",
        )
        try:
            return bound(event, context)
        finally:
            _clear_metrics()

    def begin_stop(self) -> None:
        """Tell every consumer and the sweeper to take no more work, end the dispatchers' waits for a session slot
        (their messages are re-sent, as at the end of a Lambda's wait budget) and stop the agent processes, without
        waiting: what runs winds down while moto is still up (`stop` then waits for it, briefly, and stops the
        rest)."""
        for consumer in self.consumers:
            consumer.request_stop()
        for sweeper in self._sweepers:
            sweeper.request_stop()
        for warm in self._warm_schedules:
            warm.request_stop()
        for sink in self.sinks:
            sink.request_stop()
        for lifecycle in self._lifecycles:
            lifecycle.limits.gate.close()
        if self._agents is not None:  # sessions end with the run; an invoke still starting a process gives up
            self._agents.close()

    def stop(self) -> None:
        """Stop everything that was started, in reverse order (idempotent). The consumers and the sweeper get
        `STOP_GRACE_S` in all to finish what they are doing (`begin_stop` first). The work directory is kept."""
        self.begin_stop()
        self._stop_by = time.monotonic() + STOP_GRACE_S
        self._stack.close()
        if self._own_work_dir is not None:
            self._own_work_dir.keep()

    def _stop_within_grace(self, stop: Callable[[float], None]) -> None:
        stop(max(0.0, self._stop_by - time.monotonic()))

    def __enter__(self) -> LocalPipeline:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -------------------------------------------------------------------------------------------------- views

    def active_sessions(self) -> list[str]:
        """Agent sessions not stopped yet (each terminal rollout must have stopped its own)."""
        return list(self.runtime.sessions()) if self.runtime is not None else []

    def dead_letters(self, experiment: str | None = None) -> dict[str, int]:
        """Messages in each dead-letter queue of `experiment` (the first by default; a healthy run has none)."""
        resources = self.experiments[experiment].resources if experiment else self.resources
        assert resources is not None
        sqs = self.clients.client("sqs")
        counts = {}
        for name, url in resources.dlq_urls.items():
            attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
            counts[name] = int(attrs["Attributes"]["ApproximateNumberOfMessages"])
        return counts


@dataclass(frozen=True)
class LocalExperiment:
    """One experiment of the local account: its resources, wiring, Lambdas (queue consumers, the sweeper) and the
    SDK attached to it."""

    resources: ExperimentResources
    wiring: Wiring
    consumers: list[QueueConsumer]
    sweeper: Schedule
    sdk: Any


def consumer_specs(config: ExperimentConfig, overrides: Mapping[str, int]) -> dict[str, topology.FunctionSpec]:
    """The queue consumers local mode runs: the stack's numbers (`topology.function_specs`), with the concurrency
    of each function named in `overrides` replaced, and every override logged next to the stack's value."""
    specs: dict[str, topology.FunctionSpec] = {}
    for name, spec in topology.function_specs(config).items():
        if not spec.queue_fed:
            continue
        specs[name] = spec
        if name in overrides and overrides[name] != spec.max_concurrency:
            log.info("local mode: %s runs %d consumer(s) (the stack: %s)", name, overrides[name], spec.max_concurrency)
            specs[name] = replace(spec, max_concurrency=overrides[name])
    return specs


#: A local warm-pool tick may wait this long for its warm-ups (an agent process takes seconds to start).
WARM_TICK_BUDGET_S = 60.0


def _warm_tick(lifecycle: Any) -> Callable[[dict[str, Any], Any], Any]:
    """One tick of the warm pool (`lifecycle.warm_pool`), as a scheduled handler."""
    from rollout_pipeline.lifecycle.warm_pool import WarmPool

    pool = WarmPool(lifecycle)

    def tick(_event: dict[str, Any], _context: Any) -> Any:
        return pool.tick(budget_s=WARM_TICK_BUDGET_S)

    return tick


def _key(value: bytes) -> Callable[[], bytes]:
    return lambda: value


def _clear_metrics() -> None:
    from aws_lambda_powertools import Metrics

    Metrics().clear_metrics()


def _clearing_metrics(handler: Callable[[dict[str, Any], Any], Any]) -> Callable[[dict[str, Any], Any], Any]:
    """Run a handler, then empty Powertools' metric store. Local mode disables metrics (EMF lines on stdout would
    bury the demo), and disabled metrics are never flushed, so without this they pile up in Powertools' process-wide
    store for as long as the pipeline runs (and leak into whatever runs next in the process)."""

    def run(event: dict[str, Any], context: Any) -> Any:
        try:
            return handler(event, context)
        finally:
            _clear_metrics()

    return run


@contextlib.contextmanager
def interrupt_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGINT into KeyboardInterrupt in the main thread, so `with LocalPipeline(...)` cleans up.
    SIGINT too: a process started with SIGINT ignored (inherited from its parent, e.g. a test runner's worker) would
    otherwise never see Ctrl-C, and Python installs its own handler only when SIGINT is at its default."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous_term = signal.signal(signal.SIGTERM, raise_interrupt)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous_int)
        signal.signal(signal.SIGTERM, previous_term)
