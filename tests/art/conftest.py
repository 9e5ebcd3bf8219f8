"""Tests that need ART 0.2.0's rollout extra (aiobotocore): run by `make art-test` in a separate environment
(`agentcore-rl-toolkit[rollout]==0.2.0` next to this library); not collected where the extra is not installed."""

from __future__ import annotations

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("aiobotocore") else ["test_*.py"]
