"""SageMaker's job runtime, as the RFT host reaches it in MTRL environment mode (`config.MTRL_RUNTIME_ENV`).

An MTRL rollout (its row's `metadata` names the job, `jobArn`, and the trajectory, `rolloutId`: the forwarder
wrote them, `contracts.mtrl`) runs the unchanged RFT agent; the host forwards

- its model calls (`/v1/...`, the job runtime's `Sample`: OpenAI-compatible) to the job runtime, with the job and
  trajectory headers of `sagemaker.train.rft.make_inference_headers` (`X-Amzn-SageMaker-Job-Arn`,
  `X-Amzn-SageMaker-Trajectory-Id`) and a bearer token the host makes from the session's own credentials
  (`bearer_token`): the agent's own token is dropped at the front door and never leaves the session;
- its outcome, once the agent has returned: `CompleteRollout(ready)` + `UpdateReward(rewards)` for a reward,
  `CompleteRollout(failed)` for anything else, never the `UpdateReward([0.0])` the SDK's decorator sends after an
  error (`JobRuntimeClient.report`). Each call carries `config.mtrl_client_token`, shared with the MTRL reporter.

The bearer token is the SDK's (`sagemaker.core.token_generator`, sagemaker-core as sagemaker-train 1.27.0 pins it):
`sagemaker-api-key-` + base64 of a SigV4-presigned `POST https://sagemaker.amazonaws.com/?Action=CallWithBearerToken`
(service `sagemaker`, the region's) + `&Version=1`. The role needs `sagemaker:CallWithBearerToken` and the job
runtime's actions (AWS's managed policy `AmazonSageMakerJobRuntimeAccess` lists them; the stack grants them scoped
to the account in this mode only). Requests follow the service model `sagemakerjobruntime/2026-02-01` (botocore
1.44.5): `POST /complete-rollout {"TrajectoryId", "Status", "ClientToken"}`, `POST /update-reward {"TrajectoryId",
"Rewards", "ClientToken"}`, the job ARN in `X-Amzn-SageMaker-Job-Arn` (and in the body, as the SDK sends it).
"""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from rollout_pipeline.config import mtrl_client_token

logger = logging.getLogger(__name__)

JOB_ARN_HEADER: Final = "X-Amzn-SageMaker-Job-Arn"
TRAJECTORY_HEADER: Final = "X-Amzn-SageMaker-Trajectory-Id"
READY: Final = "ready"
FAILED: Final = "failed"
TOKEN_HOST: Final = "sagemaker.amazonaws.com"
TOKEN_PREFIX: Final = "sagemaker-api-key-"
#: Tokens are made for this long and reused for a third of it (the SDK makes 12-hour ones, per request).
TOKEN_LIFETIME_S: Final = 900
#: Answers meaning "the trajectory is already terminal (or unknown)": final, not retried (the SDK's own markers).
FINAL_STATUSES: Final = frozenset({404, 409})
FINAL_MARKERS: Final = ("not in valid status", "Cannot transition trajectory")
#: Attempts of one call on a throttle, a 5xx or a network error, with a doubling pause from `RETRY_PAUSE_S`.
ATTEMPTS: Final = 3
RETRY_PAUSE_S: Final = 0.5
_ID_RE: Final = re.compile(r"[\w\-.]{1,256}", re.ASCII)
_ARN_RE: Final = re.compile(r"arn:aws[a-z-]*:sagemaker:[a-z0-9-]+:\d{12}:[A-Za-z0-9/_+=.@:-]{1,1024}")


class JobRuntimeError(RuntimeError):
    """A job-runtime call failed for good (the message says how); the MTRL reporter reports again later."""


@dataclass(frozen=True, slots=True)
class MtrlTarget:
    """The MTRL job and trajectory one rollout reports to."""

    job_arn: str
    rollout_id: str


def mtrl_target_of(payload: Mapping[str, Any]) -> MtrlTarget | None:
    """The MTRL job and trajectory named by a rollout's row (`metadata.jobArn`, `metadata.rolloutId`), or None
    for a rollout that is not MTRL's (or names them wrongly)."""
    metadata = payload.get("metadata")
    if not isinstance(metadata, Mapping):
        return None
    job_arn, rollout_id = metadata.get("jobArn"), metadata.get("rolloutId")
    valid_arn = isinstance(job_arn, str) and _ARN_RE.fullmatch(job_arn)
    if valid_arn and isinstance(job_arn, str) and isinstance(rollout_id, str) and _ID_RE.fullmatch(rollout_id):
        return MtrlTarget(job_arn, rollout_id)
    return None


class _Credentials:
    """The session's AWS credentials (botocore's chain, refreshed by botocore), loaded once per process."""

    _lock = threading.Lock()
    _credentials: Any = None

    @classmethod
    def frozen(cls) -> Any:
        with cls._lock:
            if cls._credentials is None:
                from botocore.session import Session

                cls._credentials = Session().get_credentials()
            credentials = cls._credentials
        if credentials is None:
            raise JobRuntimeError("no AWS credentials in the session: the job runtime needs the runtime role's")
        return credentials.get_frozen_credentials() if hasattr(credentials, "get_frozen_credentials") else credentials


