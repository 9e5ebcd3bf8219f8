"""`rollouts local ...`: run the pipeline on this machine (registered into the `rollouts` parser by `cli.py`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from rollout_pipeline import topology
from rollout_pipeline.cli.base import EXIT_INTERRUPTED, CliError, hidden_alias
from rollout_pipeline.config import DEFAULT_AGENT_MODULES, ConfigError
from rollout_pipeline.local.model_server import DEFAULT_MAX_TOKENS, MODEL_ID

EXIT_OK = 0
EXIT_FAILED = 1


def _count(minimum: int) -> Any:
    """An argparse type: an integer >= `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below {minimum}")
        return value

    return parse


def _seconds(text: str) -> float:
    """An argparse type: a number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be above 0")
    return value


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """What a user can get wrong in local mode as the CLI's one-line error (`CliError`): a bad setting
    (`ConfigError`), an agent that cannot start (`AgentStartError`: its output's last line), a port in use
    (`PortInUse`), a local model that is not installed or does not start (`ModelServerError`)."""
    from rollout_pipeline.local.acr import AgentStartError
    from rollout_pipeline.local.model_server import ModelServerError
    from rollout_pipeline.local.moto_server import PortInUse

    try:
        yield
    except (ConfigError, PortInUse, ModelServerError) as exc:
        raise CliError(str(exc)) from None
    except AgentStartError as exc:
        raise CliError(f"the agent did not start: {exc.summary}") from None


#: `rollouts local up`'s default port: the printed block (and the README's) stays the same from run to run.
DEFAULT_UP_PORT = 4580


def _add_pipeline_options(parser: argparse.ArgumentParser, *, demo: bool) -> None:
    """The options `demo` and `up` share, each help text about the command it is shown for."""
    parser.add_argument(
        "-e",
        "--experiment",
        action="append",
        metavar="NAME",
        help="local experiment name (default: local-demo)"
        if demo
        else "local experiment name (default: local-demo); more than once: several experiments on one local account "
        "(one moto endpoint, one account pool, one local AgentCore with the account's quotas)",
    )
    _add_account_options(parser)
    parser.add_argument("--group-size", type=_count(1), default=4, help="rollouts per row (default: 4)")
    parser.add_argument(
        "--model-url",
        help="an OpenAI-compatible base URL to use instead of starting the local SmolLM2 model",
    )
    parser.add_argument("--model-id", default=MODEL_ID, help=f"model id sent to the agent (default: {MODEL_ID})")
    parser.add_argument("--tps", type=int, default=20, help="ACR calls per second limit (default: 20)")
    parser.add_argument("--max-sessions", type=int, default=4, help="rollouts in flight at once (default: 4)")
    parser.add_argument(
        "--rollout-timeout", type=int, default=300, metavar="S", help="deadline of one rollout attempt (default: 300)"
    )
    hidden_alias(parser, "--timeout-s", "rollout_timeout", type=int)
    parser.add_argument(
        "--max-tokens",
        type=int,
        help=(
            f"sampling max_tokens (default: what a bundled dataset's task needs, else {DEFAULT_MAX_TOKENS})"
            if demo
            else f"sampling max_tokens (default: {DEFAULT_MAX_TOKENS})"
        )
        + "; an agent that thinks step by step needs more, e.g. 256",
    )
    parser.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (default: 0.7)")
    _add_agent_options(parser)
    parser.add_argument(
        "--warm-sessions",
        type=_warm_sessions,
        default=0,
        metavar="N|auto",
        help="keep N sessions started ahead of the next batch (the warm pool; `auto`: the last batch's size; "
        "default 0: off); they count against --max-sessions",
    )
    parser.add_argument(
        "--budget-usd",
        type=float,
        metavar="USD",
        help="the experiment's budget, priced as on AgentCore: at 80%% a Budget Warning, at 100%% dispatch pauses "
        + (
            "(the demo then raises it, as `rollouts budget set` would, and the batch completes)"
            if demo
            else "until `rollouts budget set` raises it"
        ),
    )
    parser.add_argument("--work-dir", type=Path, help="where logs go (default: a new temporary directory)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the pipeline does")


def _add_account_options(parser: argparse.ArgumentParser) -> None:
    """The local account's quotas and reserve, and each experiment's own settings."""
    parser.add_argument(
        "--account-quota",
        type=float,
        metavar="N",
        help="the local account's AgentCore new-session quota, sessions/s for every experiment together (default: "
        "AgentCore's documented 25); the local AgentCore refuses beyond it as AgentCore does",
    )
    parser.add_argument(
        "--account-active-sessions",
        type=int,
        metavar="N",
        help="the local account's active-session quota (default: AgentCore's documented one); the local AgentCore "
        "answers ServiceQuotaExceededException beyond it as AgentCore does",
    )
    parser.add_argument(
        "--reserve",
        type=float,
        metavar="SHARE",
        help="the share of each account quota the pipeline leaves unused (default: 0.1)",
    )
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="[NAME:]KEY=VALUE",
        help="an experiment setting as the deployed stack takes it (`-c KEY=VALUE`), for the experiment NAME or, "
        "without it, for all; e.g. --setting exp-b:capacity_weight=2 --setting exp-c:session_rate_limit=1",
    )


def _add_agent_options(parser: argparse.ArgumentParser) -> None:
    """The agent's module, kind and isolation."""
    parser.add_argument(
        "--agent-module",
        default=DEFAULT_AGENT_MODULES["art"],
        help="agent module (on PYTHONPATH), served by the agent host as the image serves it: an ART module runs as "
        "written (ending in app.run() is fine); SageMaker RFT SDK agents through the RFT adapter (see --agent-kind)",
    )
    parser.add_argument(
        "--agent-kind",
        choices=("auto", "art", "rft"),
        default="auto",
        help="auto (default: detected from the module's source), art, or rft (serve its @app.entrypoint unchanged "
        "through the RFT adapter, its front door started before the module is imported)",
    )
    parser.add_argument(
        "--agent-isolation",
        choices=("process", "shared"),
        default="process",
        help="process (default: one agent process per session, as ACR's microVMs; a stop kills it) or shared (one "
        "process serves every session: starts fast, sessions not isolated)",
    )


def _warm_sessions(text: str) -> int | str:
    """`--warm-sessions`: a count of sessions (0: off) or `auto`."""
    value = text.strip().lower()
    if value == "auto":
        return value
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"must be a number of sessions or 'auto', got {text!r}")
    return int(value)


def register(sub: Any, _common: argparse.ArgumentParser) -> None:
    """Add the `local` command group to the `rollouts` parser."""
    local = sub.add_parser(
        "local",
        help="run the whole pipeline locally (moto, real agent, real model)",
        description="Run the whole pipeline on this machine: AWS resources in a loopback moto server, the Lambda "
        "handlers as local queue consumers, the example agent as local processes and a real local model "
        "(SmolLM2-135M through llama.cpp) unless --model-url is given. No AWS account needed.",
    )
    local_sub = local.add_subparsers(dest="local_command", metavar="LOCAL_COMMAND", required=True)

    demo = local_sub.add_parser(
        "demo",
        help="run the sample dataset through the local pipeline and show the events",
        description="Drop a dataset into the local input bucket, show a progress bar and the pushed events as they "
        "arrive, then a summary. Exits non-zero unless the batch completed with at least one rollout succeeded "
        "and every session stopped.",
    )
    _add_pipeline_options(demo, demo=True)
    demo.add_argument(
        "--dataset",
        default="arithmetic",
        metavar="NAME|FILE",
        help="a bundled dataset, `arithmetic` (default: single-digit sums, max_tokens 32) or `gsm8k` (word problems, "
        "max_tokens 256; SmolLM2-135M scores ~0 on them), or a .jsonl file",
    )
    demo.add_argument(
        "--rows", type=_count(0), default=6, help="use the first N rows of the dataset (default: 6; 0 = all)"
    )
    demo.add_argument(
        "--timeout", type=_seconds, default=900, metavar="S", help="give up after this many seconds (default: 900)"
    )
    hidden_alias(demo, "--wait-s", "timeout", type=_seconds)
    demo.add_argument(
        "--report",
        type=Path,
        metavar="FILE",
        help="write the batch's HTML report here, and the data it was drawn from next to it as .json (default: "
        "report-BATCH.html in the work directory)",
    )
    demo.add_argument("--no-report", action="store_true", help="do not write the HTML report")
    demo.set_defaults(handler=_cmd_demo)

    up = local_sub.add_parser(
        "up",
        help="start the local pipeline and keep it running for the SDK/CLI (Ctrl-C stops it)",
        description="Start the local pipeline and keep it running; print what another process pastes to drive it: "
        "`export ROLLOUTS_ENDPOINT_URL=... ROLLOUTS_EXPERIMENT=...` for the CLI, "
        "`Experiment.local(endpoint_url, name=...)` for the SDK.",
    )
    _add_pipeline_options(up, demo=False)
    up.add_argument(
        "--port",
        type=int,
        default=DEFAULT_UP_PORT,
        help=f"port of the local AWS endpoint http://127.0.0.1:PORT (default: {DEFAULT_UP_PORT}; 0: any free port)",
    )
    up.add_argument(
        "--write-outputs",
        type=Path,
        metavar="FILE",
        help="also write the experiment's stack outputs to FILE, as `cdk deploy --outputs-file` does (what "
        "--outputs-file of the other commands and Experiment.local(url, outputs=FILE) read)",
    )
    hidden_alias(up, "--outputs-file", "write_outputs", type=Path)
    up.set_defaults(handler=_cmd_up)


def _settings(args: argparse.Namespace, max_tokens: int = DEFAULT_MAX_TOKENS) -> Any:
    from rollout_pipeline.cli.base import CliError
    from rollout_pipeline.local.pipeline import LocalSettings

    if args.budget_usd is not None and not args.budget_usd > 0:
        raise CliError(f"--budget-usd must be a positive number of US dollars, got {args.budget_usd}")
    names = args.experiment or ["local-demo"]
    shared, per_experiment = _experiment_settings(args.setting, names)
    if args.budget_usd is not None:
        shared["budget_usd"] = args.budget_usd
    return LocalSettings(
        experiment=names[0],
        also=tuple(names[1:]),
        account_new_sessions_per_s=args.account_quota,
        account_active_sessions=args.account_active_sessions,
        capacity_reserve=args.reserve,
        per_experiment=per_experiment,
        group_size=args.group_size,
        tps_limit=args.tps,
        max_sessions=args.max_sessions,
        rollout_timeout_s=args.rollout_timeout,
        model_url=args.model_url,
        model_id=args.model_id,
        sampling_params={"temperature": args.temperature, "max_tokens": args.max_tokens or max_tokens},
        agent_module=args.agent_module,
        agent_kind=args.agent_kind,
        isolation=args.agent_isolation,
        warm_sessions=args.warm_sessions,
        work_dir=args.work_dir,
        port=getattr(args, "port", None) or None,
        experiment_settings=shared,
    )


def _experiment_settings(given: list[str], names: list[str]) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """`--setting [NAME:]KEY=VALUE` options: (the settings of every experiment, those of one experiment by name);
    values are text, as `-c KEY=VALUE` gives them (the configuration validates them)."""
    from rollout_pipeline.cli.base import CliError

    shared: dict[str, str] = {}
    per_experiment: dict[str, dict[str, str]] = {}
    for item in given:
        target, _, assignment = item.rpartition(":") if ":" in item.split("=", 1)[0] else ("", "", item)
        key, sep, value = assignment.partition("=")
        if not sep or not key.strip():
            raise CliError(f"--setting {item!r}: expected [NAME:]KEY=VALUE, e.g. exp-b:capacity_weight=2")
        if target and target not in names:
            raise CliError(f"--setting {item!r}: {target} is not an experiment of this run ({', '.join(names)})")
        (per_experiment.setdefault(target, {}) if target else shared)[key.strip()] = value.strip()
    return shared, per_experiment


def _cmd_demo(args: argparse.Namespace, out: TextIO) -> int:
    from rollout_pipeline.local.demo import resolve_dataset, run_demo

    dataset, max_tokens = resolve_dataset(args.dataset)
    with one_line_errors():
        report = run_demo(
            _settings(args, max_tokens),
            dataset=dataset,
            rows=args.rows or None,
            timeout_s=args.timeout,
            write_html_report=not args.no_report,
            report_path=args.report,
            out=out,
        )
    if report.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_OK if report.ok else EXIT_FAILED


def _cmd_up(args: argparse.Namespace, out: TextIO) -> int:
    from rollout_pipeline.local.pipeline import LocalPipeline, interrupt_on_signals
    from rollout_pipeline.sdk.route import local_up_block

    with one_line_errors(), interrupt_on_signals(), LocalPipeline(_settings(args)) as pipeline:
        names = list(pipeline.experiments)
        if args.write_outputs:
            outputs = {
                topology.stack_name(name): local.resources.stack_outputs()
                for name, local in pipeline.experiments.items()
            }
            args.write_outputs.write_text(json.dumps(outputs, indent=2))
        print(
            f"local pipeline up: experiment{'s' if len(names) > 1 else ''} {', '.join(names)} on one local account, "
            f"AWS endpoint {pipeline.endpoint_url}, model {pipeline.model_url}, logs in {pipeline.work_dir}",
            file=out,
        )
        if args.write_outputs:
            print(f"stack outputs written to {args.write_outputs}", file=out)
        for name in names:
            print(local_up_block(pipeline.endpoint_url, name), file=out)
        print("Ctrl-C stops the pipeline.", file=out, flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            print(stopped_summary(pipeline), file=out, flush=True)
            raise


def stopped_summary(pipeline: Any) -> str:
    """What stopping `local up` loses and keeps: the batches not finished (local AWS lives in memory: they go with
    it) and the work directory (logs, kept)."""
    lines = [
        "stopping the local pipeline: its AWS (moto) lives in memory, so its queues, buckets and ledger go with it"
    ]
    for name, local in pipeline.experiments.items():
        try:
            statuses = [local.sdk.batches.status(batch) for batch in local.sdk.batches.recent()]
        except Exception as exc:  # the summary must not hold up the stop
            lines.append(f"  experiment {name}: batches not read ({type(exc).__name__}: {exc})")
            continue
        for status in statuses:
            if status.status in ("completed", "cancelled", "rejected"):
                continue
            ended = status.succeeded + status.failed
            total = "?" if status.rollouts_total is None else str(status.rollouts_total)
            lines.append(
                f"  LOST batch {status.batch_id} ({name}): {ended} of {total} rollouts had ended; the rest, queued "
                "or running, are gone (submit it again to a new `local up`)"
            )
    lines.append(f"  KEPT the work directory {pipeline.work_dir} (model and agent logs)")
    return "\n".join(lines)
