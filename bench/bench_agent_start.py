"""A session's agent process in local mode: forked from a warm parent against started afresh, in one run.

For each side, one `LocalAgentRuntime` with no warm spare opens `--sessions` sessions one after another, each with a
warm-up invocation (answered by the agent host itself: no model needed), so every invocation waits for its session's
process to start and answer `/ping`. Before the runtime closes, each process's CPU (user + system, /proc) and, on the
forked side, the parent's is read.

Printed for each side (`--json`: one object): `session_start_s` (invocation of a new session to its answer: median
and max), `process_cpu_s` (each process's own CPU: median), `parent_cpu_s` (the warm parent's, once per runtime),
`total_cpu_s` (every process and the parent) and `forked` (whether the runtime could fork).

Usage: python bench/bench_agent_start.py [--sessions 8] [--agent-module MODULE] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from rollout_pipeline.config import DEFAULT_AGENT_MODULES, warmup_payload  # noqa: E402
from rollout_pipeline.local.acr import LocalAgentRuntime  # noqa: E402


def cpu_s(pid: int) -> float:
    """The CPU seconds (user + system) process `pid` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def side(forked: bool, sessions: int, module: str) -> dict[str, Any]:
    """Open `sessions` sessions one after another on a runtime of its own; their start times and CPU."""
    waits: list[float] = []
    cpus: list[float] = []
    with tempfile.TemporaryDirectory() as logs:
        runtime = LocalAgentRuntime(module, warm_processes=0, max_sessions=sessions, log_dir=Path(logs), forked=forked)
        try:
            for number in range(sessions):
                session = f"bench-agent-start-{number:030d}"
                began = time.monotonic()
                runtime.invoke(session, warmup_payload("bench", session))
                waits.append(time.monotonic() - began)
                process = runtime.process_of(session)
                assert process is not None
                assert process.pid is not None
                cpus.append(cpu_s(process.pid))
            parent = runtime.parent_pid
            parent_cpu = cpu_s(parent) if parent is not None else 0.0
            could_fork = runtime.forked
        finally:
            runtime.close()
    return {
        "forked": could_fork,
        "session_start_s": {"median": round(statistics.median(waits), 3), "max": round(max(waits), 3)},
        "process_cpu_s": round(statistics.median(cpus), 3),
        "parent_cpu_s": round(parent_cpu, 3),
        "total_cpu_s": round(sum(cpus) + parent_cpu, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--agent-module", default=DEFAULT_AGENT_MODULES["art"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = {
        name: side(forked, args.sessions, args.agent_module) for name, forked in (("forked", True), ("afresh", False))
    }
    results["sessions"] = args.sessions
    results["agent_module"] = args.agent_module
    if args.json:
        print(json.dumps(results))
        return
    print(f"{args.sessions} sessions of {args.agent_module}, one after another")
    for name in ("forked", "afresh"):
        r = results[name]
        print(
            f"{name:>7}: session start median {r['session_start_s']['median']:.2f} s (max "
            f"{r['session_start_s']['max']:.2f}), CPU per process {r['process_cpu_s']:.2f} s, parent "
            f"{r['parent_cpu_s']:.2f} s, total {r['total_cpu_s']:.1f} s"
        )


if __name__ == "__main__":
    main()
