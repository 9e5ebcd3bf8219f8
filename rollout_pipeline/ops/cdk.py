"""The project's CDK app driven from Python: the CDK CLI that `make setup` installs, run as a subprocess.

Nothing here calls CloudFormation's write APIs: `cdk deploy`, `cdk diff` and `cdk destroy` do the work, this module
builds their command lines (`-c experiment=NAME -c key=value ...`), runs them with the CLI's telemetry and notices
off, keeps their output in a log file, and reads the stack's events (DescribeStackEvents, read only) to show
progress and to name the first resource that failed.

CLI reference: https://docs.aws.amazon.com/cdk/v2/guide/ref-cli-cmd.html (`deploy --outputs-file`,
`--require-approval never`, `diff --fail`, `destroy --force`, `--no-notices`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO, Any, Final

from rollout_pipeline import topology
from rollout_pipeline.sdk._aws import aws_errors
from rollout_pipeline.sdk.errors import AwsError, DeployFailed, SdkError

#: Where `make setup` (npm ci) installs the CDK CLI, relative to the project (the directory holding cdk.json).
CDK_BIN: Final = Path("node_modules/.bin/cdk")
#: Packages the CDK app (app.py, stacks/) imports that only `make setup` installs (pyproject's `cdk` extra).
CDK_APP_PACKAGES: Final = ("aws_cdk", "constructs", "cdk_nag", "cdklabs")
#: The custom resource that builds the agent image in CodeBuild during the deploy (`stacks/image.py`).
IMAGE_BUILD_TYPE: Final = "Custom::CDKContainerImageBuild"
#: Stack states a deploy cannot start from: the stack must be deleted first (CloudFormation's own rule for
#: ROLLBACK_COMPLETE; the *_FAILED ones leave resources in an unknown state).
FAILED_STATES: Final = frozenset(
    {"CREATE_FAILED", "ROLLBACK_COMPLETE", "ROLLBACK_FAILED", "DELETE_FAILED", "UPDATE_ROLLBACK_FAILED"}
)
#: Failed creates: `cdk deploy` deletes such a stack and creates it again (what the failed create made is deleted
#: with it: RetainExceptOnCreate), as the CDK CLI's own `isCreationFailure` does.
CREATION_FAILURES: Final = frozenset({"ROLLBACK_COMPLETE", "ROLLBACK_FAILED"})
#: Reasons CloudFormation gives to resources it gave up on because another one failed (never the cause).
_KNOCK_ON_REASONS: Final = ("Resource creation cancelled", "Resource update cancelled", "The following resource(s)")

Runner = Callable[[Sequence[str], Mapping[str, str], Path, Callable[[str], None]], int]


def find_project(start: Path | None = None) -> Path:
    """The directory of the project's CDK app: the first one holding cdk.json and app.py, from `start` (default: the
    working directory) upwards, else the checkout this library is installed from."""
    candidates = [start or Path.cwd()]
    candidates.append(Path(__file__).resolve().parents[2])
    for base in candidates:
        for directory in (base, *base.resolve().parents):
            if (directory / "cdk.json").is_file() and (directory / "app.py").is_file():
                return directory
    raise SdkError(
        "no CDK app found (cdk.json and app.py): run from the rollout-pipeline checkout or pass project_dir=..."
    )


def context_value(value: Any) -> str:
    """A setting as `-c key=value` text (the stack's `ExperimentConfig.from_context` parses it back)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return json.dumps(dict(value), separators=(",", ":"), sort_keys=True)
    if hasattr(value, "model_dump"):
        return json.dumps(value.model_dump(exclude_none=True), separators=(",", ":"), sort_keys=True)
    if isinstance(value, list | tuple):  # `sinks`: a JSON list, of settings models or plain objects
        items = [item.model_dump(exclude_none=True) if hasattr(item, "model_dump") else item for item in value]
        return json.dumps(items, separators=(",", ":"), sort_keys=True)
    return str(value)


def subprocess_runner(argv: Sequence[str], env: Mapping[str, str], cwd: Path, on_line: Callable[[str], None]) -> int:
    """Run the CLI, hand each output line (stdout and stderr merged) to `on_line`, return its exit status."""
    with subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        encoding="utf-8",
        errors="replace",
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            on_line(line.rstrip("\n"))
        return process.wait()


@dataclass
class CliRun:
    """One finished CLI run: its exit status, the log file of its output and the last lines of it."""

    argv: list[str]
    returncode: int
    log_path: Path
    tail: list[str] = field(default_factory=list)

    def last_error(self) -> str:
        """The CLI's own last error line (what it printed last that looks like one), else its last line; a CDK app
        that cannot import its own packages gets the command that installs them (`make demo` installs none)."""
        error = next((line.strip() for line in reversed(self.tail) if line.strip()), "no output")
        for line in reversed(self.tail):
            text = line.strip()
            if text.startswith(("error:", "Error:", "❌")) or "Error" in text.split(":")[0]:
                error = text.lstrip("❌ ").strip()
                break
        if any(f"No module named '{package}" in error for package in CDK_APP_PACKAGES):
            error += " (the CDK app's packages are missing: `make demo` installs the demo's only; run `make setup`)"
        return error


class CdkCli:
    """The CDK CLI of one project directory. `runner` runs a command line (default: a subprocess); tests inject one
    or put a stand-in `node_modules/.bin/cdk` in a project directory of their own."""

    def __init__(
        self,
        project_dir: Path,
        *,
        runner: Runner | None = None,
        log_dir: Path | None = None,
        output_dir: Path | None = None,
    ) -> None:
        self.project_dir = project_dir
        self.executable = project_dir / CDK_BIN
        self.runner = runner or subprocess_runner
        #: Where the CLI writes the cloud assembly (`--output`; default: the project's cdk.out).
        self.output_dir = output_dir
        self.log_dir = log_dir or self.assembly_dir / "rollouts-logs"
        #: Variables the CLI runs with on top of this process's (the region and credentials the SDK uses).
        self.env_overrides: dict[str, str] = {}
        self._checked = False

    @property
    def assembly_dir(self) -> Path:
        return self.output_dir or self.project_dir / "cdk.out"

    def template(self, experiment: str) -> Path:
        """The synthesized template of the experiment's stack."""
        return self.assembly_dir / f"{topology.stack_name(experiment)}.template.json"

    def check_installed(self) -> None:
        """The CLI, the Node.js it runs on and a Python that can run the CDK app are all here; else one `SdkError`
        naming what is missing (checked up front: otherwise the run fails later with `env: 'node'` or a traceback
        of `import aws_cdk` inside `cdk diff`). Checked once per `CdkCli`."""
        if self._checked:
            return
        if not os.access(self.executable, os.X_OK):
            raise SdkError(f"the CDK CLI is not installed ({self.executable} is missing): run `make setup` first")
        path = self.environment().get("PATH", "")
        if shutil.which("node", path=path) is None:
            raise SdkError(
                "Node.js is not on PATH (the CDK CLI runs on it): install the version in "
                f"{self.project_dir / '.nvmrc'} (at least what `engines` in package.json allows), or put its bin "
                "directory on PATH, then try again"
            )
        python = self.app_python()
        missing = list(CDK_APP_PACKAGES) if python is None else _missing_modules(python, CDK_APP_PACKAGES)
        if missing:
            where = python or "python3 (not found on PATH)"
            raise SdkError(
                f"the CDK app's Python ({where}) cannot import {', '.join(missing)}: run `make setup` in "
                f"{self.project_dir}, or pip install -e '.[cdk]' into the Python that runs it"
            )
        self._checked = True

    def app_python(self) -> str | None:
        """The interpreter cdk.json's `app` command runs app.py with: the project's `.venv/bin/python` unless a
        virtual environment is active (`VIRTUAL_ENV`), else `python3` on PATH (`tests/unit/ops/test_launch.py` checks
        that cdk.json still says so)."""
        env = self.environment()
        project_venv = self.project_dir / ".venv" / "bin" / "python"
        if not env.get("VIRTUAL_ENV") and os.access(project_venv, os.X_OK):
            return str(project_venv)
        return shutil.which("python3", path=env.get("PATH", ""))

    def command(self, verb: str, experiment: str, context: Mapping[str, Any], *options: str) -> list[str]:
        """`cdk VERB STACK -c experiment=NAME -c key=value ... --no-notices OPTIONS` (settings in a stable order)."""
        argv = [str(self.executable), verb, topology.stack_name(experiment), "-c", f"experiment={experiment}"]
        for key in sorted(context):
            if key != "experiment":
                argv += ["-c", f"{key}={context_value(context[key])}"]
        if self.output_dir is not None:
            argv += ["--output", str(self.output_dir)]
        return [*argv, "--no-notices", *options]

    def pool_command(self, verb: str, context: Mapping[str, Any], *options: str) -> list[str]:
        """`cdk VERB RolloutsPool -c rollouts_pool=true -c key=value ... --no-notices OPTIONS`: the account pool's
        stack (`rollouts bootstrap`)."""
        argv = [str(self.executable), verb, topology.POOL_STACK_NAME, "-c", "rollouts_pool=true"]
        for key in sorted(context):
            argv += ["-c", f"{key}={context_value(context[key])}"]
        if self.output_dir is not None:
            argv += ["--output", str(self.output_dir)]
        return [*argv, "--no-notices", *options]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env["CDK_DISABLE_CLI_TELEMETRY"] = "1"
        env.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
        env.setdefault("CI", "true")  # no interactive prompts or colour codes from the CLI: this module asks
        env.update(self.env_overrides)
        return env

    def run(self, argv: Sequence[str], *, echo: Callable[[str], None] | None = None, keep: int = 40) -> CliRun:
        """Run a command line from `command`; its whole output goes to a log file, `echo` sees each line."""
        self.check_installed()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{argv[1]}-{argv[2]}.log"
        tail: list[str] = []
        with log_path.open("w", encoding="utf-8") as log:

            def on_line(line: str) -> None:
                log.write(line + "\n")
                tail.append(line)
                del tail[:-keep]
                if echo is not None:
                    echo(line)

            try:
                code = self.runner(argv, self.environment(), self.project_dir, on_line)
            except OSError as exc:
                raise SdkError(f"cannot run the CDK CLI ({exc}): run `make setup` first") from None
        return CliRun(list(argv), code, log_path, tail)


def _missing_modules(python: str, modules: Sequence[str]) -> list[str]:
    """The `modules` that `python` does not find (their specs only: nothing is imported, so it takes milliseconds);
    all of them when it cannot be run."""
    probe = (
        "import importlib.util, json, sys; "
        "print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]))"
    )
    try:
        run = subprocess.run([python, "-c", probe, *modules], capture_output=True, text=True, timeout=30, check=False)
        found: list[str] = json.loads(run.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return list(modules)
    return found


# ------------------------------------------------------------------------------------------------- stack reads


def stack_status(cloudformation: Any, experiment: str) -> str | None:
    """The stack's status (`CREATE_COMPLETE`, ...), or None when it does not exist."""
    stack = topology.stack_name(experiment)
    try:
        with aws_errors(f"describe stack {stack}"):
            stacks = cloudformation.describe_stacks(StackName=stack).get("Stacks") or []
    except AwsError as exc:
        if "does not exist" in str(exc):
            return None
        raise
    return str(stacks[0]["StackStatus"]) if stacks else None


def stack_outputs(cloudformation: Any, experiment: str) -> dict[str, str]:
    """The stack's outputs (`{key: value}`); empty when it has none."""
    stack = topology.stack_name(experiment)
    with aws_errors(f"describe stack {stack}"):
        stacks = cloudformation.describe_stacks(StackName=stack).get("Stacks") or []
    return {o["OutputKey"]: o["OutputValue"] for o in (stacks[0].get("Outputs") or [])} if stacks else {}


def events_since(
    cloudformation: Any,
    experiment: str,
    since: datetime,
    *,
    known: Collection[str] = frozenset(),
    max_pages: int = 10,
) -> list[dict[str, Any]]:
    """The stack's events at or after `since` and newer than any event id in `known`, oldest first
    (DescribeStackEvents pages newest first: paging stops at the first old or known event; bounded)."""
    stack = topology.stack_name(experiment)
    found: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"StackName": stack}
    for _ in range(max_pages):
        try:
            with aws_errors(f"read the events of stack {stack}"):
                page = cloudformation.describe_stack_events(**kwargs)
        except AwsError as exc:
            if "does not exist" in str(exc):
                return []
            raise
        older = False
        for event in page.get("StackEvents") or []:
            if event["Timestamp"] < since or event.get("EventId") in known:
                older = True
                break
            found.append(event)
        token = page.get("NextToken")
        if older or not token:
            break
        kwargs["NextToken"] = token
    return list(reversed(found))


def first_failure(events: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The event of the first resource that failed (the cause), skipping the stack's own event and the resources
    CloudFormation cancelled because of it."""
    failed = [e for e in events if str(e.get("ResourceStatus", "")).endswith("_FAILED")]
    for event in failed:
        reason = str(event.get("ResourceStatusReason", ""))
        if event.get("ResourceType") != "AWS::CloudFormation::Stack" and not reason.startswith(_KNOCK_ON_REASONS):
            return event
    return next(iter(failed), None)


def failure_error(experiment: str, events: Iterable[Mapping[str, Any]], run: CliRun) -> DeployFailed:
    """One clear error for a failed CLI run: the first failed resource and its reason, else the CLI's last error."""
    event = first_failure(events)
    where = f" (full CLI output: {run.log_path})"
    if event is None:
        return DeployFailed(f"{run.argv[1]} of {topology.stack_name(experiment)} failed: {run.last_error()}{where}")
    resource = str(event.get("LogicalResourceId", "?"))
    kind = str(event.get("ResourceType", "?"))
    status = str(event.get("ResourceStatus", "?"))
    reason = " ".join(str(event.get("ResourceStatusReason", "no reason given")).split())
    return DeployFailed(
        f"{run.argv[1]} of {topology.stack_name(experiment)} failed at {resource} ({kind}) {status}: {reason}{where}",
        resource=resource,
        resource_type=kind,
        reason=reason,
    )


# ------------------------------------------------------------------------------------------------- progress


@dataclass(frozen=True)
class StackProgress:
    """Where a deploy stands: resources finished out of the template's, what is under way, the image build."""

    done: int
    total: int | None
    current: str = ""
    image_build: str | None = None
    failed: int = 0

    def line(self) -> str:
        total = "?" if self.total is None else str(self.total)
        parts = [f"{self.done}/{total} resources"]
        if self.failed:
            parts.append(f"{self.failed} failed")
        if self.image_build:
            parts.append(f"image build {self.image_build}")
        if self.current:
            parts.append(self.current)
        return ", ".join(parts)


def progress_of(events: Iterable[Mapping[str, Any]], total: int | None) -> StackProgress:
    """Progress from the events of one operation (oldest first): the resources that reached a *_COMPLETE state."""
    latest: dict[str, Mapping[str, Any]] = {}
    for event in events:
        if event.get("ResourceType") == "AWS::CloudFormation::Stack":
            continue
        latest[str(event.get("LogicalResourceId"))] = event
    done = sum(1 for e in latest.values() if str(e.get("ResourceStatus", "")).endswith("_COMPLETE"))
    failed = sum(1 for e in latest.values() if str(e.get("ResourceStatus", "")).endswith("_FAILED"))
    running = [k for k, e in latest.items() if str(e.get("ResourceStatus", "")).endswith("_IN_PROGRESS")]
    image = next(
        (
            str(e.get("ResourceStatus", "")).replace("_", " ").lower()
            for e in latest.values()
            if e.get("ResourceType") == IMAGE_BUILD_TYPE
        ),
        None,
    )
    current = f"in progress: {', '.join(running[:3])}{' ...' if len(running) > 3 else ''}" if running else ""
    return StackProgress(done, total, current, image, failed)


def template_resources(template: Path) -> int | None:
    """Resources in the synthesized template, the progress bar's total; None before synth wrote it."""
    try:
        resources = json.loads(template.read_text(encoding="utf-8")).get("Resources") or {}
    except (OSError, ValueError):
        return None
    return sum(1 for r in resources.values() if r.get("Type") != "AWS::CDK::Metadata")


class StackWatcher:
    """Polls the stack's events while the CLI runs (a daemon thread, stopped by `stop`) and reports progress."""

    def __init__(
        self,
        cloudformation: Any,
        experiment: str,
        since: datetime,
        report: Callable[[StackProgress], None],
        *,
        total: Callable[[], int | None] = lambda: None,
        interval_s: float = 3.0,
    ) -> None:
        self.cloudformation = cloudformation
        self.experiment = experiment
        self.since = since
        self.report = report
        self.total = total
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"stack-events-{experiment}", daemon=True)
        self.last: StackProgress | None = None
        self._events: list[dict[str, Any]] = []
        self._ids: set[str] = set()

    def __enter__(self) -> StackWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval_s + 30)

    def poll(self) -> None:
        """Read the events new since the last poll and report the progress if it moved."""
        new = events_since(self.cloudformation, self.experiment, self.since, known=self._ids)
        self._events.extend(new)
        self._ids.update(str(e.get("EventId")) for e in new)
        progress = progress_of(self._events, self.total())
        if progress != self.last:
            self.last = progress
            self.report(progress)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll()
            except SdkError:
                continue  # progress is best effort; the CLI's exit status decides


class LiveLine:
    """Shows progress as one line rewritten in place on a terminal, or a line per change otherwise."""

    def __init__(self, stream: IO[str], label: str) -> None:
        self.stream = stream
        self.label = label
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self._width = 0

    def __call__(self, progress: StackProgress) -> None:
        text = f"{self.label}: {progress.line()}"
        if self.tty:
            pad = max(0, self._width - len(text))
            self.stream.write("\r" + text + " " * pad)
            self._width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def end(self, message: str) -> None:
        if self.tty and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
        self.stream.write(f"{self.label}: {message}\n")
        self.stream.flush()


def operation_start(skew_s: float = 5.0) -> datetime:
    """When this operation's events begin (a little before now: the local clock may run ahead of AWS's)."""
    from rollout_pipeline.contracts import utcnow

    return utcnow() - timedelta(seconds=skew_s)
