"""boto3 plumbing of the SDK: one session, cached clients, and AWS errors turned into one-line SDK errors."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rollout_pipeline.sdk.errors import AwsError, NoCredentials, SdkError

#: Settings of every client the SDK makes: standard retries, enough connections for the dispatcher thread.
_RETRIES = {"mode": "standard", "max_attempts": 5}
#: Region of local mode when nothing else names one (moto accepts any).
LOCAL_REGION = "us-east-1"


class AwsClients:
    """Lazily created boto3 clients sharing one session, region and (local mode) endpoint URL. Thread-safe."""

    def __init__(self, *, session: Any | None = None, region: str | None = None, endpoint_url: str | None = None):
        self._session = session
        self._region = region
        self.endpoint_url = endpoint_url
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    @property
    def session(self) -> Any:
        if self._session is None:
            import boto3

            self._session = boto3.session.Session(region_name=self._region)
        return self._session

    @property
    def region(self) -> str | None:
        """The region given, else boto3's (`AWS_DEFAULT_REGION`, profile), else `AWS_REGION`, else (local mode
        only) `us-east-1`."""
        if self._region:
            return self._region
        found = self.session.region_name or os.environ.get("AWS_REGION")
        if not found and self.endpoint_url:
            found = LOCAL_REGION
        return str(found) if found else None

    def client(self, service: str) -> Any:
        """The cached client of `service`."""
        with self._lock:
            cached = self._clients.get(service)
            if cached is None:
                from botocore.config import Config

                config = Config(retries=_RETRIES, max_pool_connections=20, user_agent_extra="rollout-pipeline-sdk")
                kwargs: dict[str, Any] = {"config": config}
                region = self.region
                if region:
                    kwargs["region_name"] = region
                if self.endpoint_url:
                    kwargs["endpoint_url"] = self.endpoint_url
                    if is_loopback(self.endpoint_url) and self.session.get_credentials() is None:
                        # Local mode's moto server accepts any credentials; a machine without AWS needs none.
                        kwargs["aws_access_key_id"] = kwargs["aws_secret_access_key"] = "local"
                with aws_errors(f"create {service} client"):
                    cached = self.session.client(service, **kwargs)
                self._clients[service] = cached
            return cached


def is_loopback(url: str) -> bool:
    """True for an endpoint on this machine (local mode), e.g. `http://127.0.0.1:4566`."""
    from urllib.parse import urlparse

    host = (urlparse(url).hostname or "").lower()
    return host == "localhost" or host.startswith("127.") or host == "::1"


def error_code(exc: BaseException) -> str:
    """The AWS error code of a botocore `ClientError` ('' for anything else)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


@contextmanager
def aws_errors(what: str) -> Iterator[None]:
    """Turn botocore errors raised inside into `NoCredentials` / `AwsError` with a one-line message."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        EndpointConnectionError,
        NoCredentialsError,
        NoRegionError,
        PartialCredentialsError,
    )

    try:
        yield
    except SdkError:
        raise
    except (NoCredentialsError, PartialCredentialsError) as exc:
        raise NoCredentials(
            f"no AWS credentials found ({exc}); configure them with `aws configure`, AWS_PROFILE, "
            "environment variables or an instance role"
        ) from None
    except NoRegionError:
        raise SdkError("no AWS region configured: pass --region / region=..., or set AWS_REGION") from None
    except EndpointConnectionError as exc:
        raise AwsError(f"{what}: cannot reach {exc.kwargs.get('endpoint_url', 'the endpoint')}") from None
    except ClientError as exc:
        code = error_code(exc)
        if code in ("ExpiredToken", "ExpiredTokenException", "InvalidClientTokenId", "UnrecognizedClientException"):
            raise NoCredentials(f"AWS credentials rejected ({code}): refresh or reconfigure them") from None
        message = exc.response.get("Error", {}).get("Message", "")
        raise AwsError(f"{what}: {code}: {message}".rstrip(": ")) from None
    except BotoCoreError as exc:
        raise AwsError(f"{what}: {exc}") from None
