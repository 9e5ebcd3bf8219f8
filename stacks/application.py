"""Build the CDK app from context: one `ExperimentStack` per `-c experiment=NAME`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from aws_cdk import Annotations, App, Environment, Tags

from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.ops.deploy_settings import STACK_KEYS, DeploySettings
from stacks import nag
from stacks.experiment_stack import ExperimentStack, stack_name


def config_context(app: App) -> dict[str, Any]:
    """Every context value that names an ExperimentConfig field, plus `experiment`."""
    names = ["experiment", *(name for name in ExperimentConfig.model_fields if name != "name")]
    values = {name: app.node.try_get_context(name) for name in names}
    return {name: value for name, value in values.items() if value is not None}


def stack_context(app: App) -> dict[str, Any]:
    """The stack-only context values (`rollout_pipeline.ops.deploy_settings.STACK_KEYS`) that are set."""
    values = {name: app.node.try_get_context(name) for name in STACK_KEYS}
    return {name: value for name, value in values.items() if value is not None}


def build_app(context: Mapping[str, Any] | None = None, outdir: str | None = None) -> tuple[App, ExperimentStack]:
    """The app with its one experiment stack and cdk-nag attached. Raises ConfigError on bad context."""
    app = App(context=dict(context) if context is not None else None, outdir=outdir)
    config = ExperimentConfig.from_context(config_context(app))
    settings = DeploySettings.from_context(stack_context(app))
    settings.check_model_url(config.model_base_url)
    settings.check_model_secret_key(config.model_secret_name)
    config, warm_warning = settings.warm_pool_config(config)
    env = Environment(account=os.environ.get("CDK_DEFAULT_ACCOUNT"), region=os.environ.get("CDK_DEFAULT_REGION"))
    stack = ExperimentStack(
        app,
        stack_name(config),
        config=config,
        settings=settings,
        env=env,
        description=f"Rollout pipeline of experiment {config.name} (rollout-pipeline)",
    )
    Tags.of(stack).add("rollouts:experiment", config.name)
    if warm_warning:
        Annotations.of(stack).add_warning_v2("rollouts:warm-pool", warm_warning)
    nag.add_checks(app)
    return app, stack
