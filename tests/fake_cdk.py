"""A stand-in CDK CLI for tests: a project directory whose `node_modules/.bin/cdk` is a small Python script.

The script records each invocation (argv, the telemetry variable, the region and credential variables) as a JSON
line in `calls.jsonl`, prints the lines `script.json` gives for its verb, writes the outputs file
`cdk deploy --outputs-file` asks for (and an empty template on synth), and exits with the status given for the
verb. Nothing reaches AWS.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

_SCRIPT = """#!{python}
import json, os, sys
from pathlib import Path

here = Path(__file__).resolve().parents[2]
argv = sys.argv[1:]
with (here / "calls.jsonl").open("a") as calls:
    env = {{key: os.environ.get(key) for key in ("AWS_REGION", "AWS_PROFILE", "AWS_ACCESS_KEY_ID")}}
    seen = {{"argv": argv, "telemetry": os.environ.get("CDK_DISABLE_CLI_TELEMETRY"), "env": env}}
    calls.write(json.dumps(seen) + "\\n")
plan = json.loads((here / "script.json").read_text()).get(argv[0], {{}})
for line in plan.get("lines", []):
    print(line, flush=True)
if "--outputs-file" in argv and plan.get("outputs") is not None:
    Path(argv[argv.index("--outputs-file") + 1]).write_text(json.dumps(plan["outputs"]))
if argv[0] == "synth" and plan.get("exit", 0) == 0:
    out = Path(argv[argv.index("--output") + 1]) if "--output" in argv else here / "cdk.out"
    out.mkdir(parents=True, exist_ok=True)
    (out / (argv[1] + ".template.json")).write_text(json.dumps({{"Resources": {{}}}}))
sys.exit(plan.get("exit", 0))
"""


class FakeCdkProject:
    """A project directory with the real cdk.json and app.py and a fake CLI (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "cdk.json", root / "cdk.json")
        (root / "app.py").write_text("raise SystemExit('the fake CLI never runs the app')\n")
        cli = root / "node_modules" / ".bin" / "cdk"
        cli.parent.mkdir(parents=True)
        cli.write_text(_SCRIPT.format(python=sys.executable))
        cli.chmod(0o755)
        # The project's Python, as `make setup` makes it: this interpreter (which has aws_cdk).
        python = root / ".venv" / "bin" / "python"
        python.parent.mkdir(parents=True)
        python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        python.chmod(0o755)
        self.script({})

    def script(self, plan: dict[str, dict[str, Any]]) -> None:
        """What each verb does: `{"deploy": {"exit": 0, "lines": [...], "outputs": {...}}, "diff": {...}}`."""
        (self.root / "script.json").write_text(json.dumps(plan))

    def calls(self) -> list[dict[str, Any]]:
        path = self.root / "calls.jsonl"
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def verbs(self) -> list[str]:
        return [call["argv"][0] for call in self.calls()]
