"""The warm pool as the trainer sees it (`exp.capacity.warm_pool()`): its setting, what it holds now, what it has
spent, and what that idle memory costs at the experiment's prices (`costs.PriceBook.memory_gb_s`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.costs import PriceBook
from rollout_pipeline.ledger.warm_items import WarmPoolState, WarmSession, WarmState


@dataclass(frozen=True)
class WarmPoolStatus:
    """One experiment's warm pool now (times in epoch seconds)."""

    experiment: str
    #: `warm_sessions`: a count, "auto", or 0 (off).
    setting: int | str
    idle_stop_s: int
    idle: int
    warming: int
    stopping: int
    #: Why it keeps no session (None: it runs).
    halted: str | None
    last_batch_id: str | None
    last_batch_rollouts: int
    warmed: int
    warmup_failures: int
    keepalives: int
    stopped_unused: int
    dropped: int
    #: Idle seconds of the sessions stopped without running a rollout, and of the ones waiting now (so far).
    unused_idle_s: float
    waiting_idle_s: float
    #: The experiment's prices and session size (`Experiment.price_book()`): what idle memory is priced at.
    prices: PriceBook = field(repr=False)

    @property
    def idle_gb_s(self) -> float:
        """GB-seconds of warm sessions that ran no rollout (stopped ones and the ones waiting now)."""
        return self.prices.memory_gb_s(self.unused_idle_s + self.waiting_idle_s)

    @property
    def idle_usd(self) -> float:
        """Their memory's cost at the experiment's prices (an upper bound at the default 8 GB a session)."""
        return self.prices.memory_usd(self.unused_idle_s + self.waiting_idle_s)

    def as_dict(self) -> dict[str, Any]:
        values = {name: value for name, value in asdict(self).items() if name != "prices"}
        return {
            **values,
            "memory_gb": self.prices.billed_memory_gb,
            "gb_hour_usd": self.prices.gb_hour_usd,
            "priced_as": self.prices.label,
            "idle_gb_s": self.idle_gb_s,
            "idle_usd": self.idle_usd,
        }

    @classmethod
    def of(
        cls,
        config: ExperimentConfig,
        state: WarmPoolState,
        sessions: list[WarmSession],
        now: float,
        prices: PriceBook,
    ) -> WarmPoolStatus:
        by_state = {s: [x for x in sessions if x.state is s] for s in WarmState}
        return cls(
            experiment=config.name,
            setting=config.warm_sessions,
            idle_stop_s=config.warm_idle_stop_s,
            idle=len(by_state[WarmState.IDLE]),
            warming=len(by_state[WarmState.WARMING]),
            stopping=len(by_state[WarmState.STOPPING]),
            halted=state.halted,
            last_batch_id=state.last_batch_id,
            last_batch_rollouts=state.last_batch_rollouts,
            warmed=state.warmed,
            warmup_failures=state.warmup_failures,
            keepalives=state.keepalives,
            stopped_unused=state.stopped_unused,
            dropped=state.dropped,
            unused_idle_s=state.unused_idle_s,
            waiting_idle_s=sum(max(0.0, now - s.warmed_at) for s in sessions),
            prices=prices,
        )
