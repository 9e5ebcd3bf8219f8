"""Operator code: what an operator runs around an experiment's stack, never the trainer's loop.

`preflight` (read-only checks before a deploy), `deploy_settings` (the stack-only settings, shared with `cdk synth`),
`launch` (create, update and destroy a stack through `cdk`, the CDK CLI runner), `smoke` (`rollouts smoke`),
`permissions` (what the trainer's principal needs: the stack's trainer policy) and `subscriptions` (finding and
pruning the SDK's private subscriptions). It runs on the SDK; the SDK reaches it only through `operations`
(the entry point `rollout_pipeline.operations`). The stack imports `permissions` and `deploy_settings`, which import
only the library's base, so this package's `__init__` imports nothing.
"""
