"""CDK infrastructure of the rollout pipeline: `ExperimentStack` composes one construct per concern."""
