"""`rollouts deploy` and `rollouts destroy`: an experiment's stack created, updated and torn down through the SDK
(`Experiment.launch`, `Experiment.destroy`, which drive the project's CDK CLI)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TextIO

from rollout_pipeline.cli.base import EXIT_OK, CliError, add_context_argument, add_experiment_arguments

_DEPLOY_DESCRIPTION = """\
Create or update the stack Rollouts-NAME from the project's CDK app, through the CDK CLI `make setup` installs
(node_modules/.bin/cdk). The settings (cdk.json's context, overridden by -c KEY=VALUE) are validated first, then
the preflight runs (credentials, AgentCore in the region, quotas, CDK bootstrap; read calls only). A stack that is
up to date is left alone; for one that differs, the changed settings and `cdk diff` are shown and confirmed
(--yes: no question). An update refuses while rollouts are in flight or queued (drain before upgrading; --force
goes on anyway, except for a new ledger layout or a new endpoints setting, which need a drained experiment).
Progress comes from the stack's events; a failed deploy names the first resource that failed and why. --dry-run
only synthesizes the template (offline: no credentials needed).
"""

_DESTROY_DESCRIPTION = """\
Tear down the stack Rollouts-NAME. Refuses while rollouts are in flight or queued unless --force (which cancels
their batches first). Removes the SDK's own subscriptions from the event bus (watch taps, trainer queues) so the
bus can go, then runs `cdk destroy`. The results bucket is kept unless --delete-results (which deletes every
object version in it, then the bucket); with results_retention=retain the ledger table and input bucket stay too.
"""


def _experiment_options(parser: argparse.ArgumentParser) -> None:
    add_experiment_arguments(parser)
    parser.add_argument(
        "--project-dir",
        type=Path,
        metavar="DIR",
        help="the rollout-pipeline checkout (cdk.json, app.py, node_modules); default: found from the working "
        "directory upwards",
    )
    parser.add_argument("-y", "--yes", action="store_true", help="do not ask before changing anything")
    parser.add_argument("-v", "--verbose", action="store_true", help="also print the CDK CLI's own output")


def register(sub: Any) -> None:
    """Add `bootstrap`, `deploy` and `destroy` to the `rollouts` parser."""
    register_bootstrap(sub)
    deploy = sub.add_parser(
        "deploy",
        help="create or update an experiment's stack (validate, preflight, cdk diff, cdk deploy)",
        description=_DEPLOY_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: rollouts deploy -e my-exp -c model_base_url=https://models.example.org/v1 -c group_size=8",
    )
    _experiment_options(deploy)
    add_context_argument(
        deploy,
        "a setting, as `cdk deploy -c` takes it (repeatable): an ExperimentConfig field (group_size, "
        "model_base_url, max_sessions, ...) or a stack key (image_build, image_uri, alarm_email, ...)",
    )
    deploy.add_argument(
        "--dry-run", action="store_true", help="validate and synthesize the template only (offline, changes nothing)"
    )
    deploy.add_argument(
        "--force",
        action="store_true",
        help="update even with rollouts in flight (never for a new ledger layout or a new endpoints setting)",
    )
    deploy.set_defaults(handler=cmd_deploy)

    destroy = sub.add_parser(
        "destroy",
        help="tear down an experiment's stack (keeps the results unless --delete-results)",
        description=_DESTROY_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: rollouts destroy -e my-exp --force --delete-results --yes",
    )
    _experiment_options(destroy)
    destroy.add_argument(
        "--force", action="store_true", help="cancel the batches still in flight instead of refusing to destroy"
    )
    destroy.add_argument(
        "--delete-results",
        action="store_true",
        help="delete the results bucket and every result in it (default: keep it)",
    )
    destroy.set_defaults(handler=cmd_destroy)


_BOOTSTRAP_DESCRIPTION = """\
Create or update the account pool RolloutsPool in this account and region, once (as `cdk bootstrap` is): the table
every experiment stack shares AgentCore's quotas through. Its settings are the account's AgentCore quotas read from
Service Quotas by code (the documented defaults where it lists none), overridable, and the reserve left for
everything else in the account. `rollouts deploy` creates it when it is missing.
"""


def register_bootstrap(sub: Any) -> None:
    """Add `bootstrap` to the `rollouts` parser."""
    bootstrap = sub.add_parser(
        "bootstrap",
        help="create or update the account pool (once per account and region)",
        description=_BOOTSTRAP_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: rollouts bootstrap --region us-east-1 --reserve 0.1",
    )
    bootstrap.add_argument("--region", help="AWS region (default: the profile's / AWS_REGION)")
    bootstrap.add_argument("--project-dir", type=Path, metavar="DIR", help="the rollout-pipeline checkout")
    bootstrap.add_argument("--new-session-quota", type=float, metavar="N", help="new sessions/s (default: read)")
    bootstrap.add_argument("--data-plane-quota", type=float, metavar="N", help="data-plane calls/s (default: read)")
    bootstrap.add_argument("--active-session-quota", type=int, metavar="N", help="active sessions (default: read)")
    bootstrap.add_argument("--reserve", type=float, metavar="SHARE", help="share of each budget left unused (0.1)")
    bootstrap.add_argument("-y", "--yes", action="store_true", help="do not ask before changing anything")
    bootstrap.set_defaults(handler=cmd_bootstrap)


def cmd_bootstrap(args: argparse.Namespace, out: TextIO) -> int:
    from rollout_pipeline.ops import cdk
    from rollout_pipeline.ops.launch import bootstrap_pool
    from rollout_pipeline.sdk._aws import AwsClients

    project = args.project_dir if args.project_dir is not None else cdk.find_project()
    overrides = {
        "new_session_quota": args.new_session_quota,
        "data_plane_quota": args.data_plane_quota,
        "active_session_quota": args.active_session_quota,
        "capacity_reserve": args.reserve,
    }
    aws = AwsClients(region=args.region)
    cli = cdk.CdkCli(Path(project))
    if aws.region:
        cli.env_overrides.update({"AWS_REGION": aws.region, "AWS_DEFAULT_REGION": aws.region})
    settings = bootstrap_pool(aws, cli, overrides, out=sys.stderr, yes=args.yes)
    print(
        f"account pool deployed in {aws.region}: " + ", ".join(f"{k}={v}" for k, v in sorted(settings.items())),
        file=out,
    )
    return EXIT_OK


def _settings(items: list[str]) -> dict[str, str]:
    settings: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"-c {item!r}: expected KEY=VALUE")
        settings[key] = value
    return settings


def _name(args: argparse.Namespace) -> str:
    if not args.experiment:
        raise CliError("no experiment: pass -e/--experiment NAME (or set ROLLOUTS_EXPERIMENT)")
    return str(args.experiment)


def cmd_deploy(args: argparse.Namespace, out: TextIO) -> int:
    from rollout_pipeline.ops.launch import Deployment

    deployment = Deployment(
        _name(args),
        _settings(args.context),
        project_dir=args.project_dir,
        region=args.region,
        out=sys.stderr,
        verbose=args.verbose,
    )
    if args.dry_run:
        print(deployment.synth(), file=out)
        return EXIT_OK
    experiment = deployment.deploy(yes=args.yes, force=args.force)
    print(f"experiment {experiment.name} is deployed ({experiment.aws.region})", file=out)
    for key, value in sorted(experiment.outputs.items()):
        if key != "ExperimentConfig":
            print(f"  {key} = {value}", file=out)
    return EXIT_OK


def cmd_destroy(args: argparse.Namespace, out: TextIO) -> int:
    from rollout_pipeline.ops.launch import Deployment
    from rollout_pipeline.sdk import Experiment, ExperimentNotDeployed

    name = _name(args)
    try:
        experiment = Experiment.attach(name, region=args.region)
    except ExperimentNotDeployed:  # no stack, or one that cannot be attached: a failed create is deleted as it is
        deployment = Deployment(
            name, project_dir=args.project_dir, region=args.region, out=sys.stderr, verbose=args.verbose
        )
        status = deployment.remove_failed_stack(yes=args.yes)
        print(f"failed stack of experiment {name} ({status}) destroyed", file=out)
        return EXIT_OK
    experiment.destroy(
        keep_results=not args.delete_results, force=args.force, yes=args.yes, project_dir=args.project_dir
    )
    print(f"experiment {name} destroyed", file=out)
    return EXIT_OK
