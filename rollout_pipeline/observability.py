"""Names operators search by: the Powertools service of each Lambda (a metric dimension) and the log keys.

The handlers, the stack's alarms and dashboard (`stacks/monitoring.py`) and the docs all read them from here.
"""

from __future__ import annotations

from typing import Final

#: Powertools `service` per pipeline function: the `service` dimension of its metrics and the field in its logs.
SERVICES: Final = {
    "ingest": "rollout-ingest",
    "dispatch": "rollout-dispatcher",
    "completion": "rollout-completion",
    "sweeper": "rollout-sweeper",
}
#: The ids every pipeline log line about a rollout carries, so one rollout can be followed across the functions.
LOG_KEYS: Final = ("exp_id", "batch_id", "rollout_id", "session_id")
#: CloudWatch Logs Insights: everything the four functions logged about one rollout, oldest first.
ROLLOUT_QUERY: Final = (
    "fields @timestamp, service, level, message, batch_id, session_id\n"
    "| filter rollout_id = 'ROLLOUT_ID'\n"
    "| sort @timestamp asc"
)
