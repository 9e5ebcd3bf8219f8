"""The shape of one deployed experiment: names, stack outputs and the numbers of each pipeline function.

One home for these facts. The CDK stack (`stacks/`), cdk-nag's acknowledgements, local mode (`local/`), the SDK and
the CLI read them from here, and `tests/infra/test_topology.py` checks the synthesized stack against them, so local
mode cannot drift from the stack again. Plain Python and pydantic only (no CDK, no boto3): Lambdas import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from rollout_pipeline.config import DISPATCH_BATCH as DISPATCH_BATCH_SIZE
from rollout_pipeline.config import RESOURCE_FIELDS, ExperimentConfig, HandlerSettings

#: CloudFormation stack of an experiment: `Rollouts-{name}`.
STACK_PREFIX: Final = "Rollouts-"
#: Physical names the stack and local mode give an experiment's resources: `rollouts-{name}[-suffix]`.
RESOURCE_PREFIX: Final = "rollouts-"

FunctionName = Literal["ingest", "dispatch", "completion", "sweeper", "mtrl_forwarder", "mtrl_reporter"]
#: The pipeline's Lambda functions; each has a module `lambdas/{name}.py` with a `handler`.
FUNCTION_NAMES: Final[tuple[FunctionName, ...]] = ("ingest", "dispatch", "completion", "sweeper")
#: The MTRL environment mode's functions (`mtrl_environment`; only in a stack with it on, `MTRL_FUNCTIONS`): the
#: forwarder SageMaker MTRL invokes per rollout, and the reporter fed by the forwarded rollouts' terminal events.
MTRL_FUNCTION_NAMES: Final[tuple[FunctionName, ...]] = ("mtrl_forwarder", "mtrl_reporter")
#: AWS guidance for Lambda consumers of SQS: visibility timeout at least 6x the function timeout.
VISIBILITY_TIMEOUT_FACTOR: Final = 6
#: SQS's maximum visibility timeout.
MAX_VISIBILITY_TIMEOUT_S: Final = 12 * 3600
#: The trainer queue's visibility timeout: how long an event received by the SDK stays hidden from other readers.
TRAINER_VISIBILITY_TIMEOUT_S: Final = 60
#: Receives before a message of a work queue goes to its dead-letter queue.
DLQ_MAX_RECEIVE_COUNT: Final = 5


#: The account pool: one stack and one table per account and region, created by `rollouts bootstrap`; every
#: experiment stack imports the table's name from the pool stack's export (so an experiment cannot be deployed into an
#: account without it, and the pool cannot be deleted while an experiment uses it).
POOL_STACK_NAME: Final = "RolloutsPool"
POOL_TABLE_NAME: Final = "rollouts-pool"
POOL_TABLE_EXPORT: Final = "rollouts-pool-table"


def stack_name(experiment: str) -> str:
    """The CloudFormation stack of experiment `experiment`."""
    return f"{STACK_PREFIX}{experiment}"


def resource_base(experiment: str) -> str:
    """The prefix of the experiment's physical resource names (also the event bus name)."""
    return f"{RESOURCE_PREFIX}{experiment}"


def bus_name(experiment: str) -> str:
    """The experiment's custom event bus."""
    return resource_base(experiment)


def bus_experiment(bus: str) -> str:
    """The experiment of custom event bus `bus` (`bus_name`'s inverse)."""
    return bus.removeprefix(RESOURCE_PREFIX)


#: The cost-allocation tag every resource of an experiment carries (its value: the experiment), the stack's and the
#: private subscriptions processes add to its bus.
COST_TAG: Final = "rollouts:experiment"


#: Messages one SQS ReceiveMessage returns at most; a Lambda batch beyond it needs a batching window.
SQS_RECEIVE_MAX: Final = 10


