"""The experiment's S3 buckets: input (datasets, claims), results (agent output) and their access logs."""

from __future__ import annotations

from typing import Any

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import custom_resources as cr
from constructs import Construct

from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.ids import CLAIMS_PREFIX
from stacks.retention import is_retained, removal_policy

ACCESS_LOGS_EXPIRATION_DAYS = 90


class Storage(Construct):
    """Input and results buckets with a shared server-access-logs bucket.

    Encryption is SSE-S3: every writer (the ACR agent, the Lambdas, the trainer's uploads) and every reader works
    without KMS key grants, there is no per-request KMS cost or throttling on a results bucket that receives one
    object per rollout, and EventBridge notifications need no key policy. Nothing here needs a customer-managed key.
    """

    def __init__(self, scope: Construct, construct_id: str, *, config: ExperimentConfig) -> None:
        super().__init__(scope, construct_id)
        self._removal = removal_policy(config)

        # S3 delivers access-log records into this bucket minutes to hours after the requests, the stack's own
        # configuration calls during its create included: retained, it could hold objects when a failed create
        # rolls back, and DeleteBucket on a non-empty bucket fails the rollback (ROLLBACK_FAILED). It is emptied
        # (new writes denied first) and deleted with the stack whatever `results_retention` says; retained
        # buckets stop logging into it first (`_stop_logging_on_delete`).
        self.access_logs = self._bucket(
            "AccessLogs",
            removal=RemovalPolicy.DESTROY,
            lifecycle_rules=[s3.LifecycleRule(id="expire-logs", expiration=Duration.days(ACCESS_LOGS_EXPIRATION_DAYS))],
        )

        ttl = Duration.days(config.ledger_ttl_days)
        self.input_bucket = self._bucket(
            "Input",
            versioned=True,
            event_bridge_enabled=True,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="input/",
            lifecycle_rules=[
                s3.LifecycleRule(id="expire-claims", prefix=CLAIMS_PREFIX, expiration=ttl),
                s3.LifecycleRule(
                    id="expire-noncurrent", noncurrent_version_expiration=ttl, expired_object_delete_marker=True
                ),
                s3.LifecycleRule(id="abort-multipart", abort_incomplete_multipart_upload_after=Duration.days(7)),
            ],
        )

        results_rules = [
            s3.LifecycleRule(id="abort-multipart", abort_incomplete_multipart_upload_after=Duration.days(7))
        ]
        if config.results_expiration_days is not None:
            results_rules.append(
                s3.LifecycleRule(id="expire-results", expiration=Duration.days(config.results_expiration_days))
            )
        self.results_bucket = self._bucket(
            "Results",
            event_bridge_enabled=True,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="results/",
            lifecycle_rules=results_rules,
        )
        self.logging_off: list[cr.AwsCustomResource] = []
        if is_retained(self._removal):
            self.logging_off = [
                self._stop_logging_on_delete(name, bucket)
                for name, bucket in (("Input", self.input_bucket), ("Results", self.results_bucket))
            ]

    def _stop_logging_on_delete(self, name: str, bucket: s3.Bucket) -> cr.AwsCustomResource:
        """A retained bucket outlives the access-log bucket (deleted with the stack, see above): when the stack is
        deleted, its server access logging is turned off first (PutBucketLogging with no target), so it never logs
        into a bucket that no longer exists, or that someone else has created since under that name. It depends on
        both buckets, so CloudFormation deletes it (and runs its Delete) before either."""

        def call(action: str, parameters: dict[str, Any]) -> cr.AwsSdkCall:
            return cr.AwsSdkCall(
                service="S3",
                action=action,
                parameters={"Bucket": bucket.bucket_name, **parameters},
                physical_resource_id=cr.PhysicalResourceId.of(f"logging-off-{name.lower()}"),
            )

        custom = cr.AwsCustomResource(
            self,
            f"{name}LoggingOffOnDelete",
            on_create=call("getBucketLogging", {}),  # a read: the resource exists for its Delete
            on_delete=call("putBucketLogging", {"BucketLoggingStatus": {}}),
            policy=cr.AwsCustomResourcePolicy.from_statements(
                [
                    iam.PolicyStatement(
                        actions=["s3:GetBucketLogging", "s3:PutBucketLogging"], resources=[bucket.bucket_arn]
                    )
                ]
            ),
            install_latest_aws_sdk=False,
        )
        custom.node.add_dependency(bucket, self.access_logs)
        return custom

    def _bucket(self, construct_id: str, *, removal: RemovalPolicy | None = None, **props: Any) -> s3.Bucket:
        """A private bucket of the experiment: SSE-S3, TLS only, no public access, ACLs off, removed (emptied) with
        the stack only when results are not retained (or `removal` is DESTROY)."""
        removal = removal or self._removal
        return s3.Bucket(
            self,
            construct_id,
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            removal_policy=removal,
            auto_delete_objects=removal == RemovalPolicy.DESTROY,
            **props,
        )
