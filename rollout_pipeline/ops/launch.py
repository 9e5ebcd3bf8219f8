"""Create, update and tear down an experiment from Python: `Experiment.launch`, `destroy`.

Deployed mode drives the project's CDK app through the CDK CLI (`ops/cdk.py`): settings are validated by the same
code as `cdk synth` before anything runs, then the preflight (read calls only), then `cdk diff` against the stack
that is there (same settings and code: nothing to do; other ones: the diff is shown and confirmed), then
`cdk deploy` with its progress read from the stack's events, and the attached `Experiment` from the outputs file.

Local mode is provided by a launcher registered under the entry-point group `rollout_pipeline.launchers` (name
`local`, shipped by this package: `rollout_pipeline.local.launch`), so operator code never imports local mode itself.
`Experiment.launch/destroy` reach this module through `rollout_pipeline.sdk.operations`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final, Protocol

from rollout_pipeline import ids, quotas, topology
from rollout_pipeline.config import ConfigError, ExperimentConfig
from rollout_pipeline.ops import cdk, preflight, subscriptions, upgrade
from rollout_pipeline.ops.deploy_settings import STACK_KEYS, DeploySettings
from rollout_pipeline.quotas import AccountQuotas
from rollout_pipeline.sdk._aws import AwsClients, aws_errors
from rollout_pipeline.sdk.errors import NoCredentials, SdkError
from rollout_pipeline.sdk.experiment import Experiment, read_outputs_file
from rollout_pipeline.sdk.operations import LaunchOptions

logger = logging.getLogger(__name__)

#: Every setting `deploy` accepts: the experiment's (`ExperimentConfig`, but its name) and the stack's own.
SETTING_KEYS: Final = (*(f for f in ExperimentConfig.model_fields if f != "name"), *STACK_KEYS)
#: The entry-point group of launchers (`mode` -> a `Launcher`).
LAUNCHERS_GROUP: Final = "rollout_pipeline.launchers"
MODES: Final = ("deployed", "local")
_DIFF_COUNT: Final = re.compile(r"stacks with differences:\s*(\d+)")

Confirm = Callable[[str], bool]
#: What an update of a live stack must pass first (`ops.upgrade.check_update`): the attached experiment, the names
#: of the settings that change, whether forced, where to say warnings.
UpdateGuard = Callable[["Experiment", Collection[str], bool, Callable[[str], None]], None]
#: botocore's credential `method`s of keys given in code (`boto3.Session(aws_access_key_id=...)`): the CLI cannot
#: find them itself.
KEYS_IN_CODE: Final = frozenset({"explicit"})
#: Sources the CLI finds on its own like this process did (environment, instance and container roles): nothing to pass.
RESOLVED_BY_THE_CLI: Final = frozenset({"env", "iam-role", "container-role"})


class Launcher(Protocol):
    """Starts an experiment in a mode other than deployed; the `Experiment` it returns stops it on `destroy()`."""

    def __call__(self, config: ExperimentConfig, given: frozenset[str], options: Mapping[str, Any]) -> Experiment:
        """Start experiment `config` (`given`: the settings the caller set; the rest are the mode's defaults);
        `options`: the mode's own (local mode: `LocalSettings` fields such as `agent_module`, `work_dir`)."""
        ...


#: Launchers registered in this process (tests, or a mode of the user's own); entry points are looked up otherwise.
LAUNCHERS: dict[str, Launcher] = {}


def launcher(mode: str) -> Launcher:
    """The launcher of `mode` (registered here, else from the `rollout_pipeline.launchers` entry points)."""
    if mode in LAUNCHERS:
        return LAUNCHERS[mode]
    from importlib.metadata import entry_points

    for entry in entry_points(group=LAUNCHERS_GROUP):
        if entry.name == mode:
            found: Launcher = entry.load()
            return found
    raise SdkError(
        f"no launcher for mode {mode!r}: install the package with its `local` extra (pip install -e '.[local]')"
    )


def launch(name: str, mode: str, settings: Mapping[str, Any], options: LaunchOptions) -> Experiment:
    """`Experiment.launch`: deployed mode through `Deployment`, other modes through their launcher."""
    if mode not in MODES:
        raise SdkError(f"mode must be one of {', '.join(MODES)} (got {mode!r})")
    if mode == "local":
        config = plan(name, settings, None, check_model_url=False).config
        return launcher("local")(config, frozenset(settings), dict(options.local_options or {}))
    deployment = Deployment(
        name,
        settings,
        project_dir=options.project_dir,
        region=options.region,
        session=options.session,
        out=options.out or sys.stderr,
    )
    return deployment.deploy(yes=options.yes, force=options.force)


# --------------------------------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Plan:
    """Validated settings of one experiment: what `-c` carries, and what the stack will be built with."""

    name: str
    #: The settings given, as `-c key=value` text.
    context: dict[str, str]
    #: cdk.json's context overridden by them: what synth and the preflight read.
    merged: dict[str, Any]
    config: ExperimentConfig
    deploy: DeploySettings


def plan(name: str, settings: Mapping[str, Any], project_dir: Path | None, *, check_model_url: bool = True) -> Plan:
    """Validate `settings` as `cdk synth` will (cdk.json's context, overridden by them); `SdkError` naming the
    setting and what to do. Nothing runs before this passes."""
    try:
        ids.validate_exp_id(name)
    except ids.InvalidId as exc:
        raise SdkError(f"invalid experiment name: {exc}") from None
    unknown = sorted(set(settings) - set(SETTING_KEYS))
    if unknown:
        raise SdkError(
            f"unknown setting(s) {', '.join(unknown)}: settings are {', '.join(SETTING_KEYS)} "
            f"(and Experiment.launch's options {', '.join(LaunchOptions.names())})"
        )
    context = {key: cdk.context_value(value) for key, value in settings.items()}
    merged = preflight.load_context(project_dir, {"experiment": name, **context}) if project_dir else context
    merged = {**merged, "experiment": name}
    try:
        config = ExperimentConfig.from_context(merged)
        deploy = DeploySettings.from_context(merged)
        if check_model_url:
            deploy.check_model_url(config.model_base_url)
    except ConfigError as exc:
        raise SdkError(f"{exc} (fix the setting and deploy again)") from None
    return Plan(name, context, merged, config, deploy)


def setting_changes(deployed: Mapping[str, str], config: ExperimentConfig) -> dict[str, tuple[Any, Any]]:
    """`{key: (old, new)}` for each experiment setting the deployed stack (its `ExperimentConfig` output) holds
    differently from `config`."""
    raw = deployed.get("ExperimentConfig")
    if not raw:
        return {}
    try:
        before = ExperimentConfig.from_env(raw).model_dump(mode="json")
    except ValueError:
        return {}
    after = config.model_dump(mode="json")
    return {key: (before.get(key), after.get(key)) for key in after if before.get(key) != after.get(key)}


def changed_settings(deployed: Mapping[str, str], config: ExperimentConfig) -> list[str]:
    """`key: old -> new` for each experiment setting that changes (`setting_changes`)."""
    return [f"{key}: {old!r} -> {new!r}" for key, (old, new) in setting_changes(deployed, config).items()]


def ask(question: str, *, stream: IO[str] = sys.stderr) -> bool:
    """Ask on the terminal or in a notebook (y/N); neither: refuse and say how to go on without asking."""
    interactive = sys.stdin is not None and (sys.stdin.isatty() or "ipykernel" in sys.modules)
    if not interactive:
        raise SdkError(f"{question.rstrip('?')}: needs confirmation and there is no terminal: pass yes=True (--yes)")
    stream.write(f"{question} [y/N] ")
    stream.flush()
    return input().strip().lower() in ("y", "yes")


def preflight_problem(checks: list[preflight.Check]) -> SdkError | None:
    """The preflight's first error as one `SdkError` (no credentials: `NoCredentials`), or None."""
    for check in checks:
        if check.level != "error":
            continue
        if check.name == "credentials":
            return NoCredentials(
                f"{check.message}: configure them with `aws configure`, AWS_PROFILE or environment variables"
            )
        return SdkError(f"preflight {check.name}: {check.message}")
    return None


# ----------------------------------------------------------------------------------------------------- deploy


class Deployment:
    """Deploys, diffs, synthesizes and destroys one experiment's stack through the CDK CLI.

    `cli`, `checks` and `guard` can be replaced (tests: a stand-in CLI, no preflight, no update check); `confirm`
    answers the questions (default: ask on the terminal); `out` receives what a person follows (progress, the diff,
    what was done).
    """

    def __init__(
        self,
        name: str,
        settings: Mapping[str, Any] | None = None,
        *,
        project_dir: str | os.PathLike[str] | None = None,
        region: str | None = None,
        session: Any | None = None,
        cli: cdk.CdkCli | None = None,
        checks: Callable[[Plan, AwsClients], list[preflight.Check]] | None = None,
        guard: UpdateGuard | None = None,
        confirm: Confirm | None = None,
        out: IO[str] | None = None,
        poll_s: float = 3.0,
        verbose: bool = False,
    ) -> None:
        self.project_dir = Path(project_dir) if project_dir is not None else cdk.find_project()
        self.settings = dict(settings or {})
        self.name = name
        self.region = region
        self.aws = AwsClients(session=session, region=region)
        self.cli = cli or cdk.CdkCli(self.project_dir)
        self.checks = checks or _run_preflight
        self.guard = guard or _check_update
        self.out = out if out is not None else sys.stderr
        self.confirm = confirm or (lambda question: ask(question, stream=self.out))
        self.poll_s = poll_s
        self.verbose = verbose
        self._session_given = session is not None

    def plan(self) -> Plan:
        return plan(self.name, self.settings, self.project_dir)

    def _cli_account(self) -> None:
        """The CLI deploys where the preflight looked: this region, and a given session's credentials (in the child
        process's environment only), by their source rather than their current value wherever the CLI can resolve
        the source itself, since a deploy can outlast temporary keys (a 35-minute image build): the session's
        profile (SSO, assume-role and credential files refresh there), the environment and instance or container
        roles as they are. Only keys given to the session in code are handed over as they are."""
        env: dict[str, str] = {}
        region = self.aws.region
        if region:
            env["AWS_REGION"] = env["AWS_DEFAULT_REGION"] = region
        if self._session_given:
            session = self.aws.session
            profile = getattr(session, "profile_name", None)
            with aws_errors("read the session's credentials"):
                credentials = session.get_credentials()
            method = str(getattr(credentials, "method", "")) if credentials is not None else ""
            if credentials is not None and method in KEYS_IN_CODE:
                frozen = credentials.get_frozen_credentials()
                env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"] = frozen.access_key, frozen.secret_key
                if frozen.token:
                    env["AWS_SESSION_TOKEN"] = frozen.token
                    self._say(
                        "warning: the session's temporary keys go to the CDK CLI as they are: a deploy that outlasts "
                        "them fails; give a session with a profile (boto3.Session(profile_name=...)) instead"
                    )
            elif profile and method not in RESOLVED_BY_THE_CLI:
                env["AWS_PROFILE"] = str(profile)
        self.cli.env_overrides.update(env)

    def _say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def _echo(self) -> Callable[[str], None] | None:
        return self._say if self.verbose else None

    # ------------------------------------------------------------------------------------------------ dry run

    def synth(self) -> Path:
        """Synthesize the stack only (offline: no credentials, no AWS call); returns the template's path."""
        planned = self.plan()
        run = self.cli.run(self.cli.command("synth", self.name, planned.context, "-q"), echo=self._echo())
        if run.returncode != 0:
            raise SdkError(f"synth of {topology.stack_name(self.name)} failed: {run.last_error()} (see {run.log_path})")
        template = self.cli.template(self.name)
        if not template.is_file():
            raise SdkError(f"synth of {topology.stack_name(self.name)} wrote no template (see {run.log_path})")
        self._say(f"synthesized {topology.stack_name(self.name)}: {template}")
        return template

    # ------------------------------------------------------------------------------------------------- deploy

    def deploy(self, *, yes: bool = False, force: bool = False) -> Experiment:
        """Create or update the stack (nothing when it is up to date) and return the attached experiment. An update
        refuses while rollouts are in flight (`ops.upgrade.check_update`) unless `force` (never for a new ledger
        layout or new `endpoints`). An account without the account pool gets it first (`bootstrap_pool`: once per
        account and region)."""
        planned = self._ready(yes=yes)
        cloudformation = self.aws.client("cloudformation")
        stack = topology.stack_name(self.name)
        status = cdk.stack_status(cloudformation, self.name)
        if self._recreate(status, yes=yes):
            return self._deploy(planned, cloudformation, created=True)
        if status is None:
            question = f"Create stack {stack} in {self.aws.region}?"
        else:
            changed = self._differs(planned, cloudformation)
            if changed is None:
                self._say(f"{stack} is up to date: nothing to deploy")
                return self._attach()
            self.guard(self._attach(), changed, force, self._say)
            question = f"Deploy these changes to {stack}?"
        if not yes and not self.confirm(question):
            raise SdkError(f"deploy of {stack} cancelled: nothing changed")
        return self._deploy(planned, cloudformation, created=status is None)

    def _ready(self, *, yes: bool = False) -> Plan:
        """Validated settings, the CLI and its toolchain, the region, the account pool and the preflight:
        everything before the stack is read."""
        planned = self.plan()
        self.cli.check_installed()
        if self.aws.region is None:
            raise SdkError("no AWS region configured: pass region=... (--region), or set AWS_REGION")
        self._cli_account()
        if not pool_exists(self.aws):
            self._say(f"no account pool in {self.aws.region} yet: creating it first (`rollouts bootstrap`)")
            bootstrap_pool(self.aws, self.cli, {}, out=self.out, yes=yes, confirm=self.confirm)
        checks = self.checks(planned, self.aws)
        for check in checks:
            if check.level == "warning":
                self._say(f"warning: {check.name}: {check.message}")
        problem = preflight_problem(checks)
        if problem is not None:
            raise problem
        return planned

    def _recreate(self, status: str | None, *, yes: bool) -> bool:
        """Whether `cdk deploy` is to delete a failed create and create it again (as the CDK CLI does; confirmed);
        `SdkError` for a stack no deploy can start from (another failed state, or busy)."""
        stack = topology.stack_name(self.name)
        if status in cdk.CREATION_FAILURES:
            question = (
                f"Stack {stack} failed its creation ({status}): delete it and create it again in {self.aws.region}?"
            )
            if not yes and not self.confirm(question):
                raise SdkError(f"deploy of {stack} cancelled: nothing changed")
            self._say(f"{stack} failed its creation ({status}): cdk deploy deletes it, then creates it again")
            return True
        if status in cdk.FAILED_STATES:
            raise SdkError(
                f"stack {stack} is in state {status}: delete it first (`rollouts destroy -e {self.name}`, or "
                "Deployment(name).remove_failed_stack()), then deploy again"
            )
        if status is not None and status.endswith("_IN_PROGRESS"):
            raise SdkError(f"stack {stack} is busy ({status}): wait until it finishes, then deploy again")
        return False

    def _differs(self, planned: Plan, cloudformation: Any) -> list[str] | None:
        """None when `cdk diff` finds nothing to change; else the names of the experiment settings that change
        (maybe none: code, stack-only settings), after showing them and the diff."""
        lines: list[str] = []
        run = self.cli.run(self.cli.command("diff", self.name, planned.context, "--fail"), echo=lines.append)
        counts = [int(m.group(1)) for line in lines if (m := _DIFF_COUNT.search(line))]
        if run.returncode == 0 and not any(counts):
            return None
        if run.returncode != 0 and not counts and not any("differences" in line for line in lines):
            raise SdkError(f"cdk diff of {topology.stack_name(self.name)} failed: {run.last_error()}")
        changes = setting_changes(cdk.stack_outputs(cloudformation, self.name), planned.config)
        if changes:
            shown = [f"{key}: {old!r} -> {new!r}" for key, (old, new) in changes.items()]
            self._say("settings that change:\n  " + "\n  ".join(shown))
        self._say("\n".join(lines))
        return sorted(changes)

    def _deploy(self, planned: Plan, cloudformation: Any, *, created: bool) -> Experiment:
        outputs_file = self.cli.log_dir / f"outputs-{self.name}.json"
        outputs_file.parent.mkdir(parents=True, exist_ok=True)
        outputs_file.unlink(missing_ok=True)
        argv = self.cli.command(
            "deploy",
            self.name,
            planned.context,
            "--require-approval",
            "never",
            "--outputs-file",
            str(outputs_file),
        )
        stack = topology.stack_name(self.name)
        line = cdk.LiveLine(self.out, f"{'creating' if created else 'updating'} {stack}")
        started = cdk.operation_start()
        watcher = cdk.StackWatcher(
            cloudformation,
            self.name,
            started,
            line,
            total=lambda: cdk.template_resources(self.cli.template(self.name)),
            interval_s=self.poll_s,
        )
        with watcher:
            run = self.cli.run(argv, echo=self._echo())
        if run.returncode != 0:
            line.end("failed")
            raise cdk.failure_error(self.name, cdk.events_since(cloudformation, self.name, started), run)
        line.end(f"done ({run.log_path})")
        outputs = read_outputs_file(outputs_file, self.name)
        return Experiment.from_outputs(outputs, region=self.region, session=self.aws.session)

    def _attach(self) -> Experiment:
        return Experiment.attach(self.name, region=self.region, session=self.aws.session)

    # ------------------------------------------------------------------------------------------------ destroy

    def remove_failed_stack(self, *, yes: bool = False) -> str:
        """Delete a stack that cannot be attached (a failed create: `ROLLBACK_COMPLETE`, `*_FAILED`) with
        `cdk destroy`; what it retained stays. Returns the state it was in."""
        self.cli.check_installed()
        if self.aws.region is None:
            raise SdkError("no AWS region configured: pass region=... (--region), or set AWS_REGION")
        self._cli_account()
        cloudformation = self.aws.client("cloudformation")
        stack = topology.stack_name(self.name)
        status = cdk.stack_status(cloudformation, self.name)
        if status is None:
            raise SdkError(f"there is no stack {stack} in {self.aws.region}: nothing to destroy")
        if status not in cdk.FAILED_STATES:
            raise SdkError(f"stack {stack} is in state {status}, not a failed one: destroy the attached experiment")
        if not yes and not self.confirm(f"Delete the failed stack {stack} ({status})?"):
            raise SdkError(f"destroy of {stack} cancelled: nothing changed")
        self._run_destroy(cloudformation, _failed_stack_context(cdk.stack_outputs(cloudformation, self.name)))
        return status

    def _run_destroy(self, cloudformation: Any, context: Mapping[str, str]) -> None:
        stack = topology.stack_name(self.name)
        line = cdk.LiveLine(self.out, f"destroying {stack}")
        started = cdk.operation_start()
        watcher = cdk.StackWatcher(cloudformation, self.name, started, line, interval_s=self.poll_s)
        with watcher:
            run = self.cli.run(self.cli.command("destroy", self.name, context, "--force"), echo=self._echo())
        if run.returncode != 0:
            line.end("failed")
            raise cdk.failure_error(self.name, cdk.events_since(cloudformation, self.name, started), run)
        line.end("done")

    def destroy(
        self, experiment: Experiment, *, keep_results: bool = True, force: bool = False, yes: bool = False
    ) -> None:
        """Tear the stack down (see `Experiment.destroy`)."""
        self.cli.check_installed()
        stack = topology.stack_name(self.name)
        retained = experiment.config.results_retention == "retain"
        if keep_results and not retained:
            raise SdkError(
                f"stack {stack} deletes its results on destroy (results_retention=destroy): export what you need, "
                "then destroy with keep_results=False (--delete-results)"
            )
        busy = upgrade.in_flight(experiment).total
        if busy and not force:
            raise SdkError(
                f"experiment {self.name} has {busy} rollout(s) in flight or queued: wait for them, cancel their "
                "batches, or destroy with force=True (--force), which cancels them first"
            )
        what = "keeping the results bucket" if keep_results else "deleting the results bucket and every result"
        if not yes and not self.confirm(f"Destroy stack {stack} ({what})?"):
            raise SdkError(f"destroy of {stack} cancelled: nothing changed")
        if busy:
            cancelled = cancel_unfinished(experiment)
            self._say(f"cancelled {len(cancelled)} unfinished batch(es): {', '.join(cancelled) or '-'}")
        upgrade.stop_warm_pool(experiment, "destroyed", self._say)  # no warm session outlives its stack
        pruned = prune_subscriptions(experiment)
        if pruned:
            self._say(f"removed {len(pruned)} subscription(s) of the event bus: {', '.join(pruned)}")
        if not keep_results:
            removed = empty_bucket(experiment.client("s3"), experiment.results_bucket)
            self._say(f"deleted {removed} object version(s) of {experiment.results_bucket}")

        self._cli_account()
        self._run_destroy(self.aws.client("cloudformation"), destroy_context(experiment.config))
        leave_pool(experiment)
        if not keep_results and retained:
            with aws_errors(f"delete bucket {experiment.results_bucket}"):
                experiment.client("s3").delete_bucket(Bucket=experiment.results_bucket)
        if retained:
            kept = [experiment.table_name, experiment.input_bucket] + ([experiment.results_bucket] * keep_results)
            self._say(f"kept (results_retention=retain): {', '.join(kept)}")


def _failed_stack_context(outputs: Mapping[str, str]) -> dict[str, str]:
    raw = outputs.get("ExperimentConfig")
    if raw:
        try:
            return destroy_context(ExperimentConfig.from_env(raw))
        except ValueError:
            pass
    # No settings to read back: any model URL lets synth pass (the template is only used to name the stack).
    return {"allow_private_model_url": "true"}


def destroy_context(config: ExperimentConfig) -> dict[str, str]:
    """The deployed experiment's own settings as context: synth during `cdk destroy` validates them like a deploy
    (cdk.json's defaults alone may not pass, e.g. its loopback model URL)."""
    values = json.loads(config.to_env())
    values.pop("name", None)
    return {key: cdk.context_value(value) for key, value in values.items()}


def _check_update(experiment: Experiment, changed: Collection[str], force: bool, say: Callable[[str], None]) -> None:
    upgrade.check_update(experiment, changed, force=force, say=say)


def _run_preflight(planned: Plan, aws: AwsClients) -> list[preflight.Check]:
    return preflight.run(planned.merged, client=aws.client, region=aws.region or "")


# ---------------------------------------------------------------------------------------------- teardown steps


def unfinished_batches(experiment: Experiment) -> list[str]:
    """Batches not done (the ledger's batch listing: a paged Query of its index)."""
    found: list[str] = []
    with aws_errors(f"list the batches of {experiment.name}"):
        for batch_id in experiment.wiring().ledger().batches.batch_ids():
            if not experiment.batches.status(batch_id).done:
                found.append(batch_id)
    return sorted(found)


def cancel_unfinished(experiment: Experiment) -> list[str]:
    """Cancel every unfinished batch through the SDK's cancel path; returns their ids."""
    batches = unfinished_batches(experiment)
    for batch_id in batches:
        experiment.batches.cancel(batch_id)
    return batches


def prune_subscriptions(experiment: Experiment) -> list[str]:
    """Remove every private subscription (tap, ART, smoke: `ops/subscriptions.py`) of the experiment, whatever its
    age, so the stack can delete the bus. Returns the names removed; one that could not be removed raises."""
    results = subscriptions.prune_subscriptions(experiment.aws, experiment.bus_name, 0.0)
    failed = [r for r in results if r.action.startswith("failed")]
    if failed:
        raise SdkError(
            "could not remove subscription(s) "
            + ", ".join(f"{r.subscription.name} ({r.action})" for r in failed)
            + f": run `rollouts subscriptions prune -e {experiment.name} --older-than 0` again"
        )
    return [r.subscription.name for r in results if r.action == "removed"]


def empty_bucket(s3: Any, bucket: str) -> int:
    """Delete every object version and delete marker of `bucket` (1,000 per DeleteObjects); returns the count."""
    count = 0
    with aws_errors(f"empty bucket {bucket}"):
        for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket):
            keys = [
                {"Key": v["Key"], "VersionId": v["VersionId"]}
                for v in (page.get("Versions") or []) + (page.get("DeleteMarkers") or [])
            ]
            for start in range(0, len(keys), 1000):
                chunk = keys[start : start + 1000]
                resp = s3.delete_objects(Bucket=bucket, Delete={"Objects": chunk, "Quiet": True})
                errors = resp.get("Errors") or []
                if errors:
                    first = errors[0]
                    raise SdkError(f"cannot delete s3://{bucket}/{first.get('Key')}: {first.get('Message')}")
                count += len(chunk)
    return count