@dataclass(frozen=True)
class FunctionSpec:
    """The numbers of one pipeline function and (for a queue consumer) its SQS event source mapping."""

    name: FunctionName
    timeout_s: int
    memory_mb: int
    #: None for the scheduled sweeper (no queue).
    batch_size: int | None = None
    batching_window_s: int = 0
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        if self.batch_size is not None and self.batch_size > SQS_RECEIVE_MAX and self.batching_window_s < 1:
            raise ValueError(
                f"{self.name}: an SQS batch of {self.batch_size} (> {SQS_RECEIVE_MAX}) needs a batching window of"
                " at least 1 s (Lambda's rule for standard queues)"
            )

    @property
    def queue_fed(self) -> bool:
        return self.batch_size is not None

    @property
    def visibility_timeout_s(self) -> int:
        """The visibility timeout of the queue feeding it: 6x the function timeout (capped at SQS's 12 h), so a
        message is not redelivered while a retried invocation of its batch may still run."""
        return min(self.timeout_s * VISIBILITY_TIMEOUT_FACTOR, MAX_VISIBILITY_TIMEOUT_S)


#: The table. Dispatch's concurrency is the experiment's `dispatch_concurrency` (see `function_specs`).
FUNCTIONS: Final[Mapping[FunctionName, FunctionSpec]] = {
    "ingest": FunctionSpec("ingest", timeout_s=900, memory_mb=1024, batch_size=1, max_concurrency=5),
    "dispatch": FunctionSpec(
        "dispatch", timeout_s=180, memory_mb=512, batch_size=DISPATCH_BATCH_SIZE, batching_window_s=1
    ),
    "completion": FunctionSpec(
        "completion", timeout_s=60, memory_mb=512, batch_size=10, batching_window_s=1, max_concurrency=10
    ),
    "sweeper": FunctionSpec("sweeper", timeout_s=120, memory_mb=512),
}
#: The MTRL environment mode's functions. The forwarder answers MTRL at once (a few ledger writes and one send).
MTRL_FUNCTIONS: Final[Mapping[FunctionName, FunctionSpec]] = {
    "mtrl_forwarder": FunctionSpec("mtrl_forwarder", timeout_s=30, memory_mb=512),
    "mtrl_reporter": FunctionSpec(
        "mtrl_reporter", timeout_s=60, memory_mb=512, batch_size=10, batching_window_s=1, max_concurrency=5
    ),
}
#: The MTRL reporter's queue (the forwarded rollouts' `Rollout Completed` / `Rollout Failed` events).
MTRL_REPORT_QUEUE: Final = "mtrl-report"
#: Rollouts one dispatcher Lambda holds at once: its SQS batch.
DISPATCH_BATCH: Final = FUNCTIONS["dispatch"].batch_size or 1
#: Queue of each queue-fed function, by the name local mode and the dashboard give it.
FUNCTION_QUEUES: Final[Mapping[FunctionName, str]] = {
    "ingest": "ingest",
    "dispatch": "rollout",
    "completion": "completion",
}


def function_specs(config: ExperimentConfig) -> dict[FunctionName, FunctionSpec]:
    """Every function's numbers for this experiment (the dispatcher's concurrency is configurable)."""
    specs = dict(FUNCTIONS)
    specs["dispatch"] = replace(specs["dispatch"], max_concurrency=config.dispatch_concurrency)
    return specs


def dispatchers_hold(config: ExperimentConfig) -> int:
    """Rollouts the experiment's dispatchers hold at once: `dispatch_concurrency` x `DISPATCH_BATCH`."""
    return config.dispatch_concurrency * DISPATCH_BATCH


#: The warm pool's queue of offers (`lifecycle.warm`), made with `warm_sessions` on: an offer a dispatcher received
#: stays hidden for as long as a dispatcher can hold it (its function's timeout), and no offer outlives a session.
#: No dead-letter queue: an offer is received and given back many times, and one never used expires.
WARM_QUEUE: Final = "warm"


def warm_queue_attributes(config: ExperimentConfig) -> dict[str, int]:
    """The warm queue's visibility timeout and retention (s): the dispatcher's timeout, and `max_lifetime_s`."""
    return {
        "VisibilityTimeout": FUNCTIONS["dispatch"].timeout_s,
        "MessageRetentionPeriod": max(60, config.max_lifetime_s),
    }