def bearer_token(region: str, credentials: Any = None, *, lifetime_s: int = TOKEN_LIFETIME_S) -> str:
    """A job-runtime bearer token made as the SDK's token generator makes it (see the module doc), from
    `credentials` (default: the session's)."""
    from botocore.auth import SigV4QueryAuth
    from botocore.awsrequest import AWSRequest

    frozen = credentials if credentials is not None else _Credentials.frozen()
    request = AWSRequest(
        method="POST",
        url=f"https://{TOKEN_HOST}/",
        headers={"host": TOKEN_HOST},
        params={"Action": "CallWithBearerToken"},
    )
    SigV4QueryAuth(frozen, "sagemaker", region, expires=lifetime_s).add_auth(request)
    presigned = str(request.url).replace("https://", "") + "&Version=1"
    return TOKEN_PREFIX + base64.b64encode(presigned.encode()).decode()


class JobRuntimeClient:
    """The host's calls to one job runtime (`url`, in `region`): bearer-token auth, a few retries, final answers
    for a trajectory already terminal. Thread-safe."""

    def __init__(
        self,
        url: str,
        region: str,
        *,
        token: Callable[[str], str] = bearer_token,
        timeout_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.url = url.rstrip("/")
        self.region = region
        self._token = token
        self._timeout_s = timeout_s
        self._sleep = sleep
        self._lock = threading.Lock()
        self._cached: tuple[str, float] | None = None

    def token(self) -> str:
        """A bearer token, reused for a third of its lifetime."""
        now = time.monotonic()
        with self._lock:
            if self._cached is not None and now - self._cached[1] < TOKEN_LIFETIME_S / 3:
                return self._cached[0]
        made = self._token(self.region)
        with self._lock:
            self._cached = (made, now)
        return made

    def model_headers(self, target: MtrlTarget) -> tuple[str, dict[str, str]]:
        """(bearer token, headers) a forwarded model call carries: `make_inference_headers`' two headers."""
        return self.token(), {JOB_ARN_HEADER: target.job_arn, TRAJECTORY_HEADER: target.rollout_id}

    def report(self, target: MtrlTarget, rewards: Sequence[float] | None) -> dict[str, Any]:
        """Tell MTRL how the rollout ended: `rewards` -> ready, then the rewards; None -> failed, and no reward.
        What was sent and answered, for the result object; never raises (the MTRL reporter reports again)."""
        calls: list[tuple[str, dict[str, Any]]]
        if rewards is None:
            calls = [("complete-failed", {"Status": FAILED})]
        else:
            calls = [("complete-ready", {"Status": READY}), ("reward", {"Rewards": [float(r) for r in rewards]})]
        sent: dict[str, Any] = {"status": FAILED if rewards is None else READY, "rewards": rewards, "answers": {}}
        for call, fields in calls:
            try:
                sent["answers"][call] = self.call(target, call, fields)
            except JobRuntimeError as exc:
                logger.warning("trajectory %s: %s not reported to MTRL: %s", target.rollout_id, call, exc)
                sent["answers"][call] = f"error: {exc}"[:500]
        return sent

    def call(self, target: MtrlTarget, call: str, fields: Mapping[str, Any]) -> str:
        """One job-runtime call (`complete-ready`, `complete-failed`, `reward`): `ok`, or `already terminal`;
        `JobRuntimeError` after the retries."""
        path = "/update-reward" if call == "reward" else "/complete-rollout"
        body = {
            "JobArn": target.job_arn,
            "TrajectoryId": target.rollout_id,
            **fields,
            "ClientToken": mtrl_client_token(target.job_arn, target.rollout_id, call),
        }
        data = json.dumps(body).encode()
        last = ""
        for attempt in range(ATTEMPTS):
            if attempt:
                self._sleep(RETRY_PAUSE_S * 2 ** (attempt - 1))
            headers = {
                "Content-Type": "application/json",
                "Authorization": f"Bearer {self.token()}",
                JOB_ARN_HEADER: target.job_arn,
            }
            request = urllib.request.Request(self.url + path, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self._timeout_s) as response:
                    response.read()
                return "ok"
            except urllib.error.HTTPError as exc:
                text = exc.read().decode("utf-8", "replace")[:500]
                if exc.code in FINAL_STATUSES or any(marker in text for marker in FINAL_MARKERS):
                    return "already terminal"
                last = f"HTTP {exc.code}: {text}"
                if exc.code != 429 and exc.code < 500:
                    break
            except (urllib.error.URLError, OSError) as exc:
                last = f"{type(exc).__name__}: {exc}"
        raise JobRuntimeError(f"{path}: {last}")
