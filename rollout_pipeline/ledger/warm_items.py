"""The warm pool's items, typed (`ledger.warm` reads and writes them), parsed once at the table boundary."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from rollout_pipeline.ids import AttemptRef
from rollout_pipeline.ledger.attributes import float_at, int_at, item_values, text_at


class WarmState(StrEnum):
    """A warm session's `state`: warming (its slot taken, its warm-up not answered yet), idle (the only state a
    dispatch takes), stopping."""

    WARMING = "warming"
    IDLE = "idle"
    STOPPING = "stopping"


@dataclass(frozen=True, slots=True)
class WarmSession:
    """A warm session's item (`WARM` / `S#{session}`): when its first warm-up was sent (its microVM's start) and its
    last warm-up or keep-alive answered (AgentCore's idle timeout counts from then), epoch seconds."""

    session_id: str
    state: WarmState
    warmed_at: float
    kept_at: float

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> WarmSession:
        item = item_values(raw)
        warmed = float_at(item, "warmed_at")
        return cls(
            session_id=str(item["sk"]).removeprefix("S#"),
            state=WarmState(item.get("state") or WarmState.WARMING),
            warmed_at=warmed,
            kept_at=float(item.get("kept_at") or warmed),
        )


@dataclass(frozen=True, slots=True)
class WarmClaim:
    """Which rollout attempt took a warm session, and when it was warmed (`WS#{session}` / `CLAIM`)."""

    session_id: str
    ref: AttemptRef
    warmed_at: float

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> WarmClaim:
        item = item_values(raw)
        return cls(
            session_id=str(item["pk"]).removeprefix("WS#"),
            ref=AttemptRef(str(item["batch_id"]), str(item["input_id"]), int(item["index"]), int(item["attempt"])),
            warmed_at=float_at(item, "warmed_at"),
        )


@dataclass(frozen=True, slots=True)
class WarmPoolState:
    """The warm pool's own item (`WARM` / `POOL`), times in epoch seconds: who runs it, when the experiment last had
    work, when a dispatch last took a new session for want of a warm one (`demand_at`) or a warm one (`took_at`),
    why it is halted (None: it runs; a batch created after `halted_at` resumes it, never after "destroyed"), the last
    batch's size, and totals since it began."""

    lease_owner: str | None = None
    lease_until: float = 0.0
    busy_at: float = 0.0
    demand_at: float = 0.0
    took_at: float = 0.0
    halted: str | None = None
    halted_at: float = 0.0
    last_batch_id: str | None = None
    last_batch_rollouts: int = 0
    warmed: int = 0
    warmup_failures: int = 0
    keepalives: int = 0
    stopped_unused: int = 0
    unused_idle_s: float = 0.0
    dropped: int = 0

    @classmethod
    def of(cls, raw: Mapping[str, Any] | None) -> WarmPoolState:
        if not raw:
            return cls()
        item = item_values(raw)
        return cls(
            lease_owner=text_at(item, "lease_owner"),
            lease_until=float_at(item, "lease_until"),
            busy_at=float_at(item, "busy_at"),
            demand_at=float_at(item, "demand_at"),
            took_at=float_at(item, "took_at"),
            halted=text_at(item, "halted"),
            halted_at=float_at(item, "halted_at"),
            last_batch_id=text_at(item, "last_batch_id"),
            last_batch_rollouts=int_at(item, "last_batch_rollouts"),
            warmed=int_at(item, "warmed"),
            warmup_failures=int_at(item, "warmup_failures"),
            keepalives=int_at(item, "keepalives"),
            stopped_unused=int_at(item, "stopped_unused"),
            unused_idle_s=float_at(item, "unused_idle_s"),
            dropped=int_at(item, "dropped"),
        )
