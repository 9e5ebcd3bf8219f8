"""An ART agent written the ART way (agentcore-rl-toolkit 0.2.0's README and examples): nothing from the rollout
pipeline, and the module ends in `app.run()`, which binds 127.0.0.1:8080 whatever the process is told. The pipeline's
agent host imports it and serves its app on the address of each session
(tests/integration/lifecycle/test_agent_compat.py, tests/e2e/test_local_pipeline.py).

Its switches, for the tests: `fail` raises (ART's error result), `per_turn` returns one reward per turn."""

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
    if payload.get("fail"):
        raise RuntimeError("boom: " + payload["fail"])
    client = OpenAI(base_url=config["base_url"], api_key=config.get("api_key") or "EMPTY")
    response = client.chat.completions.create(
        model=config["model_id"],
        messages=[{"role": "user", "content": payload["question"]}],
        **config.get("sampling_params", {}),
    )
    text = response.choices[0].message.content or ""
    turn_rewards = [0.0, 1.0 if "#### 42" in text else 0.0]
    return {"rewards": turn_rewards if payload.get("per_turn") else turn_rewards[-1], "text": text}


if __name__ == "__main__":
    app.run()
