"""One Node.js story: `.nvmrc` (the version to install) satisfies `engines.node` in package.json (the minimum the
CDK CLI setup accepts), and docs/deploy.md quotes both as the files say them."""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_nvmrc_satisfies_the_engines_minimum_and_the_docs_quote_both() -> None:
    recommended = int((REPO / ".nvmrc").read_text().strip().lstrip("v").split(".")[0])
    engines = json.loads((REPO / "package.json").read_text())["engines"]["node"]
    found = re.fullmatch(r">=\s*(\d+)(?:\.\d+)*", engines)
    assert found, f"engines.node {engines!r}: a plain minimum (>=N) is what this test and the docs read"
    minimum = int(found.group(1))
    assert recommended >= minimum, f".nvmrc ({recommended}) is below package.json's engines ({engines})"
    deploy = (REPO / "docs" / "deploy.md").read_text()
    assert f"Node.js {recommended} (recommended; `.nvmrc` says {recommended}" in deploy
    assert f"or {minimum} (the minimum, `package.json` `engines`)" in deploy
