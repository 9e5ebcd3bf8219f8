"""Agent-side helpers for agents served by AgentCore Runtime in the rollout pipeline.

- `context`: the rollout context on `contextvars` (`current_rollout()`, `run_in_thread`, `submit_with_context`);
- `inference`: sampling params, token-capture headers, OpenAI clients wired for the current rollout;
- `strands_model`: `RolloutOpenAIModel`, a Strands model safe to share between concurrent rollouts;
- `app`: `RolloutApp` (ART's `AgentCoreRLApp` + the rollout context) and `serve()`;
- `host`: the agent host every session runs (imports the author's module, `app.run()` deferred: `modules`, and
  serves its app); `rft_host` / `rft_door`: serve a SageMaker RFT SDK agent unchanged (the RFT adapter and its
  loopback front door);
- `rewards`: the GSM8K reward; `testing`: a fake OpenAI-compatible model server.

Importing this package imports the standard library and `rollout_pipeline.config` (pydantic); `app`,
`strands_model` and `rft_host` need the `agent` extra.
"""

from rollout_pipeline.agent.context import (
    NoRolloutContext,
    RolloutContext,
    clear_rollout_context,
    current_rollout,
    get_rollout,
    rollout_context,
    run_in_thread,
    set_rollout_context,
    submit_with_context,
    with_rollout_context,
)
from rollout_pipeline.agent.inference import (
    TokenCapture,
    TokenCaptureError,
    async_openai_client,
    inference_headers,
    inference_params,
    model_id,
    openai_client,
    openai_client_kwargs,
)

__all__ = [
    "NoRolloutContext",
    "RolloutContext",
    "TokenCapture",
    "TokenCaptureError",
    "async_openai_client",
    "clear_rollout_context",
    "current_rollout",
    "get_rollout",
    "inference_headers",
    "inference_params",
    "model_id",
    "openai_client",
    "openai_client_kwargs",
    "rollout_context",
    "run_in_thread",
    "set_rollout_context",
    "submit_with_context",
    "with_rollout_context",
]
