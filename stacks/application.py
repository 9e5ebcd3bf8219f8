"""Build the CDK app from context: one `ExperimentStack` per `-c experiment=NAME`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Final

from aws_cdk import App, Environment, Tags

from rollout_pipeline.config import ConfigError, ExperimentConfig
from stacks import nag
from stacks.experiment_stack import DEFAULT_ARCHIVE_RETENTION_DAYS, ExperimentStack, stack_name

#: Stack-only settings that are not part of ExperimentConfig (the Lambdas never see them).
ARCHIVE_CONTEXT_KEY: Final = "event_archive_days"


def config_context(app: App) -> dict[str, Any]:
    """Every context value that names an ExperimentConfig field, plus `experiment`."""
    names = ["experiment", *(name for name in ExperimentConfig.model_fields if name != "name")]
    values = {name: app.node.try_get_context(name) for name in names}
    return {name: value for name, value in values.items() if value is not None}


def archive_retention_days(app: App) -> int:
    raw = app.node.try_get_context(ARCHIVE_CONTEXT_KEY)
    if raw is None or raw == "":
        return DEFAULT_ARCHIVE_RETENTION_DAYS
    try:
        days = int(raw)
    except (TypeError, ValueError):
        raise ConfigError(
            f"{ARCHIVE_CONTEXT_KEY}: must be a whole number of days, 0 to disable (got {raw!r})"
        ) from None
    if not 0 <= days <= 3650:
        raise ConfigError(f"{ARCHIVE_CONTEXT_KEY}: must be between 0 and 3650 (got {days})")
    return days


def build_app(context: Mapping[str, Any] | None = None, outdir: str | None = None) -> tuple[App, ExperimentStack]:
    """The app with its one experiment stack and cdk-nag attached. Raises ConfigError on bad context."""
    app = App(context=dict(context) if context is not None else None, outdir=outdir)
    config = ExperimentConfig.from_context(config_context(app))
    env = Environment(account=os.environ.get("CDK_DEFAULT_ACCOUNT"), region=os.environ.get("CDK_DEFAULT_REGION"))
    stack = ExperimentStack(
        app,
        stack_name(config),
        config=config,
        archive_retention_days=archive_retention_days(app),
        env=env,
        description=f"Rollout pipeline of experiment {config.name} (rollout-pipeline)",
    )
    Tags.of(stack).add("rollouts:experiment", config.name)
    nag.add_checks(app)
    return app, stack
