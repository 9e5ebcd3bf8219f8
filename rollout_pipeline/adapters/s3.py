"""S3 adapter (ObjectStore)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from rollout_pipeline.adapters.clients import client
from rollout_pipeline.ports import ObjectInfo, ObjectNotFound

#: Error codes S3 answers for a missing key or version (HEAD has no body, so only its status code).
_NOT_FOUND_CODES = frozenset({"404", "NoSuchKey", "NoSuchVersion", "NotFound"})


@contextmanager
def _not_found_as_port_error(bucket: str, key: str, version_id: str | None = None) -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        code = str((getattr(exc, "response", None) or {}).get("Error", {}).get("Code", ""))
        if code in _NOT_FOUND_CODES:
            version = f" (version {version_id})" if version_id else ""
            raise ObjectNotFound(f"s3://{bucket}/{key}{version} does not exist") from exc
        raise


class S3ObjectStore:
    def __init__(self, s3_client: Any | None = None) -> None:
        self._client = s3_client

    @property
    def s3(self) -> Any:
        if self._client is None:
            self._client = client("s3")
        return self._client

    def head(self, bucket: str, key: str, version_id: str | None = None) -> ObjectInfo:
        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if version_id:
            kwargs["VersionId"] = version_id
        with _not_found_as_port_error(bucket, key, version_id):
            resp = self.s3.head_object(**kwargs)
        return ObjectInfo(
            bucket=bucket,
            key=key,
            size=int(resp["ContentLength"]),
            version_id=resp.get("VersionId"),
            etag=str(resp.get("ETag", "")).strip('"') or None,
            metadata=dict(resp.get("Metadata") or {}),
            last_modified=resp.get("LastModified"),
        )

    def iter_bytes(
        self, bucket: str, key: str, version_id: str | None = None, chunk_size: int = 1 << 20
    ) -> Iterator[bytes]:
        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if version_id:
            kwargs["VersionId"] = version_id
        with _not_found_as_port_error(bucket, key, version_id):
            body = self.s3.get_object(**kwargs)["Body"]
        try:
            yield from body.iter_chunks(chunk_size)
        finally:
            body.close()

    def get_bytes(self, bucket: str, key: str, max_bytes: int) -> tuple[bytes, int]:
        with _not_found_as_port_error(bucket, key):
            resp = self.s3.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{max_bytes}")
        body = resp["Body"].read()
        content_range = str(resp.get("ContentRange") or "")
        total = int(content_range.rsplit("/", 1)[-1]) if "/" in content_range else len(body)
        return body, total

    def get_tail(self, bucket: str, key: str, max_bytes: int) -> bytes:
        """A suffix range (`Range: bytes=-N`, RFC 9110; S3 answers all of a smaller non-empty object): the last
        `max_bytes` of an object, e.g. the token at the end of a result too large to read whole."""
        with _not_found_as_port_error(bucket, key):
            resp = self.s3.get_object(Bucket=bucket, Key=key, Range=f"bytes=-{max_bytes}")
        body: bytes = resp["Body"].read(max_bytes)
        return body

    def put_bytes(
        self,
        bucket: str,
        key: str,
        body: bytes,
        content_type: str = "application/json",
        metadata: Mapping[str, str] | None = None,
    ) -> str | None:
        resp = self.s3.put_object(
            Bucket=bucket, Key=key, Body=body, ContentType=content_type, Metadata=dict(metadata or {})
        )
        version: str | None = resp.get("VersionId")
        return version
