"""The pipeline's own measured ceiling (the ledger's contention) and the warnings synth gives a config that promises
more (measured: `bench/bench_scale.py`, docs/benchmarks.md "Scale"; what sets it: docs/ARCHITECTURE.md)."""

from __future__ import annotations

from typing import Final

from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.quotas import PoolSettings

#: New sessions/s (all endpoints together) at which the ledger's contention passes 0.5 conflict retries per rollout.
LEDGER_CEILING_SESSIONS_S: Final = 36.0


def ceiling_warnings(config: ExperimentConfig) -> list[str]:
    """Warnings for a config that promises more new sessions/s than `LEDGER_CEILING_SESSIONS_S`, or a `tps_limit`
    above the calls such a rate needs."""
    found: list[str] = []
    promised = config.session_rate_limit if config.session_rate_limit is not None else PoolSettings().budget("sessions")
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
