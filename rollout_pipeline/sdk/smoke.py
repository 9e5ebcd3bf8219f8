"""Moved to `rollout_pipeline.ops.smoke` (operator code); this path stays for code that imported it from here."""

import warnings

from rollout_pipeline.ops.smoke import Smoke, SmokeCheck, run_smoke

warnings.warn("rollout_pipeline.sdk.smoke moved to rollout_pipeline.ops.smoke", DeprecationWarning, stacklevel=2)

__all__ = ["Smoke", "SmokeCheck", "run_smoke"]
