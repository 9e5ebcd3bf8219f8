#!/usr/bin/env python3
"""CDK entry point: `cdk synth|deploy -c experiment=NAME [-c key=value ...]` -> one stack `Rollouts-NAME`."""

from __future__ import annotations

import os
import sys

# jsii's Node runs the CDK; Node 20 works but prints an end-of-life banner on every synth.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from rollout_pipeline.config import ConfigError
from stacks.application import build_app


def main() -> int:
    try:
        app, _stack = build_app()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
