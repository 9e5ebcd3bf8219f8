"""The synthesized stack has exactly the numbers of `rollout_pipeline.topology` (functions, event source mappings,
queue visibility), and local mode reads the same table (overriding only concurrency, explicitly)."""

from __future__ import annotations

from typing import Any

import pytest

from rollout_pipeline import topology
from rollout_pipeline.config import ExperimentConfig
from rollout_pipeline.local.pipeline import LocalSettings, consumer_specs
from tests.infra.conftest import EXPERIMENT, PUBLIC_MODEL_URL, Synthesized, stack_context

DEFAULTS = ExperimentConfig(name=EXPERIMENT, model_base_url=PUBLIC_MODEL_URL)


def _mappings(synth: Synthesized) -> dict[str, dict[str, Any]]:
    """Event source mapping properties by the logical id of their queue."""
    return {
        m["Properties"]["EventSourceArn"]["Fn::GetAtt"][0]: m["Properties"]
        for m in synth.of_type("AWS::Lambda::EventSourceMapping").values()
    }


def test_functions_have_the_topology_timeouts_and_memory(synth: Synthesized) -> None:
    specs = topology.function_specs(DEFAULTS)
    assert set(synth.stack.functions) == set(topology.FUNCTION_NAMES) == set(specs)
    for name, spec in specs.items():
        props = synth.resources[synth.logical_id(synth.stack.functions[name].function)]["Properties"]
        assert (props["Timeout"], props["MemorySize"]) == (spec.timeout_s, spec.memory_mb), name


def test_event_source_mappings_and_queues_equal_the_topology(synth: Synthesized) -> None:
    specs = topology.function_specs(DEFAULTS)
    consumers = {"ingest": synth.stack.ingest, "dispatch": synth.stack.dispatch, "completion": synth.stack.completion}
    mappings = _mappings(synth)
    assert len(mappings) == len(consumers) == sum(spec.queue_fed for spec in specs.values())
    for name, consumer in consumers.items():
        spec = specs[name]
        queue_id = synth.logical_id(consumer.queue)
        mapping = mappings[queue_id]
        assert mapping["FunctionName"] == {"Ref": synth.logical_id(synth.stack.functions[name].function)}
        assert mapping["BatchSize"] == spec.batch_size, name
        assert mapping.get("MaximumBatchingWindowInSeconds", 0) == spec.batching_window_s, name
        assert mapping["ScalingConfig"] == {"MaximumConcurrency": spec.max_concurrency}, name
        queue = synth.resources[queue_id]["Properties"]
        assert queue["VisibilityTimeout"] == spec.visibility_timeout_s == 6 * spec.timeout_s, name
        assert queue["RedrivePolicy"]["maxReceiveCount"] == topology.DLQ_MAX_RECEIVE_COUNT
    trainer = synth.resources[synth.logical_id(synth.stack.events.trainer_queue)]["Properties"]
    assert trainer["VisibilityTimeout"] == topology.TRAINER_VISIBILITY_TIMEOUT_S
    # Local mode creates its queues from the same derivation.
    assert topology.queue_visibility_timeouts(DEFAULTS) == {
        topology.FUNCTION_QUEUES[name]: specs[name].visibility_timeout_s for name in consumers
    } | {"trainer": trainer["VisibilityTimeout"]}


def test_outputs_and_names_come_from_the_topology(synth: Synthesized) -> None:
    assert set(topology.StackOutputs.names()) <= set(synth.outputs)
    assert synth.artifact.stack_name == topology.stack_name(EXPERIMENT)
    synth.template.has_resource_properties("AWS::Events::EventBus", {"Name": topology.bus_name(EXPERIMENT)})


def test_dispatch_concurrency_is_the_experiments() -> None:
    config = DEFAULTS.model_copy(update={"dispatch_concurrency": 7})
    assert topology.function_specs(config)["dispatch"].max_concurrency == 7


@pytest.mark.parametrize("overrides", [{}, LocalSettings().concurrency_overrides])
def test_local_consumers_are_the_stacks_but_for_explicit_concurrency_overrides(overrides: dict[str, int]) -> None:
    stack = topology.function_specs(DEFAULTS)
    local = consumer_specs(DEFAULTS, overrides)
    assert set(local) == {name for name, spec in stack.items() if spec.queue_fed}
    for name, spec in local.items():
        expected = stack[name]
        if name in overrides:
            assert spec.max_concurrency == overrides[name]
        assert (spec.timeout_s, spec.batch_size, spec.visibility_timeout_s) == (
            expected.timeout_s,
            expected.batch_size,
            expected.visibility_timeout_s,
        )
        if name not in overrides:
            assert spec == expected


