"""The `rollouts` argument parser: shared experiment options, one subcommand per command, and the command groups
of other modes registered under the `rollout_pipeline.cli` entry points (local mode's `rollouts local ...`:
`rollout_pipeline.local.cli.register(subparsers, common)`)."""

from __future__ import annotations

import argparse
import difflib
import os
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from rollout_pipeline.cli import commands
from rollout_pipeline.cli import data as data_commands
from rollout_pipeline.cli import stack as stack_commands
from rollout_pipeline.cli.base import add_context_argument, add_experiment_arguments, hidden_alias
from rollout_pipeline.sdk.route import ENDPOINT_ENV

#: The entry-point group of command groups (`register(subparsers, common)`), like `ops.launch.LAUNCHERS_GROUP`.
COMMAND_GROUPS: Final = "rollout_pipeline.cli"

_DESCRIPTION = """\
Event-driven RL rollouts on Amazon Bedrock AgentCore Runtime.

Submit a dataset, watch its rollouts complete from pushed events, check a batch's status, cancel it, export its
results (JSON Lines, or a Parquet dataset), re-score them with a new reward function, or compute pass@k. Region
and credentials come from the usual AWS chain (AWS_PROFILE, AWS_REGION, ...).
"""

_EPILOG = """\
examples:
  rollouts submit train.jsonl -e my-exp --group-size 8 --sampling-params '{"temperature": 0.7}'
  rollouts watch -e my-exp --batch train-3f2a9c1b7d4e
  rollouts status -e my-exp --endpoint-url http://127.0.0.1:4580 --batch train-3f2a9c1b7d4e   # local mode
  rollouts status -e my-exp --batch train-3f2a9c1b7d4e --json
  rollouts export -e my-exp --batch train-3f2a9c1b7d4e -o results.jsonl
  rollouts export -e my-exp --batch train-3f2a9c1b7d4e --format parquet -o rollouts/
  rollouts rescore -e my-exp --batch train-3f2a9c1b7d4e --reward my_rewards:exact -o rescored/
  rollouts stats -e my-exp --batch train-3f2a9c1b7d4e --pass-k 1,4,8
  rollouts report -e my-exp --batch train-3f2a9c1b7d4e -o report.html
  rollouts cancel -e my-exp --batch train-3f2a9c1b7d4e
  rollouts cost -e my-exp [--batch train-3f2a9c1b7d4e]
  rollouts budget set -e my-exp 250
"""


#: The top-level commands by topic, in the order `rollouts --help` lists them; a command another mode registers that
#: is not named here is listed last, under "more".
COMMAND_TOPICS: Final = (
    ("run batches", ("submit", "watch", "status", "cancel")),
    ("read their results", ("export", "stats", "rescore", "report")),
    ("on this machine, with no AWS account", ("local",)),
    ("cost and AgentCore's limits", ("cost", "budget", "capacity")),
    ("deploy and operate", ("preflight", "bootstrap", "deploy", "smoke", "subscriptions", "destroy")),
)


class RolloutsParser(argparse.ArgumentParser):
    """`argparse.ArgumentParser` that suggests the closest command or option for a typo ("did you mean ...?") and
    reports an option the command does not know with that command's usage, not the top-level one."""

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            target = _chosen_parser(self, parsed)
            unknown = " ".join(extras)
            hint = _closest(extras[0].split("=", 1)[0], list(target._option_string_actions))
            target.error(f"unrecognized arguments: {unknown}{hint}")
        return parsed

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is not None and value not in action.choices:
            choices = ", ".join(map(repr, action.choices))
            hint = _closest(str(value), [str(choice) for choice in action.choices])
            raise argparse.ArgumentError(action, f"invalid choice: {value!r}{hint} (choose from {choices})")
        super()._check_value(action, value)


def _closest(word: str, candidates: list[str]) -> str:
    """`; did you mean X?` for the candidate closest to `word`, or "" when none is close."""
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[Any] | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def _chosen_parser(parser: argparse.ArgumentParser, parsed: Any) -> argparse.ArgumentParser:
    """The innermost (sub)command parser that `parsed` went through (`rollouts budget set` -> `set`'s parser)."""
    action = _subcommands(parser)
    while action is not None:
        chosen = action.choices.get(getattr(parsed, action.dest, None) or "")
        if chosen is None:
            break
        parser, action = chosen, _subcommands(chosen)
    return parser


