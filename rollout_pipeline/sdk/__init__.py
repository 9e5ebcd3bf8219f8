"""Trainer SDK: attach to an experiment, submit work, consume pushed events, ART-style futures.

```python
from rollout_pipeline.sdk import Experiment

exp = Experiment.attach("my-exp")
batch = exp.batches.submit_file("train.jsonl", group_size=8)
for group in exp.events.groups(batch):
    print(group.input_id, group.advantages())
```
See docs/sdk.md for the full reference.
"""

from rollout_pipeline.contracts import DetailType
from rollout_pipeline.sdk.client import BatchItem, BatchResult, CancelledError, RolloutClient, RolloutFuture
from rollout_pipeline.sdk.errors import (
    AwsError,
    BatchNotFound,
    DatasetInvalid,
    DeployFailed,
    ExperimentNotDeployed,
    NoCredentials,
    RolloutFailedError,
    SdkError,
)
from rollout_pipeline.sdk.events import AsyncStream, Event, EventStream, Group, GroupStream
from rollout_pipeline.sdk.experiment import Experiment, stack_name
from rollout_pipeline.sdk.status import BatchStatus

__all__ = [
    "AsyncStream",
    "AwsError",
    "BatchItem",
    "BatchNotFound",
    "BatchResult",
    "BatchStatus",
    "CancelledError",
    "DatasetInvalid",
    "DeployFailed",
    "DetailType",
    "Event",
    "EventStream",
    "Experiment",
    "ExperimentNotDeployed",
    "Group",
    "GroupStream",
    "NoCredentials",
    "RolloutClient",
    "RolloutFailedError",
    "RolloutFuture",
    "SdkError",
    "stack_name",
]
