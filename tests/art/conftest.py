"""Tests that need ART 0.2.0's rollout extra (aiobotocore): run by `make art-test` in a separate environment
(`agentcore-rl-toolkit[rollout]==0.2.0` next to this library); skipped where the extra is not installed."""

from __future__ import annotations

import pytest

pytest.importorskip("aiobotocore", reason="ART's [rollout] extra is not installed here: run `make art-test`")