def _list_by_topic(parser: argparse.ArgumentParser) -> None:
    """List the top-level commands by topic (`COMMAND_TOPICS`) in `parser`'s description instead of argparse's one
    flat list."""
    action = _subcommands(parser)
    assert action is not None
    helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
    named = {name for _, names in COMMAND_TOPICS for name in names}
    topics = [*COMMAND_TOPICS, ("more", tuple(name for name in helps if name not in named))]
    lines = ["commands (`rollouts COMMAND --help` for one):"]
    for topic, names in topics:
        present = [name for name in names if name in helps]
        if not present:
            continue
        lines.append(f"  {topic}")
        for name in present:
            text = textwrap.wrap(helps[name], width=100, initial_indent=f"    {name:<14}", subsequent_indent=" " * 18)
            lines.extend(text or [f"    {name}"])
    action._choices_actions.clear()  # listed above instead
    action.help = "one of the commands listed above"
    parser.description = f"{parser.description}\n" + "\n".join(lines)


def _common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("experiment")
    add_experiment_arguments(group)
    group.add_argument(
        "--outputs-file",
        type=Path,
        metavar="FILE",
        help="stack outputs JSON (`cdk deploy --outputs-file`) instead of reading CloudFormation",
    )
    group.add_argument(
        "--endpoint-url",
        default=os.environ.get(ENDPOINT_ENV),
        metavar="URL",
        help=f"local mode: send every AWS call to this endpoint, as `rollouts local up` prints it (default: "
        f"${ENDPOINT_ENV})",
    )
    group.add_argument("-v", "--verbose", action="store_true", help="log what the SDK does")
    return common


