"""The pipeline's own measured capacity, and the warnings synth gives a config that promises more.

The figures come from `bench/bench_scale.py` (docs/benchmarks.md, "Scale"); what sets them is in
docs/ARCHITECTURE.md ("Write rates per item").
"""

from __future__ import annotations

import math
from typing import Final

from rollout_pipeline.topology import DISPATCH_BATCH

#: New sessions/s (all endpoints together) at which the ledger's own contention passes 0.5 conflict retries per
#: rollout (measured: bench/bench_scale.py, docs/benchmarks.md "Scale"; what sets it: docs/ARCHITECTURE.md).
LEDGER_CEILING_SESSIONS_S: Final = 36.0


#: Rollouts the dispatchers must hold together per new session/s to sustain 0.9 of the rate over several endpoints
#: and a long backlog (measured at 24/s over 2,400 rollouts: 150 in hand reach 88%, 200 reach 90.7%;
#: docs/benchmarks.md "At the issue's size"); a dispatcher holds its SQS batch (`topology.DISPATCH_BATCH`).
IN_HAND_PER_SESSION_S: Final = 8.0


def ceiling_warnings(
    tps_limit: float, session_rate_limit: float, endpoints: int, dispatch_concurrency: int | None = None
) -> list[str]:
    """Warnings for a config that promises more than the ledger's measured ceiling: more new sessions/s than
    `LEDGER_CEILING_SESSIONS_S`, or a `tps_limit` above the calls such a rate needs (an invoke and a stop each); and
    (given `dispatch_concurrency`) too few dispatchers to keep every endpoint's budget busy."""
    found: list[str] = []
    promised = session_rate_limit * endpoints
    needed = math.ceil(IN_HAND_PER_SESSION_S * promised / DISPATCH_BATCH)
    if dispatch_concurrency is not None and endpoints > 1 and dispatch_concurrency < needed:
        found.append(
            f"dispatch_concurrency {dispatch_concurrency} holds too few rollouts to keep {endpoints} endpoints x "
            f"{session_rate_limit:g} new sessions/s busy (a dispatcher returns once its whole SQS batch has started): "
            f"measured, about {needed} sustain 0.9 of the rate (docs/benchmarks.md, 'Scale')."
        )
    if promised > LEDGER_CEILING_SESSIONS_S:
        found.append(
            f"endpoints x session_rate_limit = {promised:g} new sessions/s is above the ledger's measured ceiling "
            f"({LEDGER_CEILING_SESSIONS_S:g}/s, docs/ARCHITECTURE.md): beyond it dispatch and terminal transactions "
            "conflict more than 0.5 times per rollout and cost more requests; the rate may not be reached."
        )
    if tps_limit > 2 * LEDGER_CEILING_SESSIONS_S:
        found.append(
            f"tps_limit {tps_limit:g} is above what the ledger's measured ceiling of {LEDGER_CEILING_SESSIONS_S:g} "
            f"new sessions/s needs ({2 * LEDGER_CEILING_SESSIONS_S:g} calls/s: an invoke and a stop each; "
            "docs/ARCHITECTURE.md): the pipeline will not use all of it."
        )
    return found
