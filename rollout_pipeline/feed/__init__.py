"""The feed: the one way work reaches the rollout queue (messages, the release window, `Feed`)."""
