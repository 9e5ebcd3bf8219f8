"""A minimal GRPO-style consumer: submit a dataset, then turn each completed group into advantages.

    python examples/grpo_consumer.py -e my-exp train.jsonl --group-size 8        # a deployed experiment
    python examples/grpo_consumer.py --outputs-file outputs.json train.jsonl     # cdk deploy --outputs-file's file
    python examples/grpo_consumer.py train.jsonl     # after `export ROLLOUTS_ENDPOINT_URL=... ROLLOUTS_EXPERIMENT=...`
                                                     # as `rollouts local up` prints it

For every `Group Completed` event the pipeline pushes, the group-relative advantage of rollout i is
`(r_i - mean(r)) / (std(r) + eps)` over the group's successful rollouts (`Group.advantages()`, the SDK's one formula:
`contracts.grpo_advantages`); failed rollouts (never disguised as reward 0) get no advantage and would be left out
of the policy update. A real trainer would join each rollout's
`session_id` with its token traces (from the model gateway) and take a gradient step per batch.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from rollout_pipeline.sdk import Experiment, Group, SdkError


def describe(group: Group) -> str:
    shown = ["  fail" if a is None else f"{a:+.3f}" for a in group.advantages()]
    return f"{group.input_id:>16}  rewards={group.rewards}  advantages=[{', '.join(shown)}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset", type=Path, help=".jsonl / .jsonl.gz / .json dataset")
    parser.add_argument(
        "-e",
        "--experiment",
        default=os.environ.get("ROLLOUTS_EXPERIMENT"),
        help="experiment (default: $ROLLOUTS_EXPERIMENT)",
    )
    parser.add_argument("--outputs-file", type=Path, help="stack outputs JSON (`cdk deploy --outputs-file`'s)")
    parser.add_argument("--endpoint-url", help="a local pipeline's endpoint (default: $ROLLOUTS_ENDPOINT_URL)")
    parser.add_argument("--group-size", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=3600, help="give up after this many seconds")
    args = parser.parse_args()

    try:
        if args.outputs_file:
            experiment = Experiment.from_outputs(
                args.outputs_file, name=args.experiment, endpoint_url=args.endpoint_url
            )
        elif args.experiment:
            experiment = Experiment.attach(args.experiment, endpoint_url=args.endpoint_url)
        else:
            parser.error("name the experiment: -e NAME (or $ROLLOUTS_EXPERIMENT), or --outputs-file FILE")
        batch_id = experiment.batches.submit_file(args.dataset, group_size=args.group_size)
        print(f"batch {batch_id}: waiting for groups (pushed events, no polling)", flush=True)
        for group in experiment.events.groups(batch_id, timeout=args.timeout):
            print(describe(group), flush=True)
        status = experiment.batches.status(batch_id)
    except SdkError as exc:
        parser.exit(1, f"{parser.prog}: error: {exc}\n")
    print(f"done: {status.succeeded} succeeded, {status.failed} failed, reward mean {status.reward_mean}")


if __name__ == "__main__":
    main()
