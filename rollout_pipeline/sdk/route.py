"""How a process reaches an experiment: its stack outputs in any form a user holds them, the environment variables
every entry point reads, and the ready-to-paste block `rollouts local up` prints for a second process.

The one route to a running local pipeline is its endpoint URL and its experiment name: `rollouts local up`
registers the experiment's outputs as a stack `Rollouts-NAME` in its local AWS, so a second process attaches by name
exactly as it would to a deployed stack (`rollouts ... -e NAME --endpoint-url URL`,
`Experiment.local(URL, name=NAME)`), or reads both from `ROLLOUTS_ENDPOINT_URL` and `ROLLOUTS_EXPERIMENT`.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, TypeAlias
from urllib.parse import urlparse

from rollout_pipeline import topology
from rollout_pipeline.sdk.errors import SdkError

#: The endpoint of a local pipeline (every AWS call of the CLI and the SDK goes there when it is set).
ENDPOINT_ENV: Final = "ROLLOUTS_ENDPOINT_URL"
#: The experiment every command and `Experiment.local()` attach to when no name is given.
EXPERIMENT_ENV: Final = "ROLLOUTS_EXPERIMENT"

#: Stack outputs as a user may hold them: a dict (flat `{output: value}` or `cdk deploy --outputs-file`'s
#: `{stack: {output: value}}`), that file's path, or its JSON text.
OutputsSource: TypeAlias = Mapping[str, Any] | str | os.PathLike[str]


def endpoint_from_env(endpoint_url: str | None) -> str | None:
    """`endpoint_url` if given, else `$ROLLOUTS_ENDPOINT_URL` (None when neither is set)."""
    return endpoint_url or os.environ.get(ENDPOINT_ENV) or None


def experiment_from_env(name: str | None) -> str | None:
    """`name` if given, else `$ROLLOUTS_EXPERIMENT` (None when neither is set)."""
    return name or os.environ.get(EXPERIMENT_ENV) or None


def check_endpoint_url(endpoint_url: str | None) -> None:
    """`SdkError` for an endpoint URL boto3 cannot use (no `http://` or `https://`, no host)."""
    if endpoint_url is None:
        return
    parsed = urlparse(endpoint_url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        hint = f": did you mean http://{endpoint_url}?" if "://" not in endpoint_url else ""
        raise SdkError(f"endpoint URL {endpoint_url!r} must start with http:// or https:// and name a host{hint}")


def stack_outputs(source: OutputsSource, name: str | None = None) -> dict[str, str]:
    """The flat `{output: value}` outputs of one experiment from any `OutputsSource`.

    A `{stack: {outputs}}` mapping (what `cdk deploy --outputs-file` and `rollouts local up --write-outputs` write)
    gives the stack of experiment `name`, or its only stack. A string is JSON text when it starts with `{`, else a
    path. `SdkError` (one line) when it cannot be read or holds no single experiment's outputs."""
    where = "the outputs"
    data: Any = source
    if isinstance(source, os.PathLike) or (isinstance(source, str) and not source.lstrip().startswith("{")):
        where = str(source)
        try:
            data = json.loads(Path(source).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise SdkError(f"cannot read outputs file {source}: {exc}") from None
    elif isinstance(source, str):
        try:
            data = json.loads(source)
        except json.JSONDecodeError as exc:
            raise SdkError(f"the outputs are not valid JSON: {exc}") from None
    if not isinstance(data, Mapping):
        raise SdkError(f"{where} is not a JSON object of stack outputs")
    if not any(key in data for key in topology.StackOutputs.required()):  # cdk's {stack: {outputs}} form
        stacks = {str(k): v for k, v in data.items() if isinstance(v, Mapping)}
        wanted = topology.stack_name(name) if name else None
        if wanted and wanted in stacks:
            data = stacks[wanted]
        elif len(stacks) == 1 and not wanted:
            data = next(iter(stacks.values()))
        elif wanted:
            found = ", ".join(stacks) or "none"
            raise SdkError(f"{where} holds no stack {wanted} (stacks: {found})")
        elif stacks:
            raise SdkError(f"{where} holds several stacks ({', '.join(stacks)}): name the experiment")
    return {str(k): str(v) for k, v in data.items() if not isinstance(v, Mapping)}


def read_outputs_file(path: str | os.PathLike[str], name: str | None = None) -> dict[str, str]:
    """Stack outputs from a JSON file (`stack_outputs` of a path)."""
    return stack_outputs(Path(path), name)


def local_up_block(endpoint_url: str, name: str) -> str:
    """What `rollouts local up` prints for a second process: the environment, a CLI line, a Python line."""
    endpoint, experiment = shlex.quote(endpoint_url), shlex.quote(name)
    return "\n".join(
        [
            "Drive it from another shell (paste):",
            f"  export {ENDPOINT_ENV}={endpoint} {EXPERIMENT_ENV}={experiment}",
            "  rollouts submit my_rows.jsonl --watch        # any .jsonl of rows; or status/watch/cancel/export",
            "or from Python:",
            "  from rollout_pipeline.sdk import Experiment",
            f"  exp = Experiment.local({json.dumps(endpoint_url)}, name={json.dumps(name)})",
        ]
    )
