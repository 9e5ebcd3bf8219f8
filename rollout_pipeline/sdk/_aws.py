"""boto3 plumbing of the SDK: the library's client factory, and AWS errors turned into one-line SDK errors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rollout_pipeline.adapters import clients
from rollout_pipeline.sdk.errors import AwsError, NoCredentials, SdkError
from rollout_pipeline.sdk.route import check_endpoint_url

#: Region of local mode when nothing else names one (moto accepts any).
LOCAL_REGION = clients.LOCAL_REGION
is_loopback = clients.is_loopback


class AwsClients(clients.ClientFactory):
    """The SDK's client factory: the library's one (`adapters.clients.ClientFactory`), its requests tagged
    `rollout-pipeline-sdk` and botocore errors at client creation turned into one-line SDK errors."""

    def __init__(self, *, session: Any | None = None, region: str | None = None, endpoint_url: str | None = None):
        check_endpoint_url(endpoint_url)
        super().__init__(
            session=session,
            region=region,
            endpoint_url=endpoint_url,
            user_agent_extra="rollout-pipeline-sdk",
            max_pool_connections=20,
        )

    def _create(self, service: str) -> Any:
        with aws_errors(f"create {service} client"):
            return super()._create(service)


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
        url = str(exc.kwargs.get("endpoint_url", "the endpoint"))
        hint = " (is `rollouts local up` still running there?)" if is_loopback(url) else ""
        raise AwsError(f"{what}: cannot reach {url}{hint}") from None
    except ClientError as exc:
        code = error_code(exc)
        if code in ("ExpiredToken", "ExpiredTokenException", "InvalidClientTokenId", "UnrecognizedClientException"):
            raise NoCredentials(f"AWS credentials rejected ({code}): refresh or reconfigure them") from None
        message = exc.response.get("Error", {}).get("Message", "")
        raise AwsError(f"{what}: {code}: {message}".rstrip(": ")) from None
    except BotoCoreError as exc:
        raise AwsError(f"{what}: {exc}") from None
