"""The pipeline as SageMaker MTRL's environment, on this machine: a stand-in of MTRL drives the forwarder Lambda.

    python examples/mtrl_environment.py --local            # a summary
    python examples/mtrl_environment.py --local --json     # the figures as JSON

Runs in the RFT environment (`make rft-test` makes `.venv-rft`: the example agent needs `sagemaker-train`). A
stand-in of MTRL built from its documented contract (`rollout_pipeline.local.mtrl`: at most 32 rollouts in flight,
every rollout invoked again with the same `rolloutId`, its 600 s deadline scaled down, a loopback job runtime that
records `Sample`, `CompleteRollout` and `UpdateReward`) invokes the MTRL forwarder of a local pipeline in MTRL
environment mode, which runs the example RFT agent (`rollout_pipeline/agent/examples/rft_math_agent.py`)
unchanged against a fake model. Two rollouts fail for infrastructure: the job runtime fails one's model call
(`agent_error`) and hangs the other's past the pipeline's deadline (`timeout`). Printed:

- `rollouts`, `completed` (ready and rewarded at MTRL), `failed_reported_failed` (failing rollouts MTRL was told
  failed), `zero_rewards_for_failures` (rewards MTRL got for a failed rollout: must be 0), `duplicate_enqueues`
  (rollouts enqueued beyond one per `rolloutId`: must be 0), `max_in_flight` (at most 32);
- `pipeline`: how the pipeline recorded them (outcomes by failure reason, cost per rollout), and more.

The deployed route (the stack's forwarder ARN in `CreateJob`'s `CustomAgentLambdaConfig`): docs/trainers.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from rollout_pipeline.local.mtrl import MTRL_MAX_IN_FLIGHT, run_local_mtrl

HEADLINE = (
    "rollouts",
    "completed",
    "failed_reported_failed",
    "zero_rewards_for_failures",
    "duplicate_enqueues",
    "max_in_flight",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local", action="store_true", help="run MTRL's stand-in against local mode (required)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--rollouts", type=int, default=40, help="rollouts MTRL asks for (default 40)")
    parser.add_argument("--max-in-flight", type=int, default=MTRL_MAX_IN_FLIGHT, help="MTRL's rollout_max_concurrency")
    parser.add_argument("--time-scale", type=float, default=0.1, help="MTRL's 600 s deadline x this (default 0.1)")
    args = parser.parse_args(argv)
    if not args.local:
        parser.error("only --local runs here; a deployed experiment is MTRL's environment through CreateJob")
    with tempfile.TemporaryDirectory(prefix="mtrl-local-") as work:
        figures = run_local_mtrl(
            rollouts=args.rollouts,
            max_in_flight=args.max_in_flight,
            time_scale=args.time_scale,
            work_dir=Path(work),
        )
    if args.json:
        print(json.dumps(figures, sort_keys=True))
    else:
        for key in HEADLINE:
            print(f"{key:>26}: {figures[key]}")
        print(f"{'pipeline':>26}: {figures['pipeline']}")
    ok = figures["zero_rewards_for_failures"] == 0 and figures["duplicate_enqueues"] == 0
    return 0 if ok and figures["failed_reported_failed"] == figures["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
