"""Local mode's queues carry the stack's visibility timeouts (`rollout_pipeline.topology`), not numbers of their own."""

from __future__ import annotations

from rollout_pipeline import topology
from rollout_pipeline.adapters import clients
from rollout_pipeline.local.resources import ExperimentResources


def test_local_queue_visibility_equals_the_topology(resources: ExperimentResources) -> None:
    sqs = clients.client("sqs")
    expected = topology.queue_visibility_timeouts(resources.config)
    assert expected["ingest"] == 6 * topology.FUNCTIONS["ingest"].timeout_s  # 5,400 s, as the stack
    for name, url in resources.queue_urls.items():
        attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout", "RedrivePolicy"])
        assert int(attrs["Attributes"]["VisibilityTimeout"]) == expected[name], name
    assert set(resources.queue_urls) == set(expected)


def test_local_outputs_parse_as_stack_outputs(resources: ExperimentResources) -> None:
    outputs = topology.StackOutputs.from_outputs(resources.stack_outputs())
    assert set(resources.stack_outputs()) == set(topology.StackOutputs.names())
    # The warm queue is the functions' own (the sweeper sends, dispatchers receive): no output the SDK reads.
    assert outputs.handler_settings() == resources.settings().model_copy(update={"warm_queue_url": ""})
    assert resources.settings().warm_queue_url == resources.warm_queue_url
    assert outputs.bus_name == topology.bus_name(resources.config.name)
