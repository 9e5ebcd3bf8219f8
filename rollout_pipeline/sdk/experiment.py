"""`Experiment`: one deployed (or local) experiment, attached by name, and everything a trainer does with it, by
topic: `exp.batches`, `exp.events`, `exp.subscriptions`, `exp.data`, `exp.capacity`, `exp.cost`.

Each topic is a small object of its own module (`sdk/batches.py`, `sdk/events.py`, `sdk/data.py`, `sdk/capacity.py`,
`sdk/cost.py`) over the experiment's resources (`sdk/handle.py`); none of them imports this module.
"""

from __future__ import annotations

import functools
import os
import types
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from rollout_pipeline import ids, topology
from rollout_pipeline.sdk import route
from rollout_pipeline.sdk._aws import AwsClients, aws_errors
from rollout_pipeline.sdk.batches import Batches
from rollout_pipeline.sdk.capacity import Capacity
from rollout_pipeline.sdk.cost import Cost
from rollout_pipeline.sdk.data import Data
from rollout_pipeline.sdk.errors import AwsError, ExperimentNotDeployed, SdkError
from rollout_pipeline.sdk.events import Events, Subscriptions
from rollout_pipeline.sdk.handle import ExperimentHandle
from rollout_pipeline.sdk.operations import LaunchOptions, Operations, operations

if TYPE_CHECKING:
    from rollout_pipeline.sdk.client import RolloutClient

#: The experiment's CloudFormation stack and its outputs: `rollout_pipeline.topology`.
stack_name = topology.stack_name
#: Stack outputs from a JSON file (`cdk deploy --outputs-file`, `rollouts local up --write-outputs`).
read_outputs_file = route.read_outputs_file

TopicT = TypeVar("TopicT")
VerbP = ParamSpec("VerbP")
ResultT = TypeVar("ResultT")


class Alias(Generic[TopicT, VerbP, ResultT]):
    """A name of `Experiment` for a verb of one of its topics (`exp.submit_file` is `exp.batches.submit_file`),
    kept because code written before the topics calls it; the verb's own documentation is on the topic. (A verb
    that takes `**kwargs` marks `self` positional-only: `Concatenate` needs it to keep the verb's signature.)"""

    def __init__(self, topic: str, verb: Callable[Concatenate[TopicT, VerbP], ResultT]) -> None:
        self.topic = topic
        self.verb = verb
        self.__doc__ = f"`exp.{topic}.{verb.__name__}`: {verb.__doc__ or ''}"

    @overload
    def __get__(self, experiment: None, owner: type) -> Alias[TopicT, VerbP, ResultT]: ...

    @overload
    def __get__(self, experiment: Experiment, owner: type) -> Callable[VerbP, ResultT]: ...

    def __get__(
        self, experiment: Experiment | None, owner: type
    ) -> Alias[TopicT, VerbP, ResultT] | Callable[VerbP, ResultT]:
        if experiment is None:
            return self
        bound: Callable[VerbP, ResultT] = types.MethodType(self.verb, getattr(experiment, self.topic))
        return bound


