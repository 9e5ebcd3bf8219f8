"""What `cdk destroy` (and a failed first deploy) does to the experiment's data: one removal policy for the stack.

`results_retention=retain` keeps the buckets, the table, the log groups and the image repository on `cdk destroy`
and on replacement, but not when the stack's CREATION fails: CloudFormation keeps `DeletionPolicy: Retain`
resources even when a create rolls back, and a named one left behind makes the next create fail with "already
exists". `RETAIN_ON_UPDATE_OR_DELETE` (CloudFormation `RetainExceptOnCreate`) deletes what a failed create made.
https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/aws-attribute-deletionpolicy.html
"""

from __future__ import annotations

from typing import Final

from aws_cdk import RemovalPolicy

from rollout_pipeline.config import ExperimentConfig

#: The removal policy of everything the stack retains (never plain RETAIN: see the module docstring).
RETAINED: Final = RemovalPolicy.RETAIN_ON_UPDATE_OR_DELETE


def removal_policy(config: ExperimentConfig) -> RemovalPolicy:
    """RETAIN_ON_UPDATE_OR_DELETE with `results_retention=retain` (default), DESTROY with `destroy`."""
    return RemovalPolicy.DESTROY if config.results_retention == "destroy" else RETAINED


def is_retained(removal: RemovalPolicy) -> bool:
    return removal != RemovalPolicy.DESTROY
