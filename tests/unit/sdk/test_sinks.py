"""The sinks setting compiled (`rollout_pipeline.sinks`): the request an event becomes is the same for the deployed
API destination (input transformer, path parameters) and the local consumer; bad settings are refused by name; the
verl gateway recipe posts exactly the `reward_info` the in-process route posts."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rollout_pipeline import sinks
from rollout_pipeline.config import ConfigError, SinkSettings, validate_config
from rollout_pipeline.contracts import FailureReason
from rollout_pipeline.trainers.verl import complete_url, gateway_sink, reward_from_info, reward_info
from tests.sdk_events import B1, completed, failed


def envelope(detail: Any) -> dict[str, Any]:
    """An event as EventBridge hands it to a target."""
    return {"detail-type": "x", "source": "rollout.pipeline", "detail": json.loads(detail.model_dump_json())}


def test_a_template_becomes_an_input_transformer_and_renders_the_same_locally() -> None:
    body = sinks.compile_body({"a": "$.detail.reward", "b": ["$.detail.input_id", 1], "c": "$.detail.reward", "d": "x"})
    assert body.paths == (("v0", "$.detail.reward"), ("v1", "$.detail.input_id"))
    assert body.input_template == '{"a":<v0>,"b":[<v1>,1],"c":<v0>,"d":"x"}'
    event = envelope(completed(B1, "q1", 0, 0.5))
    assert json.loads(body.render(event)) == {"a": 0.5, "b": ["q1", 1], "c": 0.5, "d": "x"}
    assert sinks.compile_body("$.detail").input_path == "$.detail"
    assert json.loads(sinks.compile_body({"missing": "$.detail.nope.deeper"}).render(event)) == {"missing": None}


def test_url_path_parameters_are_the_endpoints_stars() -> None:
    sink = sinks.compile_sink(SinkSettings(name="s", url="https://h.example/sessions/{$.detail.input_id}/x"))
    assert (sink.endpoint, sink.path_parameters) == ("https://h.example/sessions/*/x", ("$.detail.input_id",))
    event = envelope(completed(B1, "a:b", 0, 1.0))
    assert sink.url_for(event) == "https://h.example/sessions/a%3Ab/x"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"events": ["Rollout Done"]}, "unknown detail type"),
        ({"body": {"r": "$.detail[reward]"}}, "not a path EventBridge reads"),
        ({"url": "https://h.example/*/x"}, "only as a {\\$.path} parameter"),
        ({"bodies": {"Batch Completed": {}}}, "does not take"),
    ],
)
def test_bad_sink_settings_are_refused_by_name(change: dict[str, Any], message: str) -> None:
    settings = SinkSettings.model_validate({"name": "bad", "url": "https://h.example/x", **change})
    with pytest.raises(ConfigError, match=f"sinks bad: .*{message}"):
        sinks.compile_sink(settings)


def test_sink_settings_need_their_secret_and_distinct_names() -> None:
    with pytest.raises(ConfigError, match="needs `secret`"):
        validate_config({"name": "x", "sinks": [{"name": "a", "url": "https://h/x", "auth": {"type": "api_key"}}]})
    with pytest.raises(ConfigError, match="a repeated"):
        validate_config(
            {"name": "x", "sinks": [{"name": "a", "url": "https://h/x"}, {"name": "a", "url": "https://h/y"}]}
        )


def test_patterns_never_deliver_surplus_rollouts_nor_flat_groups_when_asked() -> None:
    assert sinks.event_pattern("Rollout Completed", drop_zero_variance=False)["detail"] == {"surplus": [False]}
    assert "detail" not in sinks.event_pattern("Group Completed", drop_zero_variance=False)
    group = sinks.event_pattern("Group Completed", drop_zero_variance=True, batch_prefix="verl")
    assert group["detail"] == {"zero_variance": [False], "batch_id": [{"prefix": "verl"}]}


def test_answers_eventbridge_retries() -> None:
    assert [sinks.retried(s) for s in (None, 500, 503, 429, 409, 401, 407)] == [True] * 7
    assert [sinks.retried(s) for s in (200, 400, 403, 404, 410)] == [False] * 5


def test_the_verl_sink_recipe_posts_what_the_route_posts() -> None:
    sink = sinks.compile_sink(SinkSettings.model_validate(gateway_sink("https://gw.example")))
    for detail in (completed(B1, "session-1-ab", 0, 0.25), failed(B1, "session-2-cd", 0, FailureReason.TIMEOUT)):
        event = envelope(detail)
        route = sink.route(type(detail).__name__.replace("Rollout", "Rollout "))
        assert route is not None
        assert json.loads(route.body.render(event)) == {"reward_info": reward_info(detail)}
        assert sink.url_for(event) == f"https://gw.example/sessions/{detail.input_id}/complete"


def test_verl_reward_fn_reads_the_reward_and_refuses_an_excluded_rollout() -> None:
    class Trajectory:
        def __init__(self, info: dict[str, Any]) -> None:
            self.reward_info, self.session_id = info, "s"

    class Context:
        def __init__(self, *infos: dict[str, Any]) -> None:
            self.trajectories = [Trajectory(i) for i in infos]

    assert reward_from_info(Context(reward_info(completed(B1, "q", 0, 0.5)))) == [0.5]
    excluded = reward_info(failed(B1, "q", 0, FailureReason.THROTTLED))
    assert excluded["reward"] is None
    assert excluded["excluded"] is True
    with pytest.raises(ValueError, match="throttled"):
        reward_from_info(Context(excluded))
    assert complete_url("http://10.0.0.1:8000/sessions/s-1/v1") == "http://10.0.0.1:8000/sessions/s-1/complete"


def test_the_recipes_in_the_trainers_guide_compile() -> None:
    """Every `json` block of docs/trainers.md's "HTTP sinks" section is a sink the stack and local mode accept."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[3] / "docs" / "trainers.md").read_text()
    section = text[text.index("## HTTP sinks") :]
    blocks = re.findall(r"```json\n(.*?)```", section, flags=re.DOTALL)
    assert len(blocks) == 4
    for block in blocks:
        sink = sinks.compile_sink(SinkSettings.model_validate(json.loads(block)))
        assert sinks.deploy_problems([sink]) == []
    verl = SinkSettings.model_validate(json.loads(blocks[0]))
    assert verl.model_dump() == SinkSettings.model_validate(gateway_sink("https://gateway.example.com")).model_dump()