class Experiment(ExperimentHandle):
    """A handle on one experiment's resources (buckets, queues, bus, ledger), from its stack outputs, and what a
    trainer does with it, by topic:

    - `exp.batches`: submit work (`submit_file`, `submit`), a batch's `status` and `rollout_states`, `cancel`,
      `set_policy_version`;
    - `exp.events(batch_id, ...)`: a stream of pushed events; `exp.events.groups(batch)`, `subscribe`, `tap`,
      `completed_groups`, `replay` (rebuilt from the ledger), `aio` / `agroups` (asyncio);
    - `exp.subscriptions`: the private subscriptions on the bus (`open`, `close`, `touch`, `list`, `prune`);
    - `exp.data`: `export`, `export_dataset`, `rescore`, `stats`;
    - `exp.capacity()`: the account pool; `exp.capacity.warm_pool()`, `stop_warm_pool`;
    - `exp.cost(batch)`: what it cost; `exp.cost.budget()`, `set_budget`.

    The experiment itself: `attach`, `from_outputs`, `local`, `launch`, `destroy`, `close`, `rollout_client`,
    `fetch_result`, `price_book`, `client(service)`, the resources' names. The flat names code used before the
    topics (`exp.submit_file`, `exp.groups`, `exp.status`, ...) are kept as aliases of their topic's verb (the list
    at the end of the class; docs/sdk.md, "Flat names").

    Create it with `Experiment.attach(name)` (reads the CloudFormation outputs once), `Experiment.from_outputs(...)`
    or `Experiment.local(endpoint_url, name=...)` (local mode: every client talks to that endpoint).
    Region and credentials come from the usual boto3 chain unless a `session` / `region` is given.
    Thread-safe: the dispatcher thread of a `RolloutClient` shares it with the caller.
    """

    #: Stops what a launcher started for this experiment (local mode); None for a deployed stack.
    _teardown: Callable[[], None] | None = None

    # ---------------------------------------------------------------------------------------------- attach

    @classmethod
    def attach(
        cls, name: str, region: str | None = None, session: Any | None = None, *, endpoint_url: str | None = None
    ) -> Experiment:
        """Attach to the deployed experiment `name`: one DescribeStacks of stack `Rollouts-{name}`.

        `endpoint_url` (default `$ROLLOUTS_ENDPOINT_URL`): a local pipeline's endpoint, where `rollouts local up`
        registers the same stack. Raises `ExperimentNotDeployed` when the stack does not exist, `NoCredentials`
        without AWS credentials.
        """
        endpoint_url = route.endpoint_from_env(endpoint_url)
        try:
            ids.validate_exp_id(name)
        except ids.InvalidId as exc:
            raise SdkError(f"invalid experiment name: {exc}") from None
        aws = AwsClients(session=session, region=region, endpoint_url=endpoint_url)
        stack = stack_name(name)
        try:
            with aws_errors(f"describe stack {stack}"):
                resp = aws.client("cloudformation").describe_stacks(StackName=stack)
        except AwsError as exc:
            if "does not exist" in str(exc) or "ValidationError" in str(exc):
                if endpoint_url is not None:
                    raise ExperimentNotDeployed(
                        f"no experiment {name!r} at {endpoint_url} (start it with `rollouts local up -e {name}`, "
                        "or check the name and the endpoint `rollouts local up` printed)"
                    ) from None
                where = f" in {aws.region}" if aws.region else ""
                raise ExperimentNotDeployed(
                    f"experiment {name!r} is not deployed{where} (no stack {stack}); "
                    f"deploy it with `rollouts deploy -e {name}` (Experiment.launch) or check --region"
                ) from None
            raise
        stacks = resp.get("Stacks") or []
        if not stacks:
            raise ExperimentNotDeployed(f"experiment {name!r} is not deployed (no stack {stack})")
        status = str(stacks[0].get("StackStatus", ""))
        if status.endswith("_FAILED") or status.startswith("DELETE") or status == "ROLLBACK_COMPLETE":
            raise ExperimentNotDeployed(f"experiment {name!r}: stack {stack} is in state {status}")
        outputs = {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs") or []}
        return cls(outputs, session=aws.session, region=region, endpoint_url=endpoint_url)

    @classmethod
    def from_outputs(
        cls,
        outputs: route.OutputsSource,
        region: str | None = None,
        session: Any | None = None,
        *,
        endpoint_url: str | None = None,
        name: str | None = None,
    ) -> Experiment:
        """An experiment from its stack outputs: a dict (flat, or `cdk deploy --outputs-file`'s `{stack: {...}}`:
        the stack of experiment `name`, or the only one), that file's path, or its JSON text."""
        endpoint = route.endpoint_from_env(endpoint_url)
        return cls(route.stack_outputs(outputs, name), session=session, region=region, endpoint_url=endpoint)

    @classmethod
    def local(
        cls,
        endpoint_url: str | None = None,
        outputs: route.OutputsSource | None = None,
        *,
        name: str | None = None,
        region: str = "us-east-1",
        session: Any | None = None,
    ) -> Experiment:
        """An experiment in local mode: every AWS call goes to `endpoint_url` (a local pipeline's loopback AWS).

        The way `rollouts local up` prints: `Experiment.local(endpoint_url, name=NAME)` attaches by name (local
        mode registers the experiment's stack outputs at its endpoint). `outputs` instead: the outputs themselves,
        in any form `from_outputs` takes (a dict, flat or wrapped; the `--write-outputs` file's path; its JSON
        text). `endpoint_url` and `name` default to `$ROLLOUTS_ENDPOINT_URL` and `$ROLLOUTS_EXPERIMENT`.
        """
        endpoint = route.endpoint_from_env(endpoint_url)
        if endpoint is None:
            raise SdkError(
                "Experiment.local needs the endpoint URL `rollouts local up` printed (or $ROLLOUTS_ENDPOINT_URL)"
            )
        if outputs is not None:
            found = route.stack_outputs(outputs, route.experiment_from_env(name) if name is None else name)
            return cls(found, session=session, region=region, endpoint_url=endpoint)
        experiment = route.experiment_from_env(name)
        if experiment is None:
            raise SdkError(
                "Experiment.local needs the local experiment's name (name=..., or $ROLLOUTS_EXPERIMENT) or its outputs"
            )
        return cls.attach(experiment, region=region, session=session, endpoint_url=endpoint)

    # ---------------------------------------------------------------------------------------------- launch

    # ------------------------------------------------------------------------------------- launch, destroy

    @classmethod
    def launch(cls, name: str, mode: str = "deployed", **given: Any) -> Experiment:
        """Start experiment `name` and return it attached, in either mode, so the same trainer code runs against
        both. `given`: the launch's options (`LaunchOptions`: `yes`, `force`, `region`, `session`, `project_dir`,
        `local_options`, `out`) and the experiment's settings (every other keyword: `ExperimentConfig`'s fields and
        the stack's own keys, as `cdk deploy -c key=value` takes them).

        - `mode="deployed"`: validate the settings, run the preflight, deploy the project's CDK app through its
          CDK CLI (`node_modules/.bin/cdk`, installed by `make setup`) with live progress. Nothing happens when
          the stack is up to date; changes are shown (`cdk diff`) and confirmed unless `yes=True`. An update
          refuses while rollouts are in flight (drain before upgrading) unless `force=True`; a new ledger layout
          or a new `endpoints` refuses even then (docs/deploy.md, "Upgrades").
        - `mode="local"`: start the local pipeline in this process (moto on loopback, the Lambda handlers as
          consumers, agent processes); it stops at `destroy()`, at the end of a `with` block or at exit.
          `local_options`: local mode's own settings (`LocalSettings` fields: `agent_module`, `work_dir`, ...).

        Raises `SdkError` (one line, what to do) for a bad option or setting, missing credentials or bootstrap, a
        stack in a failed state, a missing CLI, and `DeployFailed` naming the first resource that failed.
        """
        options, settings = LaunchOptions.split(given)
        operator: Operations[Experiment] = operations()
        return operator.launch(name, mode, settings, options)

    def destroy(
        self,
        keep_results: bool = True,
        force: bool = False,
        *,
        yes: bool = True,
        project_dir: str | os.PathLike[str] | None = None,
        out: IO[str] | None = None,
    ) -> None:
        """Tear the experiment down. Local mode: stop the local pipeline. Deployed: refuse while rollouts are in
        flight or queued unless `force` (then cancel their batches first), remove the SDK's subscriptions from
        the bus, empty and delete the results bucket unless `keep_results`, then `cdk destroy` the stack. Resources
        the stack retains (`results_retention=retain`: ledger table, buckets) stay. `yes=False` asks first."""
        if self._teardown is not None:
            self._teardown()
            return
        operator: Operations[Experiment] = operations()
        operator.destroy(self, keep_results=keep_results, force=force, yes=yes, project_dir=project_dir, out=out)

    def close(self) -> None:
        """Close the event streams this object opened, then stop what `launch` started for this experiment in this
        process (local mode); a deployed stack stays."""
        self.close_streams()
        if self._teardown is not None:
            self._teardown()

    def on_destroy(self, teardown: Callable[[], None]) -> None:
        """Run `teardown` on `destroy()` and `close()` instead of destroying a stack (a launcher's mode, e.g. local
        mode stopping its processes)."""
        self._teardown = teardown

    def __enter__(self) -> Experiment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------------- topics

    @functools.cached_property
    def batches(self) -> Batches:
        """Submit work and follow batches: `submit_file`, `submit`, `status`, `rollout_states`, `cancel`, ..."""
        return Batches(self)

    @functools.cached_property
    def events(self) -> Events:
        """Pushed events: `exp.events(batch_id, ...)` is a stream; `groups`, `subscribe`, `tap`, `completed_groups`,
        `replay`, `aio`, `agroups`."""
        return Events(self)

    @functools.cached_property
    def subscriptions(self) -> Subscriptions:
        """The private subscriptions on the experiment bus: `open`, `close`, `touch`, `list`, `prune`."""
        return Subscriptions(self)

    @functools.cached_property
    def data(self) -> Data:
        """What the rollouts left: `export`, `export_dataset`, `rescore`, `stats`."""
        return Data(self)

    @functools.cached_property
    def capacity(self) -> Capacity:
        """The sessions the experiment may hold: `exp.capacity()` is the account pool; `warm_pool`,
        `stop_warm_pool`."""
        return Capacity(self)

    @functools.cached_property
    def cost(self) -> Cost:
        """What it cost: `exp.cost(batch=None, limit=20)`; `budget`, `set_budget`."""
        return Cost(self)

    def rollout_client(self, **defaults: Any) -> RolloutClient:
        """An ART-style client (`invoke`, `run_batch`, futures) over this experiment; see `RolloutClient`."""
        from rollout_pipeline.sdk.client import RolloutClient

        return RolloutClient(self, **defaults)

    # ----------------------------------------------------------------------------------------- flat names

    submit_file = Alias("batches", Batches.submit_file)
    submit = Alias("batches", Batches.submit)
    submit_rows = Alias("batches", Batches.submit_rows)
    file_options = Alias("batches", Batches.file_options)
    status = Alias("batches", Batches.status)
    rollout_states = Alias("batches", Batches.rollout_states)
    cancel = Alias("batches", Batches.cancel)
    cancel_rollout = Alias("batches", Batches.cancel_rollout)
    set_policy_version = Alias("batches", Batches.set_policy_version)
    groups = Alias("events", Events.groups)
    agroups = Alias("events", Events.agroups)
    aevents = Alias("events", Events.aio)
    subscribe = Alias("events", Events.subscribe)
    tap = Alias("events", Events.tap)
    ledger_events = Alias("events", Events.replay)
    completed_groups = Alias("events", Events.completed_groups)
    open_subscription = Alias("subscriptions", Subscriptions.open)
    close_subscription = Alias("subscriptions", Subscriptions.close)
    touch_subscription = Alias("subscriptions", Subscriptions.touch)
    list_subscriptions = Alias("subscriptions", Subscriptions.list)
    prune_subscriptions = Alias("subscriptions", Subscriptions.prune)
    export = Alias("data", Data.export)
    export_dataset = Alias("data", Data.export_dataset)
    rescore = Alias("data", Data.rescore)
    stats = Alias("data", Data.stats)
    warm_pool = Alias("capacity", Capacity.warm_pool)
    stop_warm_pool = Alias("capacity", Capacity.stop_warm_pool)
    budget = Alias("cost", Cost.budget)
    set_budget = Alias("cost", Cost.set_budget)
