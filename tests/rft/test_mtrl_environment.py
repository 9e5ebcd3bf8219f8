"""MTRL environment mode end to end, with the real SageMaker RFT SDK: `python examples/mtrl_environment.py --local
--json` (a stand-in of MTRL built from its contract drives the forwarder of a local pipeline that runs the example
RFT agent, unchanged), and the host's bearer token made as the SDK makes it."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import urllib.parse
from pathlib import Path

from botocore.credentials import Credentials

from rollout_pipeline.agent.job_runtime import bearer_token

REPO = Path(__file__).resolve().parents[2]


def test_the_example_drives_the_forwarder_and_no_failure_is_ever_a_reward() -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "mtrl_environment.py"), "--local", "--json"],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-2000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["rollouts"] == 40
    assert figures["max_in_flight"] == 32, "MTRL's stand-in keeps at most 32 in flight, and reaches it"
    assert figures["duplicate_enqueues"] == 0
    assert figures["not_enqueued"] == 0
    assert figures["answers"] == {"ok": 3 * 40}, "every invocation (first, retry, late retry) answered {}"
    # The two rows failing for infrastructure: MTRL heard `failed`, never a reward.
    assert figures["failures"] == 2
    assert figures["failed_reported_failed"] == 2
    assert figures["zero_rewards_for_failures"] == 0
    assert figures["completed"] == 38
    assert figures["timed_out_at_mtrl"] == 0
    assert figures["pipeline"]["outcomes"] == {"succeeded": 38, "agent_error": 1, "timeout": 1}
    assert figures["pipeline"]["cost_per_rollout_usd"] > 0
    # Every model call reached the job runtime with the host's bearer token; reports came from both senders.
    assert figures["samples"] == figures["samples_with_bearer"] > 0
    assert set(figures["reports_by_auth"]) == {"bearer", "sigv4"}
    assert figures["sessions_left"] == 0


def _query(token: str) -> dict[str, list[str]]:
    url = base64.b64decode(token.removeprefix("sagemaker-api-key-")).decode()
    return urllib.parse.parse_qs(urllib.parse.urlsplit("https://" + url).query)


def test_the_hosts_bearer_token_is_the_sdks() -> None:
    from sagemaker.core.token_generator.token_generator import _generate_token

    credentials = Credentials("AKIDEXAMPLE", "secret", "session")
    ours, sdks = (
        bearer_token("us-west-2", credentials, lifetime_s=3600),
        _generate_token(credentials, "us-west-2", 3600),
    )
    ignored = {"X-Amz-Date", "X-Amz-Signature"}
    assert {k: v for k, v in _query(ours).items() if k not in ignored} == {
        k: v for k, v in _query(sdks).items() if k not in ignored
    }
    assert (
        base64.b64decode(ours[len("sagemaker-api-key-") :]).split(b"?")[0]
        == base64.b64decode(sdks[len("sagemaker-api-key-") :]).split(b"?")[0]
    )
