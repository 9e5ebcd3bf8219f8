"""An ART agent written with the plain `openai` client as agent authors write one: the question as a list of text
content parts, the reply streamed, the reward computed from whatever text came back. Nothing from the rollout
pipeline (tests/e2e/test_model_replies.py, tests/e2e/test_real_model_agents.py)."""

from typing import Any

try:
    from agentcore_rl_toolkit import AgentCoreRLApp
except ImportError:  # the toolkit's own app is what the library's RolloutApp extends
    from rollout_pipeline.agent.app import RolloutApp as AgentCoreRLApp
from openai import OpenAI

app = AgentCoreRLApp()


@app.rollout_entrypoint
def invoke_agent(payload: dict[str, Any], context: Any) -> dict[str, Any]:
    config = payload["_rollout"]
    client = OpenAI(base_url=config["base_url"], api_key=config.get("api_key") or "EMPTY")
    stream = client.chat.completions.create(
        model=config["model_id"],
        messages=[
            {"role": "system", "content": [{"type": "text", "text": "Reply with only the result, a single number."}]},
            {"role": "user", "content": [{"type": "text", "text": payload["prompt"]}]},
        ],
        stream=True,
        **config.get("sampling_params", {}),
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    return {"rewards": 1.0 if str(payload["answer"]) in text else 0.0, "text": text}


if __name__ == "__main__":
    app.run()
