"""Local mode's launcher: `Experiment.launch(name, mode="local", **settings)` starts the local pipeline in this
process and returns its attached `Experiment`, which stops the pipeline at `destroy()`, `close()`, the end of a
`with` block, or interpreter exit (whichever comes first; stopping twice does nothing).

Registered as the entry point `local` of the group `rollout_pipeline.launchers` (pyproject.toml), so the SDK finds
it without importing local mode.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, Final

from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.local.pipeline import LocalPipeline, LocalSettings
from rollout_pipeline.ops.deploy_settings import STACK_KEYS
from rollout_pipeline.sdk import Experiment, SdkError

log = logging.getLogger(__name__)

#: Experiment settings that are `LocalSettings` fields of the same name.
_SAME_NAME: Final = ("group_size", "tps_limit", "max_sessions", "rollout_timeout_s", "max_attempts", "model_id")


class _Stop:
    """Stops one pipeline once, from whichever of destroy/close/atexit calls first."""

    def __init__(self, pipeline: LocalPipeline) -> None:
        self.pipeline = pipeline
        self._lock = threading.Lock()
        self._done = False

    def __call__(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        atexit.unregister(self)
        self.pipeline.stop()


def local_settings(config: ExperimentConfig, given: frozenset[str], options: Mapping[str, Any]) -> LocalSettings:
    """The `LocalSettings` of an experiment: the settings given map onto local mode's, the others stay local mode's
    small defaults; `options` are `LocalSettings` fields (agent module, work dir, ...)."""
    known = {f.name for f in fields(LocalSettings)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise SdkError(f"unknown local option(s) {', '.join(unknown)}: local options are {', '.join(sorted(known))}")
    values: dict[str, Any] = {key: getattr(config, key) for key in _SAME_NAME if key in given}
    if "model_base_url" in given:
        values["model_url"] = config.model_base_url
    if "sampling_params" in given:
        values["sampling_params"] = config.sampling_params.model_dump(exclude_none=True)
    if "dispatch_concurrency" in given:
        values["dispatch_concurrency"] = config.dispatch_concurrency
    handled = {*_SAME_NAME, "model_base_url", "sampling_params", "dispatch_concurrency"}
    extra = {key: getattr(config, key) for key in given if key in ExperimentConfig.model_fields and key not in handled}
    ignored = sorted(given & set(STACK_KEYS))
    if ignored:
        log.info("local mode ignores the stack settings %s", ", ".join(ignored))
    return LocalSettings(**{"experiment": config.name, **values, "experiment_settings": extra, **options})


def launch(config: ExperimentConfig, given: frozenset[str], options: Mapping[str, Any]) -> Experiment:
    """Start the local pipeline of `config` and return its experiment (see the module docstring)."""
    pipeline = LocalPipeline(local_settings(config, given, options)).start()
    stop = _Stop(pipeline)
    atexit.register(stop)
    experiment: Experiment = pipeline.experiment
    experiment.on_destroy(stop)
    log.info("local experiment %s up at %s", config.name, pipeline.endpoint_url)
    return experiment
