"""Moved to `rollout_pipeline.ops.launch` (operator code); this path stays for code that imported it from here."""

import warnings

from rollout_pipeline.ops.launch import LAUNCHERS, MODES, Deployment, Launcher, launcher, plan

warnings.warn("rollout_pipeline.sdk.launch moved to rollout_pipeline.ops.launch", DeprecationWarning, stacklevel=2)

__all__ = ["LAUNCHERS", "MODES", "Deployment", "Launcher", "launcher", "plan"]
