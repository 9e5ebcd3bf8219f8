"""The warm pool's items, typed (`ledger.warm` reads and writes them), parsed once at the table boundary."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from rollout_pipeline.ids import AttemptRef
from rollout_pipeline.ledger.attributes import float_at, item_values, view_of


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
        return view_of(cls, item_values(raw)) if raw else cls()
