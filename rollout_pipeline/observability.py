"""Names operators search by: the Powertools service of each Lambda (a metric dimension) and the log keys.

The handlers, the stack's alarms and dashboard (`stacks/monitoring.py`) and the docs all read them from here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any, Final

#: Powertools `service` per pipeline function: the `service` dimension of its metrics and the field in its logs.
SERVICES: Final = {
    "ingest": "rollout-ingest",
    "dispatch": "rollout-dispatcher",
    "completion": "rollout-completion",
    "sweeper": "rollout-sweeper",
    "mtrl_forwarder": "rollout-mtrl-forwarder",
    "mtrl_reporter": "rollout-mtrl-reporter",
}
#: The ids every pipeline log line about a rollout carries, so one rollout can be followed across the functions.
LOG_KEYS: Final = ("exp_id", "batch_id", "rollout_id", "session_id")
#: CloudWatch Logs Insights: everything the four functions logged about one rollout, oldest first.
ROLLOUT_QUERY: Final = (
    "fields @timestamp, service, level, message, batch_id, session_id\n"
    "| filter rollout_id = 'ROLLOUT_ID'\n"
    "| sort @timestamp asc"
)

_installed: set[str] = set()
_experiment: ContextVar[str | None] = ContextVar("rollouts_log_experiment", default=None)
_ids: ContextVar[Mapping[str, str]] = ContextVar("rollouts_log_ids", default={})  # noqa: B039 - never mutated


def set_log_experiment(exp_id: str) -> None:
    """The experiment every following log line of this context carries as `exp_id`."""
    _experiment.set(exp_id)


def bind_log_ids(**ids: object) -> None:
    """The rollout the following log lines are about (replaces the previous one's ids; None values are left out)."""
    _ids.set({key: str(value) for key, value in ids.items() if value is not None})


def clear_log_ids() -> None:
    """Back to lines about no rollout in particular (keeps `exp_id`)."""
    _ids.set({})


class LogIdsFilter(logging.Filter):
    """Adds `exp_id` and the bound rollout ids to every record that passes the handler it is attached to."""

    def filter(self, record: logging.LogRecord) -> bool:
        experiment = _experiment.get()
        if experiment is not None and not hasattr(record, "exp_id"):
            record.exp_id = experiment
        for key, value in _ids.get().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


def install_log_ids(logger: Any, exp_id: str) -> None:
    """Route the library's loggers through Powertools `logger` and stamp the ids on every line they write.

    Called by each handler on every invocation (cheap after the first); the library's own modules keep using
    `logging.getLogger(__name__)`. Outside Lambda (local mode, tests) only `exp_id` is set: the library's
    loggers keep their configuration, so local mode's console is unchanged.
    """
    from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers

    set_log_experiment(exp_id)
    if logger.name in _installed or not os.environ.get("AWS_LAMBDA_FUNCTION_NAME"):
        return
    _installed.add(logger.name)
    copy_config_to_registered_loggers(source_logger=logger, include={"rollout_pipeline"})
    flt = LogIdsFilter()
    for handler in logger.handlers:
        if not any(isinstance(existing, LogIdsFilter) for existing in handler.filters):
            handler.addFilter(flt)
