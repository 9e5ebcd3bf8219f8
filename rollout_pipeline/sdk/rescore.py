"""Re-scoring: a new reward function applied to stored rollouts, without running an agent.

`reward(row, result)` gets one dataset row (`sdk.dataset.COLUMNS`, plus `payload`: the row's payload parsed, read
from its claim check when it was stored aside) and the rollout's result object (parsed JSON), and returns a number
or a per-turn list (its last entry is then the scalar reward), as an agent's `rewards`. It is called for every
`succeeded` rollout whose result object can be read; failed and unfinished rollouts keep a null reward. A function
that raises (or returns something else) marks its row (`rescore_error`, null `reward`) and the run goes on. Group
statistics and advantages are then recomputed with the SDK's one formula (`contracts.grpo_advantages`,
`Group.advantages()`).

Nothing is written to the ledger, the buckets or the bus: re-scoring reads them and writes files.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from rollout_pipeline.ledger.items import RolloutState
from rollout_pipeline.sdk.dataset import MAX_LISTED_ERRORS, Row, add_group_stats, checked_rewards, with_rewards
from rollout_pipeline.sdk.errors import SdkError

#: A reward function: `(row, result) -> number | list of numbers`.
RewardFunction = Callable[[Mapping[str, Any], Mapping[str, Any]], Any]
#: The error text kept for a row (the column `rescore_error`).
MAX_ERROR_CHARS: Final = 500
_UNREADABLE: Final = "the result object could not be read"


def load_reward_function(spec: str) -> tuple[RewardFunction, str]:
    """The function `module:function` names (a module on the path, the current directory included, or a
    `path/to/file.py`), and its name as given. `SdkError` (one line) when it cannot be found or called."""
    module_name, sep, function_name = spec.rpartition(":")
    if not sep or not module_name or not function_name:
        raise SdkError(f"--reward {spec!r}: expected MODULE:FUNCTION (e.g. my_rewards:exact_match or file.py:score)")
    try:
        module = _load_module(module_name)
    except SdkError:
        raise
    except Exception as exc:  # the user's module raised while importing
        raise SdkError(f"--reward {spec!r}: importing {module_name} raised {type(exc).__name__}: {exc}") from None
    function = getattr(module, function_name, None)
    if function is None:
        raise SdkError(f"--reward {spec!r}: {module_name} has no {function_name!r}")
    if not callable(function):
        raise SdkError(f"--reward {spec!r}: {function_name} is not a function")
    return function, spec


def _load_module(name: str) -> Any:
    if name.endswith(".py") or "/" in name or "\\" in name:
        path = Path(name)
        if not path.is_file():
            raise SdkError(f"--reward: no file {name}")
        spec = importlib.util.spec_from_file_location(f"_rollouts_reward_{abs(hash(path.resolve()))}", path)
        if spec is None or spec.loader is None:
            raise SdkError(f"--reward: cannot load {name}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    added = str(Path.cwd())
    on_path = added in sys.path or "" in sys.path
    if not on_path:  # a console script does not put the working directory on the path; `python -m` does
        sys.path.insert(0, added)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            raise SdkError(
                f"--reward: no module named {exc.name!r} (run from its directory, or give file.py:FUNCTION)"
            ) from None
        raise
    finally:
        if not on_path and added in sys.path:
            sys.path.remove(added)


@dataclass
class Rescorer:
    """Applies `reward` to each group's rows (the `transform` of `export.write_dataset`) and counts what happened:
    rows re-scored, rows whose function failed (and the first ones' errors, by `batch/rollout id`).
    `load_payload` reads a payload stored aside (`payload_ref`), once per group."""

    reward: RewardFunction
    load_payload: Callable[[str], Any] | None = None
    rescored: int = 0
    failed: int = 0
    errors: dict[str, str] = field(default_factory=dict)

    def __call__(self, rows: list[Row], results: Mapping[int, Mapping[str, Any] | None]) -> list[Row]:
        payload = self._payload(rows[0]) if rows else None
        updated = [self._row(row, results.get(row["index"]), payload) for row in rows]
        return add_group_stats(updated)

    def _payload(self, row: Row) -> Any:
        text = row.get("payload_json")
        if isinstance(text, str):
            return json.loads(text)
        ref = row.get("payload_ref")
        if ref and self.load_payload is not None:
            return self.load_payload(str(ref))
        return None

    def _row(self, row: Row, result: Mapping[str, Any] | None, payload: Any) -> Row:
        if row["status"] != RolloutState.SUCCEEDED.value:
            return with_rewards(row, None, None)
        if result is None:
            return self._fail(row, _UNREADABLE)
        try:
            rewards = checked_rewards(self.reward({**row, "payload": payload}, result))
        except Exception as exc:  # the user's function: any error marks this row only
            return self._fail(row, f"{type(exc).__name__}: {exc}")
        self.rescored += 1
        return with_rewards(row, rewards, None)

    def _fail(self, row: Row, error: str) -> Row:
        self.failed += 1
        text = error[:MAX_ERROR_CHARS]
        if len(self.errors) < MAX_LISTED_ERRORS:
            self.errors[f"{row['batch_id']}/{row['rollout_id']}"] = text
        return with_rewards(row, None, text)
