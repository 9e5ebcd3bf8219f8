"""The key of attempt tokens (`rollout_pipeline.contracts.attempts`): a secret the stack generates.

Only the functions that issue tokens (dispatch) or check them (completion, and the sweeper, which completes results
whose event was late) may read it; they get its ARN in `topology.ATTEMPT_KEY_ENV` and read the value on first use.
No agent, trainer or model credential can read it.
"""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from rollout_pipeline.topology import ATTEMPT_KEY_ENV
from stacks import nag
from stacks.functions import PipelineFunctionConstruct

#: Characters of the generated key (letters and digits: about 380 bits).
KEY_LENGTH = 64


class AttemptKey(Construct):
    """A generated Secrets Manager secret (CloudFormation names it; deleted with the stack: it protects nothing
    once the stack's sessions are gone)."""

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.secret = secretsmanager.Secret(
            self,
            "Secret",
            description="Key of the rollout pipeline's attempt tokens (HMAC; read by dispatch, completion, sweeper)",
            generate_secret_string=secretsmanager.SecretStringGenerator(
                password_length=KEY_LENGTH, exclude_punctuation=True, include_space=False
            ),
            removal_policy=RemovalPolicy.DESTROY,
        )
        nag.ack(
            self.secret,
            "AwsSolutions-SMG4",
            "Not a credential of any service: an HMAC key of per-attempt tokens that live as long as one rollout "
            "attempt; rotating it would only reject the results of attempts in flight.",
        )

    def grant(self, *functions: PipelineFunctionConstruct) -> None:
        """Let `functions` read the key (GetSecretValue on this secret only) and tell them where it is."""
        for pipeline_function in functions:
            self.secret.grant_read(pipeline_function.role)
            pipeline_function.function.add_environment(ATTEMPT_KEY_ENV, self.secret.secret_arn)
