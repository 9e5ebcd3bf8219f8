"""`endpoints: N` provisions N runtime endpoints, stops are granted on each; max_sessions above the active-session
quota warns at synth, and so does a tps_limit above the ledger's measured ceiling; max_lifetime_s defaults to what
an attempt needs."""

from __future__ import annotations

import json
from pathlib import Path

from aws_cdk.assertions import Annotations, Match

from rollout_pipeline.config import LIFETIME_MARGIN_S
from tests.infra.conftest import Synthesized, synthesize
from tests.infra.test_iam import getatt, join, statements, unordered


def test_two_endpoints_and_their_stop_grants_and_a_quota_warning(tmp_path: Path) -> None:
    synth: Synthesized = synthesize(tmp_path, endpoints=2, max_sessions=3000, tps_limit=1000)
    endpoints = synth.of_type("AWS::BedrockAgentCore::RuntimeEndpoint")
    assert [e["Properties"]["Name"] for e in endpoints.values()] == ["rollouts_1"]
    runtime = getatt(synth.logical_id(synth.stack.agent.runtime), "AgentRuntimeArn")
    for name in ("dispatch", "completion", "sweeper"):
        stop = [
            s
            for s in statements(synth, synth.stack.functions[name].role)
            if "bedrock-agentcore:StopRuntimeSession" in s["Action"]
        ]
        assert unordered(stop[0]["Resource"]) == unordered(
            [
                runtime,
                join(runtime, "/runtime-endpoint/DEFAULT"),
                join(runtime, "/runtime-endpoint/rollouts_1"),
            ]
        )
    retained = sorted(
        json.dumps(r["Properties"]["Create"])
        for r in synth.of_type("Custom::AWS").values()
        if "putRetentionPolicy" in json.dumps(r["Properties"]["Create"])
    )
    assert len(retained) == 2, "each endpoint's runtime log group gets a retention"
    assert any("-DEFAULT" in call for call in retained)
    assert any("-rollouts_1" in call for call in retained)
    warnings = Annotations.from_stack(synth.stack).find_warning("*", Match.string_like_regexp("active-session quota"))
    assert len(warnings) == 1
    ceiling = Annotations.from_stack(synth.stack).find_warning("*", Match.string_like_regexp("measured ceiling"))
    assert len(ceiling) == 1, "tps_limit 1000 is above what the ledger's ceiling needs"
    lifetime = next(iter(synth.of_type("AWS::BedrockAgentCore::Runtime").values()))["Properties"]
    assert lifetime["LifecycleConfiguration"]["MaxLifetime"] == 900 + LIFETIME_MARGIN_S