# ---------------------------------------------------------------------------------------------- the account pool


def leave_pool(experiment: Experiment) -> None:
    """Take a destroyed experiment out of the account pool at once (its entry would otherwise count its last
    sessions in flight until its heartbeat is stale, and stay listed an hour); best effort."""
    from rollout_pipeline.ledger.pool import PoolLedger

    table = experiment.stack_outputs.pool_table_name or topology.POOL_TABLE_NAME
    try:
        PoolLedger.open(table, experiment.client("dynamodb")).leave(experiment.name)
    except Exception as exc:  # the pool forgets a member that stopped renewing anyway
        logger.warning("could not take %s out of the account pool: %s", experiment.name, exc)


def pool_exists(aws: AwsClients) -> bool:
    """Whether the account pool's table exists in the region (DescribeTable)."""
    from rollout_pipeline.sdk._aws import error_code

    try:
        aws.client("dynamodb").describe_table(TableName=topology.POOL_TABLE_NAME)
    except Exception as exc:
        if error_code(exc) == "ResourceNotFoundException":
            return False
        raise
    return True


def pool_context(aws: AwsClients, overrides: Mapping[str, Any], out: IO[str]) -> dict[str, Any]:
    """The pool stack's settings: the account's AgentCore quotas read from Service Quotas by code (their documented
    defaults where it lists none, or when it cannot be read), then `overrides` (`quotas.POOL_CONTEXT_KEYS`, the
    reserve)."""
    region = aws.region or ""
    try:
        account = preflight.read_account_quotas(preflight.QuotaReader(aws.client("service-quotas")), region)
    except Exception as exc:  # no Service Quotas access: the documented values, said so
        out.write(f"warning: cannot read Service Quotas ({exc}): the documented quotas are used\n")
        account = AccountQuotas.defaults(region)
    context: dict[str, Any] = {
        "new_session_quota": account.new_sessions_per_s,
        "data_plane_quota": account.data_plane_per_s,
        "active_session_quota": account.active_sessions,
        quotas.SOURCE_KEY: account.source,
    }
    given = {key: value for key, value in overrides.items() if value not in (None, "")}
    if any(key in quotas.POOL_CONTEXT_KEYS for key in given):
        context[quotas.SOURCE_KEY] = f"{account.source}+override"
    return {**context, **given}


