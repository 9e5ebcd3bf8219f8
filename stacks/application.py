"""Build the CDK app from context: one `ExperimentStack` per `-c experiment=NAME`, or the account pool's stack with
`-c rollouts_pool=true` (`rollouts bootstrap`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Final

from aws_cdk import Annotations, App, CfnResource, Environment, Stack, Tags

from rollout_pipeline import quotas, topology
from rollout_pipeline.config import ConfigError, ExperimentConfig
from rollout_pipeline.ops.deploy_settings import STACK_KEYS, DeploySettings
from stacks import nag
from stacks.experiment_stack import ExperimentStack, stack_name
from stacks.pool_stack import PoolStack

#: The cost allocation tag on every resource of an experiment (docs/deploy.md: activate it in Billing).
COST_TAG = topology.COST_TAG
#: Resource types CDK makes as bare `CfnResource`s (its singleton custom-resource providers, e.g. the S3 auto-delete
#: one) that `Tags.of` cannot reach, with the property their tags go in (a Key/Value list for both).
BARE_TAGGABLE = {"AWS::IAM::Role": "Tags", "AWS::Lambda::Function": "Tags"}


def tag_bare_resources(stack: Stack, key: str, value: str) -> None:
    """Tag the stack's bare `CfnResource`s of a taggable type, which the `Tags` aspect skips (they have no
    TagManager): CDK's own providers' role and function would otherwise stay out of the experiment's bill."""
    for construct in stack.node.find_all():
        if type(construct) is not CfnResource:  # an L1 (CfnRole, CfnFunction, ...) has its TagManager
            continue
        prop = BARE_TAGGABLE.get(construct.cfn_resource_type)
        if prop is None:
            continue
        tags = list(stack.resolve(construct._cfn_properties).get(prop) or [])
        tags = [tag for tag in tags if tag.get("Key") != key]
        construct.add_property_override(prop, [*tags, {"Key": key, "Value": value}])


def config_context(app: App) -> dict[str, Any]:
    """Every context value that names an ExperimentConfig field, plus `experiment`."""
    names = ["experiment", *(name for name in ExperimentConfig.model_fields if name != "name")]
    values = {name: app.node.try_get_context(name) for name in names}
    return {name: value for name, value in values.items() if value is not None}


def stack_context(app: App) -> dict[str, Any]:
    """The stack-only context values (`rollout_pipeline.ops.deploy_settings.STACK_KEYS`) that are set."""
    values = {name: app.node.try_get_context(name) for name in STACK_KEYS}
    return {name: value for name, value in values.items() if value is not None}


#: `-c rollouts_pool=true` selects the account pool's stack (`rollouts bootstrap`) instead of an experiment's.
POOL_SELECTOR: Final = "rollouts_pool"


def pool_context(app: App) -> dict[str, Any]:
    """The pool stack's context values that are set (`quotas.POOL_CONTEXT_KEYS`, the reserve, the quotas' source)."""
    names = [*quotas.POOL_CONTEXT_KEYS, quotas.RESERVE_KEY, quotas.SOURCE_KEY]
    values = {name: app.node.try_get_context(name) for name in names}
    return {name: value for name, value in values.items() if value is not None}


def build_pool_app(app: App, env: Environment) -> PoolStack:
    """The account pool's stack (one per account and region). Raises ConfigError on bad settings."""
    try:
        settings = quotas.pool_settings(pool_context(app), env.region)
    except quotas.PoolSettingsError as exc:
        raise ConfigError(str(exc)) from None
    stack = PoolStack(
        app,
        topology.POOL_STACK_NAME,
        settings=settings,
        env=env,
        description="AgentCore capacity pool of every rollout-pipeline experiment in this account and region",
    )
    Tags.of(stack).add("rollouts:pool", "account")
    return stack


def build_app(
    context: Mapping[str, Any] | None = None, outdir: str | None = None
) -> tuple[App, ExperimentStack | PoolStack]:
    """The app with its one stack (an experiment's, or with `-c rollouts_pool=true` the account pool's) and cdk-nag
    attached. Raises ConfigError on bad context."""
    app = App(context=dict(context) if context is not None else None, outdir=outdir)
    env = Environment(account=os.environ.get("CDK_DEFAULT_ACCOUNT"), region=os.environ.get("CDK_DEFAULT_REGION"))
    if str(app.node.try_get_context(POOL_SELECTOR)).lower() in ("true", "1", "yes"):
        pool = build_pool_app(app, env)
        nag.add_checks(app)
        return app, pool
    config = ExperimentConfig.from_context(config_context(app))
    settings = DeploySettings.from_context(stack_context(app))
    settings.check_model_url(config.model_base_url)
    settings.check_model_secret_key(config.model_secret_name)
    config, warm_warning = settings.warm_pool_config(config)
    stack = ExperimentStack(
        app,
        stack_name(config),
        config=config,
        settings=settings,
        env=env,
        description=f"Rollout pipeline of experiment {config.name} (rollout-pipeline)",
    )
    Tags.of(stack).add(COST_TAG, config.name)
    tag_bare_resources(stack, COST_TAG, config.name)
    if warm_warning:
        Annotations.of(stack).add_warning_v2("rollouts:warm-pool", warm_warning)
    nag.add_checks(app)
    return app, stack
