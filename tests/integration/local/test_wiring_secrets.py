"""The composition root over moto: a function given the attempt key's secret reads it once, on first use."""

from __future__ import annotations

import pytest

from rollout_pipeline import topology
from rollout_pipeline.adapters.clients import ClientFactory
from rollout_pipeline.wiring import Wiring
from tests.unit.contracts.test_wiring import SETTINGS


@pytest.mark.usefixtures("moto_aws")
def test_a_function_given_the_attempt_key_secret_reads_it_once_on_first_use() -> None:
    from rollout_pipeline.adapters.clients import client

    secret_arn = client("secretsmanager").create_secret(Name="attempt-key", SecretString="s" * 64)["ARN"]
    environ = {
        **SETTINGS.to_environ(),
        topology.ATTEMPT_KEY_ENV: secret_arn,
    }
    factory = ClientFactory(region="us-east-1")
    wiring = Wiring.from_environ(environ, clients=factory)
    deps = wiring.lifecycle()
    assert factory._clients == {}, "the key is read on first use, not when the function starts"
    assert deps.attempt_key is not None
    assert deps.attempt_key() == b"s" * 64
    assert deps.attempt_token("wired", "sid") is not None
    without = Wiring.from_environ(SETTINGS.to_environ(), clients=ClientFactory(region="us-east-1"))
    assert without.lifecycle().attempt_key is None  # ingest's environment has no key: it issues no tokens
