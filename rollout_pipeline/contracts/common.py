"""Helpers every contract shares: times as the ledger and events store them, JSON sizes and type names."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any


def utcnow() -> datetime:
    return datetime.now(UTC)


def iso(value: datetime) -> str:
    """ISO-8601 in UTC, as the ledger stores times."""
    return value.astimezone(UTC).isoformat()


def parse_iso(value: Any) -> datetime | None:
    """A stored ISO-8601 time (a trailing `Z` allowed; naive = UTC), or None when absent or unreadable."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def json_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def json_type(value: Any) -> str:
    """The JSON type name of a decoded value, for error messages."""
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number" if isinstance(value, int | float) else type(value).__name__
    )
