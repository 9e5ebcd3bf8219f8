"""The pipeline's own measured ceilings (the ledger's contention, the rollouts the dispatchers must hold), and the
warnings synth gives a config that promises more.

The figures come from `bench/bench_scale.py` (docs/benchmarks.md, "Scale"); what sets them is in
docs/ARCHITECTURE.md ("Write rates per item").
"""

from __future__ import annotations

import math
from typing import Final

from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.quotas import PoolSettings
from rollout_pipeline.topology import DISPATCH_BATCH

#: New sessions/s (all endpoints together) at which the ledger's own contention passes 0.5 conflict retries per
#: rollout (measured: bench/bench_scale.py, docs/benchmarks.md "Scale"; what sets it: docs/ARCHITECTURE.md).
LEDGER_CEILING_SESSIONS_S: Final = 36.0


#: Rollouts the dispatchers must hold together per new session/s to sustain 0.9 of the rate over several endpoints
#: and a long backlog (measured at 24/s over 2,400 rollouts: 150 in hand reach 88%, 200 reach 90.7%;
#: docs/benchmarks.md "At the issue's size"); a dispatcher holds its SQS batch (`topology.DISPATCH_BATCH`).
IN_HAND_PER_SESSION_S: Final = 8.0


def ceiling_warnings(config: ExperimentConfig) -> list[str]:
    """Warnings for a config that promises more than the ledger's measured ceiling: more new sessions/s than
    `LEDGER_CEILING_SESSIONS_S` (its `session_rate_limit`, else the account pool's documented budget), a `tps_limit`
    above the calls such a rate needs (an invoke and a stop each); and, for an account whose new-session quota is
    per endpoint, too few dispatchers to keep every endpoint's budget busy."""
    found: list[str] = []
    pool = PoolSettings().budget("sessions")
    limit = config.session_rate_limit
    promised = limit if limit is not None else pool
    per_endpoint = (limit or pool) * config.endpoints
    needed = math.ceil(IN_HAND_PER_SESSION_S * per_endpoint / DISPATCH_BATCH)
    if config.endpoints > 1 and config.dispatch_concurrency < needed:
        found.append(
            f"dispatch_concurrency {config.dispatch_concurrency} holds too few rollouts to keep {config.endpoints} "
            f"endpoints busy if the account's new-session quota is per endpoint (a dispatcher returns once its whole "
            f"SQS batch has started): measured, about {needed} sustain 0.9 of the rate (docs/benchmarks.md, 'Scale')."
        )
    if promised > LEDGER_CEILING_SESSIONS_S:
        found.append(
            f"session_rate_limit = {promised:g} new sessions/s is above the ledger's measured ceiling "
            f"({LEDGER_CEILING_SESSIONS_S:g}/s, docs/ARCHITECTURE.md): beyond it dispatch and terminal transactions "
            "conflict more than 0.5 times per rollout and cost more requests; the rate may not be reached."
        )
    if config.tps_limit is not None and config.tps_limit > 2 * LEDGER_CEILING_SESSIONS_S:
        found.append(
            f"tps_limit {config.tps_limit:g} is above what the ledger's measured ceiling of "
            f"{LEDGER_CEILING_SESSIONS_S:g} new sessions/s needs ({2 * LEDGER_CEILING_SESSIONS_S:g} calls/s: an "
            "invoke and a stop each; docs/ARCHITECTURE.md): the pipeline will not use all of it."
        )
    return found
