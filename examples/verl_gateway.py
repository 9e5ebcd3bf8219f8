"""verl's agent gateway route, measured: verl's framework and gateway drive a batch through the pipeline.

    python examples/verl_gateway.py --local --json

`--local` starts the local pipeline (the example math agent, in agent processes; a fake OpenAI-compatible model on
loopback behind the gateway) and verl's `OpenAICompatibleAgentFramework` with its gateway: the stand-in of
`rollout_pipeline.trainers.verl_standin`, since no verl release ships them (docs/trainers.md, "verl's gateway").
The route (`rollout_pipeline.trainers.verl.VerlGatewayRoute`) is the framework's `agent_runner`: each sample becomes
one pipeline rollout whose agent calls the model through its gateway session; the rollout's event POSTs
`/sessions/{id}/complete` with its `reward_info`, and verl finalizes the captured trajectory and scores it with
`reward_from_info`. One sample's agent fails (a question it refuses): it is excluded, never scored 0.

It prints `samples`, `completed_via_gateway` (sessions whose `/complete` reached the gateway), `trained` (of them,
finalized with a captured trajectory and scored), `excluded` (failed rollouts: no reward, not trained),
`reward_info_matches` (sessions whose `reward_info` at the gateway is what the pipeline's event says),
`tokens_captured`, and the time from the result written (the event's `finished_at`) to `/complete` received,
median and p99 (`complete_latency_s`). It exits 1 unless every sample completed through the gateway with the
pipeline's `reward_info` and was either trained or excluded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))

from rollout_pipeline.agent.testing import FakeModelServer, RecordedRequest  # noqa: E402
from rollout_pipeline.contracts import DetailType, RolloutCompleted, RolloutFailed  # noqa: E402
from rollout_pipeline.trainers.verl import VerlGatewayRoute, reward_from_info, reward_info  # noqa: E402
from rollout_pipeline.trainers.verl_standin import LocalGateway, OpenAICompatibleAgentFramework  # noqa: E402

#: The sample the agent refuses (an empty question): its rollout fails, so it is excluded.
REFUSED = ""


def samples(count: int) -> list[dict[str, Any]]:
    """verl-shaped samples: OpenAI messages as `raw_prompt`, the ground truth among the sample's fields."""
    rows = [
        {"raw_prompt": [{"role": "user", "content": f"What is {i} + 40?"}], "answer": str(i + 40)} for i in range(count)
    ]
    rows[-1] = {"raw_prompt": [{"role": "user", "content": REFUSED}], "answer": "0"}
    return rows


def math_payload(raw_prompt: Any, sample_index: int, fields: dict[str, Any]) -> dict[str, Any]:
    """The example math agent's payload: the last user message as the question, the sample's answer."""
    question = next((m["content"] for m in reversed(raw_prompt) if m.get("role") == "user"), "")
    return {"question": question, "answer": fields.get("answer"), "sample_index": sample_index}


def reply(request: RecordedRequest) -> str:
    """The fake model: right for even questions, wrong for odd ones (rewards that differ)."""
    text = json.dumps(request.body.get("messages") or [])
    for n in range(40, 140):
        if f"What is {n - 40} + 40?" in text:
            return f"{n if n % 2 == 0 else n + 1}"
    return "I do not know"


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def drive(route: VerlGatewayRoute, gateway: LocalGateway, count: int, timeout_s: float) -> Any:
    framework = OpenAICompatibleAgentFramework(
        gateway,
        route.agent_runner,
        reward_from_info,
        completion_timeout=timeout_s,  # above the rollout's whole life (queue wait + timeout x attempts)
        wait_for_completion_after_agent_run=True,  # else verl finalizes an empty session as soon as the runner returns
    )
    return await framework.generate_sequences(samples(count))


def measure(
    count: int, route: VerlGatewayRoute, gateway: LocalGateway, generated: Any, events: dict[str, Any]
) -> dict[str, Any]:
    """The figures the module doc lists, from the gateway's records and the pipeline's events."""
    received = {session: (info, at) for session, info, at in gateway.completions}
    trained = {t.session_id for t in generated.trajectories}
    matches = sum(
        1 for session, (info, _) in received.items() if session in events and info == reward_info(events[session])
    )
    latencies = [
        at - route.times.written[session] for session, (_, at) in received.items() if session in route.times.written
    ]
    return {
        "samples": count,
        "completed_via_gateway": len(received),
        "trained": len(trained & set(received)),
        "excluded": sum(1 for info, _ in received.values() if info.get("excluded")),
        "failed_in_verl": len(generated.failed),
        "reward_info_matches": matches,
        "tokens_captured": sum(len(t.response_ids) for t in generated.trajectories),
        "generated_tokens": sum(sum(t.response_mask) for t in generated.trajectories),
        "complete_latency_s": {
            "median": statistics.median(latencies) if latencies else None,
            "p99": percentile(latencies, 0.99),
            "max": max(latencies, default=None),
        },
        "verl": "stand-in of verl-project/verl PR 5926 (verl 0.9.1 on PyPI ships no agent_framework / agent_gateway)",
    }


def run_local(count: int, timeout_s: float, work_dir: Path | None) -> dict[str, Any]:
    from rollout_pipeline.local.pipeline import LocalPipeline, LocalSettings

    with FakeModelServer(reply) as model:
        gateway = LocalGateway(model.base_url).start()
        settings = LocalSettings(
            experiment="verl-gateway",
            group_size=1,
            max_attempts=1,
            max_sessions=4,
            rollout_timeout_s=120,
            model_url=model.base_url,
            isolation="shared",
            warm_processes=1,
            work_dir=work_dir,
            sampling_params={"temperature": 0.0, "max_tokens": 32},
        )
        try:
            with LocalPipeline(settings) as pipeline:
                route = VerlGatewayRoute(pipeline.experiment, poll_wait_s=1, payload=math_payload)
                try:
                    generated = asyncio.run(drive(route, gateway, count, timeout_s))
                finally:
                    route.close()
                events = pipeline_events(pipeline.experiment, route.batch_ids)
                return measure(count, route, gateway, generated, events)
        finally:
            gateway.stop()


def pipeline_events(experiment: Any, batch_ids: list[str]) -> dict[str, RolloutCompleted | RolloutFailed]:
    """Every rollout event of the route's batches, by gateway session (rebuilt from the ledger)."""
    types = [DetailType.ROLLOUT_COMPLETED, DetailType.ROLLOUT_FAILED]
    return {event.detail.input_id: event.detail for event in experiment.events.replay(batch_ids, detail_types=types)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local", action="store_true", required=True, help="run against local mode (no AWS)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--timeout-s", type=float, default=180.0, help="verl's completion_timeout")
    parser.add_argument("--work-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    started = time.monotonic()
    figures = run_local(max(2, args.samples), args.timeout_s, args.work_dir)
    figures["run_s"] = round(time.monotonic() - started, 1)
    if args.json:
        print(json.dumps(figures))
    else:
        for key, value in figures.items():
            print(f"{key}: {value}")
    samples = figures["samples"]
    ok = figures["reward_info_matches"] == figures["completed_via_gateway"] == samples
    return 0 if ok and figures["trained"] + figures["excluded"] == samples else 1


if __name__ == "__main__":
    sys.exit(main())
