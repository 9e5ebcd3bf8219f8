"""Lambda entry points: thin handlers over the rollout_pipeline library (one module per function)."""
