"""Example SageMaker RFT agent: the math agent's task, written the way public RFT agents are written.

Nothing from this project is imported: it is a plain `BedrockAgentCoreApp` with `@app.entrypoint` over the SDK's
`@sagemaker_rft_handler` (PyPI `sagemaker-train` 1.27.0, the `rft` extra), calls the model at
`metadata["endpoint"] + "/v1"` with a bearer token from the SDK's token generator and the SDK's inference headers,
reads `inferenceParams` in camel case and returns `{"reward": r}`. Run it on the pipeline through the agent host's
RFT adapter:

    rollouts local demo --agent-module rollout_pipeline.agent.examples.rft_math_agent   # detected as an RFT agent
    python -m rollout_pipeline.agent.host --agent-module rollout_pipeline.agent.examples.rft_math_agent --agent-kind rft

Payload fields read: `question` (or `prompt`), `answer` (the expected number, e.g. `"15"` or `"#### 15"`), and for
tests `fail` (raise with that message) and `no_reward` (return no reward). Run alone (`python -m ...`) it serves
`BedrockAgentCoreApp` on port 8080, as it would under SageMaker.
"""

from __future__ import annotations

import re
from typing import Any

from bedrock_agentcore.runtime import BedrockAgentCoreApp
from openai import OpenAI
from sagemaker.core.token_generator import generate_token
from sagemaker.train.rft import make_inference_headers, sagemaker_rft_handler

SYSTEM_PROMPT = "You are a calculator. Reply with only the result, a single number."
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")

app = BedrockAgentCoreApp()


def last_number(text: str) -> float | None:
    """The last number written in `text` (`"7 + 8 = 15"` -> 15.0), or None."""
    found = _NUMBER.findall(text.replace(",", ""))
    return float(found[-1]) if found else None


def reward_of(reply: str, answer: Any) -> float:
    """1.0 when the reply's last number equals the expected answer's, else 0.0."""
    expected = last_number(str(answer or ""))
    got = last_number(reply)
    return 1.0 if expected is not None and got is not None and abs(got - expected) < 1e-6 else 0.0


@app.entrypoint
@sagemaker_rft_handler
def invoke_agent(payload: dict[str, Any]) -> dict[str, Any]:
    """One rollout: ask the model, score its last number."""
    metadata = payload["metadata"]
    params = payload.get("inferenceParams") or {}
    if payload.get("fail"):
        raise RuntimeError(f"rft agent failed: {payload['fail']}")
    client = OpenAI(
        base_url=metadata["endpoint"] + "/v1",
        api_key=generate_token(region=metadata.get("region")),
        default_headers=make_inference_headers(metadata),
    )
    question = payload.get("question") or payload.get("prompt") or payload["instance"]["question"]
    sampling = {
        "temperature": params.get("temperature"),
        "max_tokens": params.get("maxTokens"),
        "top_p": params.get("topP"),
    }
    response = client.chat.completions.create(
        model="default",
        messages=[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": str(question)}],
        **{key: value for key, value in sampling.items() if value is not None},
    )
    reply = response.choices[0].message.content or ""
    if payload.get("no_reward"):
        return {"response": reply}
    return {"reward": reward_of(reply, payload.get("answer")), "response": reply}


if __name__ == "__main__":
    app.run()