def require_cdk_bootstrap(aws: AwsClients) -> None:
    """`SdkError` naming `npx cdk bootstrap aws://ACCOUNT/REGION` when the account and region are not bootstrapped
    for the CDK (or too old for it: `preflight.bootstrap_check`)."""
    with aws_errors("read the account and its CDK bootstrap"):
        account = str(aws.client("sts").get_caller_identity()["Account"])
        check = preflight.bootstrap_check(aws.client("ssm"), account, aws.region or "")
    if check.level == "error":
        raise SdkError(f"cdk bootstrap: {check.message}")


def bootstrap_pool(
    aws: AwsClients,
    cli: cdk.CdkCli,
    overrides: Mapping[str, Any],
    *,
    out: IO[str],
    yes: bool = False,
    confirm: Confirm | None = None,
) -> dict[str, Any]:
    """Create or update the account pool's stack (`rollouts bootstrap`): one per account and region, shared by every
    experiment there, once the account and region are CDK-bootstrapped (`require_cdk_bootstrap`: a fresh account
    gets the one command that fixes it, not the CDK's raw error). Returns the settings it was deployed with."""
    require_cdk_bootstrap(aws)
    context = pool_context(aws, overrides, out)
    try:
        quotas.pool_settings(context, aws.region)
    except quotas.PoolSettingsError as exc:
        raise SdkError(str(exc)) from None
    summary = ", ".join(f"{key}={value}" for key, value in sorted(context.items()))
    out.write(f"account pool {topology.POOL_STACK_NAME} in {aws.region}: {summary}\n")
    if not yes and not (confirm or (lambda q: ask(q, stream=out)))(f"Deploy {topology.POOL_STACK_NAME}?"):
        raise SdkError("bootstrap cancelled: nothing changed")
    run = cli.run(cli.pool_command("deploy", context, "--require-approval", "never"))
    if run.returncode != 0:
        raise SdkError(f"deploy of {topology.POOL_STACK_NAME} failed: {run.last_error()} (see {run.log_path})")
    out.write(f"account pool ready ({run.log_path})\n")
    return context
