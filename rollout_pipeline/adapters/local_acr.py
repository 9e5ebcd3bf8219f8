"""Former home of local mode's ACR stand-in, kept so existing imports work: it lives in `rollout_pipeline.local.acr`."""

from rollout_pipeline.local.acr import LocalAgentRuntime

__all__ = ["LocalAgentRuntime"]
