"""verl's gateway route, end to end: `python examples/verl_gateway.py --local --json` drives a batch through local
mode (agent processes, the example math agent) with verl's framework and gateway (the stand-in: no verl version ships
them), and every sample completes through the gateway's `/complete` with the pipeline's own `reward_info`; the
sample whose agent fails is excluded (no reward, not trained), never scored 0."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "verl_gateway.py"


def test_verl_drives_a_batch_through_the_gateway_route(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), "--local", "--json", "--samples", "6", "--work-dir", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    assert figures["samples"] == figures["completed_via_gateway"] == figures["reward_info_matches"] == 6
    assert (figures["trained"], figures["excluded"], figures["failed_in_verl"]) == (5, 1, 0)
    assert figures["generated_tokens"] > 0  # the gateway captured what the agents generated through it
    assert figures["complete_latency_s"]["median"] is not None
