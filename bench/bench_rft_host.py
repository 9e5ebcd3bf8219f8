"""The RFT host's cost against the plain ART app, same machine, same task, same loopback model and S3.

- cold start: agent process spawned -> `/ping` answers, for (a) a plain ART agent (`AgentCoreRLApp`), (b) the RFT
  host serving a plain `@app.entrypoint` (the host alone) and (c) the RFT host serving the example RFT agent
  (`@sagemaker_rft_handler`: the SDK's import included);
- per rollout: `/invocations` answered, and invoke -> result object readable in S3, for the ART agent and the
  example RFT agent (one model call each; the RFT one also posts `/complete-rollout` and `/update-reward`);
- per model call: a chat completion sent straight to the model vs through the front door (keep-alive client, both
  non-streaming and streaming).

Loopback only: a fake OpenAI-compatible model (no delay) and a moto S3 server. Needs the `rft` extra:
`make rft-bench` (the `make rft-test` environment). About a minute.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from http.server import BaseHTTPRequestHandler  # noqa: E402

import boto3  # noqa: E402

from rollout_pipeline.agent.context import RolloutContext  # noqa: E402
from rollout_pipeline.agent.rft_door import FrontDoor  # noqa: E402
from rollout_pipeline.agent.testing import FakeModelServer  # noqa: E402
from rollout_pipeline.local.acr import AgentProcess  # noqa: E402
from rollout_pipeline.local.moto_server import local_aws_environ, moto_server  # noqa: E402

REGION = "us-east-1"
BUCKET = "bench"
RFT_AGENT = "rollout_pipeline.agent.examples.rft_math_agent"
JOB = "arn:aws:sagemaker:us-east-1:123456789012:training-job/bench"

ART_AGENT = textwrap.dedent(
    """
    import argparse
    from agentcore_rl_toolkit import AgentCoreRLApp
    from openai import OpenAI

    app = AgentCoreRLApp()


    @app.rollout_entrypoint
    def invoke(payload):
        config = payload["_rollout"]
        client = OpenAI(base_url=config["base_url"], api_key="EMPTY")
        reply = client.chat.completions.create(
            model=config["model_id"], messages=[{"role": "user", "content": payload["question"]}]
        ).choices[0].message.content
        return {"rewards": 1.0 if "15" in reply else 0.0}


    if __name__ == "__main__":
        parser = argparse.ArgumentParser()
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8080)
        args = parser.parse_args()
        app.run(port=args.port, host=args.host)
    """
)
PLAIN_ENTRYPOINT = textwrap.dedent(
    """
    from bedrock_agentcore.runtime import BedrockAgentCoreApp

    app = BedrockAgentCoreApp()


    @app.entrypoint
    def invoke(payload):
        return {"reward": 1.0}
    """
)


def summary(values_s: list[float]) -> str:
    ms = sorted(v * 1000 for v in values_s)
    p95 = ms[min(len(ms) - 1, int(0.95 * len(ms)))]
    return f"median {statistics.median(ms):7.1f} ms   p95 {p95:7.1f} ms   (n={len(ms)})"


def cold_start(module: str, env: dict[str, str], runs: int, kind: str = "art", hosted: bool = True) -> list[float]:
    times = []
    for _ in range(runs):
        started = time.monotonic()
        agent = AgentProcess(module, kind=kind, hosted=hosted, env=env).start()
        try:
            agent.wait_ready(timeout_s=60)
            times.append(time.monotonic() - started)
        finally:
            agent.stop()
    return times


def rollouts(agent: AgentProcess, s3: Any, model: FakeModelServer, label: str, count: int) -> tuple[list, list]:
    answered, done = [], []
    for number in range(count + 1):
        session = f"{label}-{number}-".ljust(40, "x")
        payload = {
            "question": "7 + 8",
            "answer": "15",
            "_rollout": {
                "exp_id": "bench",
                "input_id": label,
                "s3_bucket": BUCKET,
                "base_url": model.base_url,
                "model_id": "fake-model",
                "session_id": session,
            },
        }
        started = time.monotonic()
        status, answer = agent.invoke(session, payload)
        replied = time.monotonic()
        assert status == 200, answer
        assert answer["status"] == "processing", answer
        key = answer["result_key"]
        deadline = started + 30
        while True:
            try:
                body = json.loads(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
                break
            except s3.exceptions.NoSuchKey:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{label}: no result after 30 s") from None
                time.sleep(0.002)
        finished = time.monotonic()
        assert body.get("rewards") == 1.0, body
        if number:  # the first rollout of a process warms its imports and connections
            answered.append(replied - started)
            done.append(finished - started)
    return answered, done


def model_calls(target: Callable[[], http.client.HTTPConnection], path: str, stream: bool, count: int) -> list[float]:
    connection = target()
    body = json.dumps({"model": "default", "messages": [{"role": "user", "content": "7 + 8"}], "stream": stream})
    times = []
    for number in range(count + 1):
        started = time.monotonic()
        connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        if response.will_close:
            connection.close()
            connection = target()
        if number:
            times.append(time.monotonic() - started)
    connection.close()
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cold-starts", type=int, default=5)
    parser.add_argument("--rollouts", type=int, default=30)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args(argv)
    # The fake model of this process answers without Nagle's wait, so the front door's own cost is not hidden
    # under a 40 ms delayed-ACK floor (the front door sets the same on its sockets).
    BaseHTTPRequestHandler.disable_nagle_algorithm = True

    with tempfile.TemporaryDirectory() as tmp, moto_server() as endpoint, FakeModelServer("15") as model:
        agents = Path(tmp)
        (agents / "bench_art_agent.py").write_text(ART_AGENT)
        (agents / "bench_plain_entrypoint.py").write_text(PLAIN_ENTRYPOINT)
        base_env = {**local_aws_environ(endpoint, REGION), "PYTHONPATH": str(agents), "SAGEMAKER_JOB_ARN": JOB}
        s3 = boto3.client(
            "s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id="local", aws_secret_access_key="local"
        )
        s3.create_bucket(Bucket=BUCKET)

        print("cold start (spawn -> /ping answers; every process is the agent host):")
        art = cold_start("bench_art_agent", base_env, args.cold_starts)
        print(f"  ART app (AgentCoreRLApp)            {summary(art)}")
        alone = cold_start("bench_art_agent", base_env, args.cold_starts, hosted=False)
        print(f"  ART app run as itself (python -m)   {summary(alone)}")
        plain = cold_start("bench_plain_entrypoint", base_env, args.cold_starts, "rft")
        print(f"  RFT host, plain @app.entrypoint     {summary(plain)}")
        print(
            f"  RFT host, example RFT agent (SDK)   {summary(cold_start(RFT_AGENT, base_env, args.cold_starts, 'rft'))}"
        )

        with AgentProcess("bench_art_agent", kind="art", env=base_env) as art:
            art_answered, art_done = rollouts(art, s3, model, "art", args.rollouts)
        with AgentProcess(RFT_AGENT, kind="rft", env=base_env) as rft:
            rft_answered, rft_done = rollouts(rft, s3, model, "rft", args.rollouts)
        print("per rollout (one model call each; sequential, one process):")
        print(f"  ART app      /invocations answered  {summary(art_answered)}")
        print(f"  RFT host     /invocations answered  {summary(rft_answered)}")
        print(f"  ART app      invoke -> result in S3 {summary(art_done)}")
        print(f"  RFT host     invoke -> result in S3 {summary(rft_done)}")
        added = statistics.median(rft_done) - statistics.median(art_done)
        print(f"  added by the RFT host (medians)     {added * 1000:7.1f} ms")

        with FrontDoor() as door:
            context = RolloutContext.from_payload(
                {"_rollout": {"session_id": "bench", "base_url": model.base_url, "model_id": "fake-model"}}
            )
            door.register("bench", context, JOB)

            def direct() -> http.client.HTTPConnection:
                return http.client.HTTPConnection("127.0.0.1", model.port, timeout=30)

            def through_door() -> http.client.HTTPConnection:
                return http.client.HTTPConnection("127.0.0.1", door.port, timeout=30)

            print("per model call (keep-alive client):")
            for stream in (False, True):
                kind = "streaming    " if stream else "non-streaming"
                straight = model_calls(direct, "/v1/chat/completions", stream, args.calls)
                doored = model_calls(through_door, "/rollouts/bench/v1/chat/completions", stream, args.calls)
                print(f"  {kind} straight to the model     {summary(straight)}")
                print(f"  {kind} through the front door    {summary(doored)}")
                extra = statistics.median(doored) - statistics.median(straight)
                print(f"  {kind} added by the front door   {extra * 1000:7.1f} ms")


if __name__ == "__main__":
    main()
