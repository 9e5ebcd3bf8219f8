"""Stack-only settings and the one check for model URLs a deployed agent cannot reach (synth and preflight)."""

from __future__ import annotations

import pytest

from rollout_pipeline.config import ConfigError
from rollout_pipeline.ops.deploy_settings import (
    DEFAULT_ARCHIVE_RETENTION_DAYS,
    DeploySettings,
    private_model_url_problem,
)


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("http://127.0.0.1:8000/v1", "loopback"),
        ("http://127.9.9.9/v1", "loopback"),
        ("http://[::1]:8000/v1", "loopback"),
        ("http://localhost:8000/v1", "local host"),
        ("http://LOCALHOST./v1", "local host"),
        ("http://vllm.localhost/v1", "local host"),
        ("http://gpu-box.local:8000/v1", "local host"),
        ("http://ip-10-0-0-1.ec2.internal/v1", "local host"),
        ("http://10.1.2.3/v1", "private"),
        ("http://172.16.0.9/v1", "private"),
        ("http://192.168.1.20:8000/v1", "private"),
        ("http://0.0.0.0:8000/v1", "private"),
        ("http://[fd00::1]/v1", "private"),
        ("http://169.254.169.254/v1", "link-local"),
    ],
)
def test_unreachable_model_urls_are_named(url: str, kind: str) -> None:
    problem = private_model_url_problem(url)
    assert problem is not None
    assert kind in problem


@pytest.mark.parametrize(
    "url",
    [
        "https://api.openai.com/v1",
        "https://models.example.com/v1",
        "http://52.1.2.3:8000/v1",
        "https://[2600:1f18::1]/v1",
    ],
)
def test_public_model_urls_pass(url: str) -> None:
    assert private_model_url_problem(url) is None


def test_check_model_url_refuses_unless_allowed() -> None:
    with pytest.raises(ConfigError, match="allow_private_model_url=true"):
        DeploySettings().check_model_url("http://127.0.0.1:8000/v1")
    DeploySettings(allow_private_model_url=True).check_model_url("http://127.0.0.1:8000/v1")
    DeploySettings().check_model_url("https://models.example.com/v1")


def test_defaults_and_parsing_of_command_line_strings() -> None:
    assert DeploySettings.from_context({}) == DeploySettings()
    settings = DeploySettings.from_context(
        {
            "image_build": "local",
            "alarm_email": " ops@example.com ",
            "allow_private_model_url": "True",
            "event_archive_days": "0",
        }
    )
    assert settings == DeploySettings(
        image_build="local", alarm_email="ops@example.com", allow_private_model_url=True, archive_retention_days=0
    )
    assert settings.image_mode == "local"
    assert DeploySettings().archive_retention_days == DEFAULT_ARCHIVE_RETENTION_DAYS


@pytest.mark.parametrize("days", ["soon", "-1", "3651"])
def test_bad_archive_days(days: str) -> None:
    with pytest.raises(ConfigError, match="event_archive_days"):
        DeploySettings.from_context({"event_archive_days": days})
