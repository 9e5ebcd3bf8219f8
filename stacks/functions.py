"""The pipeline's Lambda functions: one shared code asset, one role and one log group per function."""

from __future__ import annotations

from typing import Final

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

#: The newest Python runtime Lambda offers in this aws-cdk-lib (the agent image uses 3.13; the library supports both).
RUNTIME: Final = lambda_.Runtime.PYTHON_3_14
ARCHITECTURE: Final = lambda_.Architecture.ARM_64
LOG_RETENTION: Final = logs.RetentionDays.ONE_MONTH
#: The same retention in days (for log groups the stack does not own, e.g. the AgentCore runtime's).
LOG_RETENTION_DAYS: Final = 30


class PipelineFunctionConstruct(Construct):
    """A Python arm64 Lambda with JSON logs in its own log group and a role that can only write those logs.

    Every other permission is granted explicitly by the stack, so each role states exactly what its handler does.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        code: lambda_.Code,
        handler: str,
        description: str,
        timeout: Duration,
        memory_size: int,
        removal_policy: RemovalPolicy,
    ) -> None:
        super().__init__(scope, construct_id)
        self.timeout = timeout
        self.log_group = logs.LogGroup(self, "Logs", retention=LOG_RETENTION, removal_policy=removal_policy)
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"{description} (least privilege; no managed policies)",
        )
        self.log_group.grant_write(self.role)
        self.function = lambda_.Function(
            self,
            "Function",
            runtime=RUNTIME,
            architecture=ARCHITECTURE,
            code=code,
            handler=handler,
            description=description,
            timeout=timeout,
            memory_size=memory_size,
            role=self.role,
            log_group=self.log_group,
            logging_format=lambda_.LoggingFormat.JSON,
            application_log_level_v2=lambda_.ApplicationLogLevel.INFO,
            system_log_level_v2=lambda_.SystemLogLevel.WARN,
        )
