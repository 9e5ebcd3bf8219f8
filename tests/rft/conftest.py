"""Tests that need the SageMaker RFT SDK (`sagemaker-train`, the `rft` extra): run by `make rft-test` in their own
environment (.venv-rft); not collected where the SDK is not installed (it does not resolve under the dev pins)."""

from __future__ import annotations

import importlib.util


def _sdk_installed() -> bool:
    try:
        return importlib.util.find_spec("sagemaker.train.rft") is not None
    except ModuleNotFoundError:
        return False


collect_ignore_glob = [] if _sdk_installed() else ["test_*.py"]
