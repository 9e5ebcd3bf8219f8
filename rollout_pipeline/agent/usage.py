"""What the session used, reported by the agent host beside the result: never by (or in) the user's agent.

AgentCore gives every session its own microVM, so one agent process is one session, and the process's CPU time is
the session's (AgentCore bills CPU actually consumed). `install()` makes every ART app of the process (`AgentCoreRLApp`,
so `RolloutApp` and the RFT host too) add `{RESULT_USAGE_KEY: {...}}` to each result object it saves:

- `cpu_s`: the process's CPU seconds so far (user + system, with its finished child processes), start-up included
  (AgentCore bills the session from the microVM's start; a process forked from a warm parent, as local mode's are,
  counts the parent's start-up as its own: `inherit_cpu`);
- `peak_rss_mb`: its peak resident memory (and its children's), for information: AgentCore bills the session's peak
  memory, which also holds the microVM's own overhead, so the cost model prices the configured size instead;
- `rollouts`: rollouts this process has started. Completion uses `cpu_s` only when it is 1 (the process is the
  session); a process that served several (local mode's `shared` isolation) gets the busy-time bound instead;
- `model_calls`: what this rollout's model calls came back as (`agent.replies`: calls, cut, empty, errors,
  max_tokens), which completion turns into the rollout's `warning`.

The user's function and its result are untouched but for this one key, which the host owns (an agent returning a
value under it has it overwritten). The attempt token is unaffected (it travels in `payload._rollout` and at the top
level as `attempt_token`). `install()` is idempotent; `RolloutApp` calls it, and the image's start command
(`agent.start`) calls it before it runs an unmodified ART module.
"""

from __future__ import annotations

import os
import resource
import sys
import threading
from typing import Any

from rollout_pipeline.config import RESULT_USAGE_KEY

_lock = threading.Lock()
#: Rollouts started in this process (a one-element list: shared by every thread, no `global` statement).
_started = [0]
#: CPU seconds spent for this process before it began (`inherit_cpu`).
_inherited_cpu_s = [0.0]


def _rss_mb(who: int) -> float:
    """Peak RSS of `who` (`resource.RUSAGE_SELF`/`RUSAGE_CHILDREN`) in MB (Linux reports KB, macOS bytes)."""
    peak = resource.getrusage(who).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def note_rollout_started() -> None:
    """Count one rollout started in this process."""
    with _lock:
        _started[0] += 1


def inherit_cpu(seconds: float) -> None:
    """Count `seconds` of CPU spent before this process began in its `cpu_s`: the start-up its warm parent did for
    it (`local.forks`), which a process started afresh would have spent itself."""
    _inherited_cpu_s[0] = seconds


def current_usage() -> dict[str, Any]:
    """The process's usage so far, and the current rollout's model calls (see the module doc)."""
    from rollout_pipeline.agent import replies

    times = os.times()
    with _lock:
        started = _started[0]
    return {
        "cpu_s": round(
            _inherited_cpu_s[0] + times.user + times.system + times.children_user + times.children_system, 3
        ),
        "peak_rss_mb": round(max(_rss_mb(resource.RUSAGE_SELF), _rss_mb(resource.RUSAGE_CHILDREN)), 1),
        "rollouts": started,
        "model_calls": replies.current_tally().as_dict(),
    }


def install() -> None:
    """Make every `AgentCoreRLApp` of this process report its usage in the result objects it saves, and watch its
    model calls (`agent.replies`) (idempotent)."""
    from agentcore_rl_toolkit.app import AgentCoreRLApp

    from rollout_pipeline.agent import replies

    replies.install()

    with _lock:
        if getattr(AgentCoreRLApp, "_rollout_usage_installed", False):
            return
        save_result = AgentCoreRLApp.save_result
        add_async_task = AgentCoreRLApp.add_async_task

        def saving_usage(
            self: Any, result: dict[str, Any], rollout_config: dict[str, Any], result_key: str, payload: Any = None
        ) -> Any:
            if isinstance(result, dict):
                result[RESULT_USAGE_KEY] = current_usage()
            return save_result(
                self, result=result, rollout_config=rollout_config, result_key=result_key, payload=payload
            )

        def counting(self: Any, name: str, metadata: Any = None) -> Any:
            note_rollout_started()  # ART registers one async task per rollout it starts
            return add_async_task(self, name, metadata)

        saving_usage.__doc__ = save_result.__doc__
        AgentCoreRLApp.save_result = saving_usage
        AgentCoreRLApp.add_async_task = counting
        AgentCoreRLApp._rollout_usage_installed = True