def build_parser() -> argparse.ArgumentParser:
    """The `rollouts` argument parser (with the `local` group when local mode provides one)."""
    parser = RolloutsParser(
        prog="rollouts",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = _common_options()
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_submission(sub, common)
    _add_batch_commands(sub, common)
    data_commands.register(sub, common)  # export, rescore, stats
    _add_preflight(sub, common)
    _add_report(sub, common)
    _add_cost(sub, common)
    stack_commands.register(sub)  # deploy, destroy
    _add_operations(sub, common)
    _register_modes(sub, common)
    _list_by_topic(parser)
    return parser


def _command(
    sub: Any, common: argparse.ArgumentParser, name: str, handler: Any, **texts: str
) -> argparse.ArgumentParser:
    """A subcommand with the shared experiment options whose `handler` runs it (`help`, `description`: argparse's)."""
    parser: argparse.ArgumentParser = sub.add_parser(name, parents=[common], **texts)
    parser.set_defaults(handler=handler)
    return parser


def _batch_argument(parser: argparse.ArgumentParser, help_text: str = "batch id") -> None:
    """The `--batch ID` every command on one batch takes."""
    parser.add_argument("--batch", required=True, metavar="ID", help=help_text)


def _add_submission(sub: Any, common: argparse.ArgumentParser) -> None:
    """`submit` and `watch`: sending a batch and following it."""
    submit = _command(
        sub,
        common,
        "submit",
        commands.cmd_submit,
        help="validate a dataset file and upload it: one batch of rollouts",
        description="Validate a dataset file locally (.jsonl, .jsonl.gz or a .json array), then upload it to the "
        "experiment's input bucket under datasets/. Prints the batch id. Options default to the experiment's.",
    )
    submit.add_argument("file", type=Path, help="dataset file: one JSON object per row; `id` and `_rollout` reserved")
    submit.add_argument("--group-size", type=int, metavar="N", help="rollouts per row (GRPO group size)")
    submit.add_argument(
        "--rollout-timeout",
        type=int,
        metavar="S",
        help="deadline of one rollout attempt, seconds (default: the experiment's)",
    )
    hidden_alias(submit, "--timeout", "rollout_timeout", type=int)  # its first name; --timeout is a wait elsewhere
    submit.add_argument("--max-attempts", type=int, metavar="N", help="attempts per rollout (timeouts are retried)")
    submit.add_argument("--policy-version", metavar="V", help="policy version recorded on every event")
    submit.add_argument("--sampling-params", metavar="JSON", help='e.g. \'{"temperature": 0.7, "max_tokens": 512}\'')
    submit.add_argument("--key", help="object key under datasets/ (default: the file name)")
    submit.add_argument(
        "--budget-usd", type=float, metavar="USD", help="the batch's own budget: its rollouts wait once it is spent"
    )
    submit.add_argument("--watch", action="store_true", help="then watch the batch until it completes")
    submit.add_argument("--poll-wait", type=float, default=5.0, help=argparse.SUPPRESS)

    watch = _command(
        sub,
        common,
        "watch",
        commands.cmd_watch,
        help="live progress of a batch (or of every batch) from pushed events",
        description="Show progress from the events the pipeline pushes (never by polling S3). By default events are "
        "read from a private queue subscribed to the event bus, so watching never takes events away from the "
        "trainer; --from-trainer-queue consumes the trainer queue instead (when nobody else reads it).",
    )
    watch.add_argument("--batch", metavar="ID", help="the batch to follow (default: every batch, as a log)")
    watch.add_argument("--timeout", type=float, metavar="S", help="stop after S seconds (default: until done)")
    watch.add_argument(
        "--from-trainer-queue", action="store_true", help="consume the trainer queue instead of a private tap"
    )
    watch.add_argument(
        "--from-start",
        action="store_true",
        help="log every event of --batch from its first: those published before, rebuilt from the ledger with the "
        "same event ids, then the live ones, each once",
    )
    watch.add_argument(
        "--refresh",
        type=float,
        default=15.0,
        metavar="S",
        help="re-read the running/queued split from the ledger every S seconds (0: never; default 15)",
    )
    watch.add_argument(
        "--events",
        type=Path,
        metavar="FILE",
        help="also append every event received to FILE (JSON Lines of event envelopes), as `rollouts report "
        "--events FILE` reads them (the report's result-to-event latency chart)",
    )
    watch.add_argument("--poll-wait", type=float, default=5.0, help=argparse.SUPPRESS)


def _add_batch_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """`status`, `cancel`: one batch, read from the ledger (or cancelled)."""
    status = _command(
        sub,
        common,
        "status",
        commands.cmd_status,
        help="where a batch stands: queued, running, succeeded, failed by reason, rewards",
        description="Read a batch's counters from the ledger.",
    )
    _batch_argument(status, "batch id (printed by submit)")
    status.add_argument("--json", action="store_true", help="print JSON")

    capacity = _command(
        sub,
        common,
        "capacity",
        commands.cmd_capacity,
        help="the account pool: AgentCore's quotas, the reserve, and every experiment's share, use and throttles",
        description="Read the account pool the experiment shares AgentCore's quotas through (one read): the "
        "account's quotas and where they came from, the reserve, the backoff after AgentCore's throttles, and each "
        "experiment's weight, fair share, grant and recent use of new sessions/s, sessions in flight, throttles.",
    )
    capacity.add_argument("--json", action="store_true", help="print JSON")

    cancel = _command(
        sub,
        common,
        "cancel",
        commands.cmd_cancel,
        help="cancel a batch: nothing more starts, running sessions are stopped",
        description="Cancel a batch: queued rollouts never start, running ones are stopped, every rollout not yet "
        "finished ends as `Rollout Failed` with reason `cancelled`. Safe to repeat.",
    )
    _batch_argument(cancel)


def _add_preflight(sub: Any, common: argparse.ArgumentParser) -> None:
    """`preflight`: read-only checks before a deploy."""
    preflight = _command(
        sub,
        common,
        "preflight",
        commands.cmd_preflight,
        help="check, with read calls only, that an experiment can be deployed (run by `make deploy`)",
        description="Check the settings (cdk.json + -c overrides), the model URL, AgentCore in the region, the "
        "account's AgentCore quotas against the limits (by quota code), the CodeBuild ARM build (region, concurrent "
        "builds), Lambda concurrency, and the CDK bootstrap. One line per check with what to do; exit 1 on an error.",
    )
    add_context_argument(preflight, "a CDK context override, as given to `cdk deploy -c` (repeatable)")
    preflight.add_argument("--cdk-dir", type=Path, default=Path(), metavar="DIR", help="where cdk.json is")


def _add_report(sub: Any, common: argparse.ArgumentParser) -> None:
    """`report`: one batch as a self-contained HTML file."""
    report = _command(
        sub,
        common,
        "report",
        commands.cmd_report,
        help="write a batch's report: one self-contained HTML file of charts",
        description="Read a batch from the ledger (status, export rows) and the results bucket, plus recorded "
        "events (--events), and write one HTML file with inline SVG charts (no server, no network to view it). "
        "Needs the `report` extra (matplotlib).",
    )
    _batch_argument(report)
    report.add_argument("-o", "--output", type=Path, metavar="FILE", help="HTML file (default: report-BATCH.html)")
    report.add_argument(
        "--events",
        type=Path,
        metavar="FILE",
        help="JSON Lines of the batch's event envelopes (result-to-event latency)",
    )


def _add_cost(sub: Any, common: argparse.ArgumentParser) -> None:
    """`cost` and `budget show|set`: what the experiment cost and the budget it is held to."""
    cost = _command(
        sub,
        common,
        "cost",
        commands.cmd_cost,
        help="what the experiment and its batches cost (AgentCore sessions and the pipeline's own AWS)",
        description="The experiment's spend (every ended session's cost, exact at its confirmed stop: what the "
        "budget is held to) and budget, then per batch: the sum its events carried, and its rollouts priced again "
        "now from the ledger (confirmed stops exact, pending stops to now). Prices and what is measured or "
        "estimated: docs/costs.md.",
    )
    cost.add_argument("--batch", metavar="ID", help="that batch only (default: the newest batches)")
    cost.add_argument("--limit", type=int, default=20, metavar="N", help="newest batches to list (default: 20)")
    cost.add_argument("--json", action="store_true", help="print JSON")

    budget = sub.add_parser(
        "budget",
        help="show or set the experiment's budget (USD): dispatch pauses when it is spent",
        description="At 80% of the budget a `Budget Warning` event; at 100% dispatch pauses (nothing new starts, "
        "queued rollouts wait, rollouts in flight finish) and a `Budget Exhausted` event says what waits. Raising "
        "the budget resumes dispatch where it stopped, within a minute.",
    )
    actions = budget.add_subparsers(dest="budget_command", metavar="ACTION", required=True)
    show = actions.add_parser("show", parents=[common], help="the budget and the spend")
    show.set_defaults(handler=commands.cmd_budget_show)
    setting = _command(
        actions, common, "set", commands.cmd_budget_set, help="set the budget (USD); a higher one resumes dispatch"
    )
    setting.add_argument("usd", type=float, help="the budget in US dollars")
    setting.add_argument("--batch", metavar="ID", help="set that batch's own budget instead of the experiment's")


def _add_operations(sub: Any, common: argparse.ArgumentParser) -> None:
    """`subscriptions list|prune` and `smoke`: operating a deployed experiment."""
    subscriptions = sub.add_parser(
        "subscriptions",
        help="list or prune the private event subscriptions (tap, ART) on the experiment bus",
        description="Private subscriptions (a rule on the experiment bus + an SQS queue) are made by `rollouts "
        "watch` and by each ART trainer process, and removed when they exit. A killed process leaves its own behind: "
        "it counts toward the bus's 300 rules and blocks `cdk destroy`. Prune them before destroying.",
    )
    actions = subscriptions.add_subparsers(dest="subscriptions_command", metavar="ACTION", required=True)
    listing = actions.add_parser("list", parents=[common], help="list them with owner and last-seen age")
    listing.set_defaults(handler=commands.cmd_subscriptions_list)
    prune = _command(
        actions,
        common,
        "prune",
        commands.cmd_subscriptions_prune,
        help="remove the stale ones (rule targets, rule, queue)",
        description="Remove the subscriptions not seen for --older-than (their owner refreshes them while it runs), "
        "and every half-removed one; rule targets first, then the rule, then the queue.",
    )
    prune.add_argument(
        "--older-than",
        type=commands.duration,
        default=commands.duration("24h"),
        metavar="AGE",
        help="e.g. 90m, 24h, 7d, or seconds (default: 24h; 0: every subscription, also live ones)",
    )
    prune.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    prune.add_argument(
        "--kind", action="append", choices=["tap", "sdk", "art", "smoke"], help="only this kind (repeatable)"
    )

    smoke = _command(
        sub,
        common,
        "smoke",
        commands.cmd_smoke,
        help="check a fresh deployment end to end: what only a real account can show (run after the first deploy)",
        description="Run a tiny batch from upload to `Batch Completed` and check, against the deployed stack, what "
        "only a real account shows: the S3 event's key encoding, a missing dataset key read as the ingest role (404, "
        "not 403), alarm delivery through the alarm topic, the AgentCore metric dimensions, the quota codes the "
        "account lists. One line per check (pass, fail or skipped, with what to do); everything it creates is "
        "removed. In local mode (--endpoint-url) the account-only checks are skipped.",
    )
    smoke.add_argument(
        "--timeout", type=float, default=600.0, metavar="S", help="give up a batch after S seconds (default: 600)"
    )
    smoke.add_argument("--rows", type=int, default=3, metavar="N", help="rows of the tiny batch (default: 3)")
    smoke.add_argument("--poll-wait", type=float, default=5.0, help=argparse.SUPPRESS)


def _register_modes(sub: Any, common: argparse.ArgumentParser) -> None:
    """The command groups of other modes (local mode's `rollouts local ...`), from their entry points."""
    from importlib.metadata import entry_points

    for entry in entry_points(group=COMMAND_GROUPS):
        entry.load()(sub, common)