def test_visibility_is_derived_and_capped() -> None:
    spec = topology.FunctionSpec("ingest", timeout_s=3 * 3600, memory_mb=128, batch_size=1, max_concurrency=1)
    assert spec.visibility_timeout_s == topology.MAX_VISIBILITY_TIMEOUT_S


def test_synth_derives_the_dispatch_concurrency_from_the_rate(synth: Synthesized) -> None:
    """cdk.json leaves `dispatch_concurrency` unset: synth derives it from the experiment's new-session rate (the
    whole account pool less the reserve, 22.5/s, x `IN_HAND_S` 4.4 s = 99 rollouts in hand, / 25 per Lambda = 4), a
    lower rate asks for fewer, and an explicit value wins. A batch over SQS's 10 per receive has Lambda's batching
    window."""
    mapping = _mappings(synth)[synth.logical_id(synth.stack.dispatch.queue)]
    assert mapping["ScalingConfig"] == {"MaximumConcurrency": 4}
    assert (mapping["BatchSize"], mapping["MaximumBatchingWindowInSeconds"]) == (25, 1)
    assert DEFAULTS.dispatch_concurrency == 4
    context = stack_context()
    assert context["dispatch_concurrency"] == ""  # derived, not pinned, by cdk.json
    assert ExperimentConfig.from_context({**context, "session_rate_limit": "12"}).dispatch_concurrency == 3
    assert ExperimentConfig.from_context({**context, "tps_limit": "8"}).dispatch_concurrency == 2
    assert ExperimentConfig.from_context({**context, "max_sessions": "60"}).dispatch_concurrency == 3
    assert ExperimentConfig.from_context({**context, "dispatch_concurrency": "4"}).dispatch_concurrency == 4


def test_a_warm_pool_derives_dispatchers_for_its_takes_at_the_invoke_rate() -> None:
    """With a warm pool, a GRPO step's takes run at the agent's invoke rate, not the new-session rate: the derived
    dispatchers also hold that rate x `TAKE_IN_HAND_S` takes: 8 at AgentCore's documented 200/s (4 took 116 a
    second in bench_warm), 16 at a raised 400/s."""
    context = {**stack_context(), "max_sessions": "1024"}
    assert ExperimentConfig.from_context(context).dispatch_concurrency == 4
    assert ExperimentConfig.from_context({**context, "warm_sessions": "1024"}).dispatch_concurrency == 8
    raised = {**context, "invoke_rate_limit": "400"}
    assert ExperimentConfig.from_context(raised).dispatch_concurrency == 4  # no warm pool: sessions bind
    assert ExperimentConfig.from_context({**raised, "warm_sessions": "1024"}).dispatch_concurrency == 16
    assert ExperimentConfig.from_context({**raised, "warm_sessions": "auto"}).dispatch_concurrency == 16
    assert ExperimentConfig.from_context({**raised, "warm_sessions": "0"}).dispatch_concurrency == 4
    assert ExperimentConfig.from_context({**raised, "warm_sessions": "off"}).dispatch_concurrency == 4  # as validated
    small = {**raised, "warm_sessions": "1024", "max_sessions": "100"}
    assert ExperimentConfig.from_context(small).dispatch_concurrency == 4  # what max_sessions can start at once


def test_local_mode_derives_the_dispatch_concurrency_from_its_account() -> None:
    """Local mode sizes its dispatchers with the same formula, from the local account's quota; explicit wins."""
    wide = LocalSettings(max_sessions=200, tps_limit=200, account_new_sessions_per_s=4.0)
    assert wide.experiment_config("http://127.0.0.1:1/v1").dispatch_concurrency == 2  # 3.6/s x 4.4 s: 16 in hand
    fast = LocalSettings(max_sessions=200, tps_limit=200, account_new_sessions_per_s=50.0)
    assert fast.experiment_config("http://127.0.0.1:1/v1").dispatch_concurrency == 8  # 45/s x 4.4 s / 25
    pinned = LocalSettings(max_sessions=200, tps_limit=200, dispatch_concurrency=3)
    assert pinned.experiment_config("http://127.0.0.1:1/v1").dispatch_concurrency == 3
    assert LocalSettings().experiment_config("http://127.0.0.1:1/v1").dispatch_concurrency == 2  # 4 sessions


def test_a_batch_over_one_receive_needs_a_batching_window() -> None:
    """Lambda refuses an SQS event source mapping of more than 10 messages a batch without a batching window."""
    with pytest.raises(ValueError, match="batching window"):
        topology.FunctionSpec("dispatch", timeout_s=60, memory_mb=128, batch_size=25, max_concurrency=2)
    assert topology.FunctionSpec("dispatch", timeout_s=60, memory_mb=128, batch_size=25, batching_window_s=1)
