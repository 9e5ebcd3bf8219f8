"""s3:// URIs (claim checks, result URIs) parse one way everywhere."""

from __future__ import annotations

import pytest

from rollout_pipeline import ids


def test_parses_bucket_and_key_with_slashes() -> None:
    assert ids.parse_s3_uri("s3://bucket/exp/q1/s.json") == ("bucket", "exp/q1/s.json")


@pytest.mark.parametrize("uri", ["https://x/y", "s3://bucket", "s3://bucket/", "s3:///key", "bucket/key", ""])
def test_rejects_anything_else(uri: str) -> None:
    with pytest.raises(ids.InvalidId, match="not an s3:// URI"):
        ids.parse_s3_uri(uri)
