"""The errors object written next to a dataset: one NDJSON line per rejected row, capped, resumable.

Line format: `{"file": <dataset key>, "line": <1-based line or array position>, "reason": <kind>, "error": <text>}`.
Only the first `max_entries` rejections are listed; when there are more, a last line with reason `truncated`
and `line` null says how many were left out. The object is rewritten at each ingest checkpoint (it is bounded),
so a resumed ingestion reloads it and loses nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final

TRUNCATED_REASON: Final = "truncated"
DEFAULT_MAX_ENTRIES: Final = 1000
DEFAULT_MAX_ERROR_CHARS: Final = 500


@dataclass(slots=True)
class ErrorLog:
    """Rejected rows of one file: the first `max_entries` in detail, the rest counted."""

    file: str
    max_entries: int = DEFAULT_MAX_ENTRIES
    max_error_chars: int = DEFAULT_MAX_ERROR_CHARS
    entries: list[dict[str, Any]] = field(default_factory=list)
    total: int = 0
    dirty: bool = False

    def add(self, line: int | None, reason: str, error: str) -> None:
        """Count one rejected row; list it while under the cap."""
        self.total += 1
        if len(self.entries) < self.max_entries:
            text = error if len(error) <= self.max_error_chars else error[: self.max_error_chars] + "..."
            self.entries.append({"file": self.file, "line": line, "reason": reason, "error": text})
            self.dirty = True

    def restore(self, body: bytes, *, cursor: int, total: int) -> None:
        """Reload the entries checkpointed up to `cursor` (later ones will be found again) and the total count."""
        self.entries = []
        for raw in body.splitlines():
            if not raw.strip():
                continue
            entry = json.loads(raw)
            if entry.get("reason") == TRUNCATED_REASON:
                continue
            line = entry.get("line")
            if isinstance(line, int) and line <= cursor and len(self.entries) < self.max_entries:
                self.entries.append(entry)
        self.total = total
        self.dirty = False

    @property
    def listed(self) -> int:
        return len(self.entries)

    def render(self, *, final: bool) -> bytes:
        """The NDJSON body; with `final`, a `truncated` summary line when rows were left out."""
        lines = [json.dumps(entry, ensure_ascii=False, separators=(",", ":")) for entry in self.entries]
        omitted = self.total - len(self.entries)
        if final and omitted > 0:
            summary = {
                "file": self.file,
                "line": None,
                "reason": TRUNCATED_REASON,
                "error": f"{omitted} more rejected row(s) not listed (only the first {self.max_entries} are)",
            }
            lines.append(json.dumps(summary, separators=(",", ":")))
        return ("\n".join(lines) + "\n").encode() if lines else b""
