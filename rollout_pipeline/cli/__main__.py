"""`python -m rollout_pipeline.cli`: the `rollouts` command."""

import sys

from rollout_pipeline.cli import main

sys.exit(main())
