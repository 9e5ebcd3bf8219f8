"""Trainer integrations: the pipeline behind the trainer-side APIs people already use.

- `rollout_pipeline.trainers.art.PipelineSession`: an ART 0.2.0 `RolloutSession` backend, selected by import path
  in ART's `rollout_session_backend` config (veRL's `RolloutSessionAgentLoop`, slime's `generate`). See
  docs/trainers.md.

This `__init__` imports nothing, so the SDK does not pull in ART.
"""