def queue_visibility_timeouts(config: ExperimentConfig) -> dict[str, int]:
    """Visibility timeout of every queue of the experiment, by queue name (local mode creates them from this)."""
    specs = function_specs(config)
    timeouts = {queue: specs[function].visibility_timeout_s for function, queue in FUNCTION_QUEUES.items()}
    timeouts["trainer"] = TRAINER_VISIBILITY_TIMEOUT_S
    if config.mtrl_environment:
        timeouts[MTRL_REPORT_QUEUE] = MTRL_FUNCTIONS["mtrl_reporter"].visibility_timeout_s
    return timeouts


class StackOutputs(BaseModel):
    """The outputs of an experiment stack that the SDK, the CLI and local mode read (their keys are the contract).

    Each field's alias is the output's key (`ExperimentName`, ...): `from_outputs` validates a mapping such as
    CloudFormation's, `cdk deploy --outputs-file`'s or local mode's; `to_outputs` writes one back.
    """

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    experiment_name: str = Field(alias="ExperimentName", min_length=1)
    experiment_config: str = Field(
        alias="ExperimentConfig", min_length=1, description="The experiment configuration (JSON) the Lambdas run with"
    )
    input_bucket: str = Field(alias="InputBucketName", min_length=1)
    results_bucket: str = Field(alias="ResultsBucketName", min_length=1)
    rollout_queue_url: str = Field(
        alias="RolloutQueueUrl", min_length=1, description="Submit queue: the SDK sends rollout messages here"
    )
    trainer_queue_url: str = Field(
        alias="TrainerQueueUrl", min_length=1, description="Every pipeline event; the trainer long-polls this queue"
    )
    bus_name: str = Field(alias="EventBusName", min_length=1)
    table_name: str = Field(alias="LedgerTableName", min_length=1)
    ingest_queue_url: str = Field(alias="IngestQueueUrl", default="")
    runtime_arn: str = Field(alias="AgentRuntimeArn", default="")
    pool_table_name: str = Field(
        alias="PoolTableName", default="", description="The account pool's table (shared by every experiment)"
    )

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every output the stack exports for the SDK (the logical ids of its CfnOutputs)."""
        return tuple(str(info.alias) for info in cls.model_fields.values())

    @classmethod
    def required(cls) -> tuple[str, ...]:
        """The outputs an attach cannot do without."""
        return tuple(str(info.alias) for info in cls.model_fields.values() if info.is_required())

    @classmethod
    def descriptions(cls) -> dict[str, str]:
        """Output key -> its description (for the CfnOutputs that have one)."""
        return {str(info.alias): info.description for info in cls.model_fields.values() if info.description}

    @classmethod
    def missing(cls, outputs: Mapping[str, str]) -> list[str]:
        """The required outputs absent (or empty) in `outputs`."""
        return [name for name in cls.required() if not outputs.get(name)]

    @classmethod
    def from_outputs(cls, outputs: Mapping[str, str]) -> StackOutputs:
        return cls.model_validate(dict(outputs))

    def to_outputs(self) -> dict[str, str]:
        return self.model_dump(by_alias=True)

    def config(self) -> ExperimentConfig:
        return ExperimentConfig.from_env(self.experiment_config)

    def handler_settings(self, config: ExperimentConfig | None = None) -> HandlerSettings:
        """The settings the stack gives its functions (local mode's consumers and the SDK's stages use them);
        `config`: the experiment configuration when already parsed (`config()`)."""
        return HandlerSettings(
            **self.model_dump(include=set(RESOURCE_FIELDS)), experiment=config if config is not None else self.config()
        )


#: The variable naming the attempt-token key's secret (`adapters.attempt_key`): given only to the functions that
#: issue or check attempt tokens (dispatch, completion, sweeper), so it is not part of `FunctionEnvironment`.
ATTEMPT_KEY_ENV: Final = "ATTEMPT_KEY_SECRET_ARN"


#: Outputs for the operator (the SDK does not read them).
OPERATOR_OUTPUT_NAMES: Final = ("AlarmTopicArn", "DashboardUrl", "AgentImageUri", "TrainerPolicyArn")
