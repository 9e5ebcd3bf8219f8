"""Render a `ReportData` as one self-contained HTML file: inline CSS and inline SVG charts, no script, no network.

Charts are drawn with matplotlib's SVG backend (text kept as text, so the file is searchable and small). Each chart
is a `<section class="chart" id="chart-NAME" data-points="N">`, N = how many data points it was drawn from (0 = the
batch has none of that kind: a note says so instead of an empty plot).
"""

from __future__ import annotations

import html
import io
import random
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from rollout_pipeline.report import data as series
from rollout_pipeline.report.data import ReportData

PALETTE: Final = {"queued": "#9aa5b1", "in_flight": "#f0a202", "done": "#2b8a3e", "accent": "#3b5bdb", "bad": "#c92a2a"}
#: Rollouts that ended on a later attempt (a retry after a timeout).
RETRIED: Final = "#e8590c"
_FIGSIZE: Final = (6.0, 2.8)
#: Charts that span the page's width are drawn twice as wide, so their text renders at the same size.
_WIDE: Final = (12.4, 3.0)
_METADATA: Final = re.compile(r"<metadata>.*?</metadata>\s*", re.DOTALL)


@dataclass(frozen=True)
class Chart:
    """One chart of the report."""

    name: str
    title: str
    caption: str
    points: int
    svg: str  # empty when there is nothing to draw


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("svg")
    matplotlib.rcParams.update(
        {
            "svg.fonttype": "none",  # text stays text
            "svg.hashsalt": "rollouts-report",  # stable ids: the same data gives the same file
            "font.size": 9,
            "font.family": "sans-serif",
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.grid": True,
            "grid.alpha": 0.25,
        }
    )
    import matplotlib.pyplot as plt

    return plt


def _svg(draw: Callable[[Any], None], figsize: tuple[float, float] = _FIGSIZE) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=figsize, layout="constrained")
    try:
        draw(ax)
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    finally:
        plt.close(fig)
    text = buffer.getvalue()
    # Drop the XML prolog, doctype and RDF metadata: the SVG sits inside HTML.
    return _METADATA.sub("", text[text.index("<svg") :])


def _integer_ticks(axis: Any) -> None:
    """Counts get whole-number ticks (no "0.25 rollouts")."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def _hist(values: Sequence[float], xlabel: str, color: str, bins: int | list[float] = 20) -> Callable[[Any], None]:
    def draw(ax: Any) -> None:
        ax.hist(values, bins=bins, color=color, edgecolor="white")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("rollouts")
        _integer_ticks(ax.yaxis)
        median = statistics.median(values)
        ax.axvline(median, color="#212529", linestyle="--", linewidth=1)
        label = f"{median:,.0f}" if abs(median) >= 100 else f"{median:.3g}"
        ax.annotate(f"median {label}", (median, 1), xycoords=("data", "axes fraction"), xytext=(4, -10),
                    textcoords="offset points", fontsize=8)  # fmt: skip

    return draw


def _timeline_chart(data: ReportData) -> Chart:
    line = series.timeline(data)

    def draw(ax: Any) -> None:
        for name, values in (("queued", line.queued), ("in flight", line.in_flight), ("done", line.done)):
            ax.step(line.t, values, where="post", label=name, color=PALETTE[name.replace(" ", "_")], linewidth=1.6)
        ax.set_xlabel("seconds since the batch was created")
        ax.set_ylabel("rollouts")
        _integer_ticks(ax.yaxis)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)

    total = len(data.rows)
    return Chart(
        "timeline",
        "Rollouts over time",
        f"{total} rollouts: queued (submitted, not yet dispatched), in flight (dispatched, no result yet), done.",
        len(line.t),
        _svg(draw, _WIDE) if line.t else "",
    )


def _latency_chart(data: ReportData) -> Chart:
    values = series.notify_latencies_ms(data)
    caption = (
        f"Result written to event published, {len(values)} rollout events (p50 {statistics.median(values):.0f} ms, "
        f"max {max(values):.0f} ms)."
        if values
        else "No events were recorded for this batch (pass --events FILE with the event envelopes)."
    )
    svg = _svg(_hist(values, "milliseconds", PALETTE["accent"])) if values else ""
    return Chart("latency", "Result-to-event latency", caption, len(values), svg)


def _duration_chart(data: ReportData) -> Chart:
    values = series.durations_s(data)
    caption = (
        f"Dispatch to result, {len(values)} rollouts (p50 {statistics.median(values):.1f} s, max {max(values):.1f} s)."
        if values
        else "No rollout has both a dispatch and a finish time."
    )
    return Chart(
        "duration",
        "Rollout duration",
        caption,
        len(values),
        _svg(_hist(values, "seconds", "#5f3dc4")) if values else "",
    )


def _reward_chart(data: ReportData) -> Chart:
    values = [v for group in series.rewards_by_group(data).values() for v in group]
    if not values:
        return Chart("rewards", "Reward distribution", "No rollout succeeded: no rewards.", 0, "")
    mean = statistics.fmean(values)
    low, high = min(values), max(values)
    bins: int | list[float] = 20 if high > low else [low - 0.5, low + 0.5]
    caption = f"{len(values)} rewards, mean {mean:.3f}, min {low:.3g}, max {high:.3g}."
    return Chart("rewards", "Reward distribution", caption, len(values), _svg(_hist(values, "reward", "#1971c2", bins)))


def _group_chart(data: ReportData) -> Chart:
    groups = series.rewards_by_group(data)
    varied, scored = series.groups_with_signal(groups)
    points = sum(len(v) for v in groups.values())
    if not points:
        return Chart("groups", "Reward per group", "No rewards.", 0, "")
    names = list(groups)
    jitter = random.Random(0)

    def draw(ax: Any) -> None:
        for x, name in enumerate(names):
            values = groups[name]
            if not values:
                continue
            spread = series.has_signal(values)
            color = PALETTE["accent"] if spread else PALETTE["queued"]
            ax.scatter([x + jitter.uniform(-0.15, 0.15) for _ in values], values, s=18, color=color, alpha=0.8)
            ax.hlines(statistics.fmean(values), x - 0.3, x + 0.3, color="#212529", linewidth=1.5)
        ax.set_xticks(range(len(names)), names, rotation=45 if len(names) > 8 else 0, ha="right" if len(names) > 8
                      else "center", fontsize=7 if len(names) > 8 else 8)  # fmt: skip
        ax.set_ylabel("reward")
        ax.set_xlabel("group (input id); bar = mean, grey = every reward equal (no GRPO signal)")

    width = max(_WIDE[0], 0.3 * len(names))
    caption = (
        f"{scored} groups; {varied} of them ({100 * varied / max(1, scored):.0f}%) have rewards that differ, so "
        "non-zero GRPO advantages."
    )
    return Chart("groups", "Reward per group", caption, points, _svg(draw, (width, _WIDE[1])))


def _bar_chart(
    name: str, title: str, counts: dict[str, int], *, color: str | list[str], caption: str, empty: str
) -> Chart:
    """Horizontal bars of `counts`, in one `color` or one per bar."""
    if not counts:
        return Chart(name, title, empty, 0, "")
    labels = list(counts)

    def draw(ax: Any) -> None:
        bars = ax.barh(labels, [counts[k] for k in labels], color=color)
        ax.bar_label(bars, padding=3)
        ax.set_xlabel("rollouts")
        _integer_ticks(ax.xaxis)
        ax.invert_yaxis()

    height = max(1.6, 0.45 * len(labels) + 0.9)
    return Chart(name, title, caption, sum(counts.values()), _svg(draw, (6.0, height)))


def _failure_chart(data: ReportData) -> Chart:
    counts = series.failures_by_reason(data)
    total = sum(counts.values())
    return _bar_chart(
        "failures",
        "Failures by reason",
        counts,
        color=PALETTE["bad"],
        caption=f"{total} of {len(data.rows)} rollouts failed.",
        empty=f"No rollout failed ({len(data.rows)} rollouts).",
    )


def _retry_chart(data: ReportData) -> Chart:
    by_attempt = series.attempts(data)
    counts = {(f"ended on attempt {k}" if k else "never started"): v for k, v in by_attempt.items()}
    # Healthy first attempts in the colour of done work, retries in orange, what never ran or kept being throttled red.
    colors = [PALETTE["done"] if k == 1 else RETRIED if k > 1 else PALETTE["bad"] for k in by_attempt]
    throttled = series.throttled(data)
    if throttled:
        counts["failed: ACR kept throttling"] = throttled
        colors.append(PALETTE["bad"])
    retried = sum(v for k, v in by_attempt.items() if k > 1)
    caption = (
        f"{retried} rollouts were retried (attempt > 1, after a timeout); {throttled} failed because ACR kept "
        "throttling their start. Throttles retried inside one dispatch are CloudWatch metrics, not ledger data."
    )
    return _bar_chart(
        "retries", "Throttles and retries", counts, color=colors, caption=caption, empty="No rollout ended yet."
    )


def _sessions_chart(data: ReportData) -> Chart:
    line = series.timeline(data)
    limit = data.max_sessions

    def draw(ax: Any) -> None:
        ax.step(line.t, line.in_flight, where="post", color=PALETTE["in_flight"], linewidth=1.6, label="in flight")
        ax.fill_between(line.t, line.in_flight, step="post", color=PALETTE["in_flight"], alpha=0.2)
        if limit:
            ax.axhline(limit, color=PALETTE["bad"], linestyle="--", linewidth=1.2, label=f"limit ({limit})")
        ax.set_ylim(0, max([*line.in_flight, limit or 0]) * 1.15 + 0.5)
        ax.set_xlabel("seconds since the batch was created")
        ax.set_ylabel("sessions")
        _integer_ticks(ax.yaxis)
        ax.legend(loc="upper right", frameon=False)

    peak = max(line.in_flight, default=0)
    caption = f"Peak {peak} sessions in flight" + (f" of a limit of {limit}." if limit else ".")
    warm = series.warm_starts(data)
    if warm:
        caption += f" {warm} of {len(data.rows)} rollouts started in a warm session of the warm pool."
    return Chart("sessions", "Sessions in flight vs the limit", caption, len(line.t), _svg(draw) if line.t else "")


def _cost_chart(data: ReportData) -> Chart:
    found = series.costs(data)
    if not found.t:
        return Chart(
            "cost", "Cost", "No rollout of this batch carries a cost (it ended before costs were kept).", 0, ""
        )

    def draw(ax: Any) -> None:
        memory_cpu = [m + c for m, c in zip(found.memory, found.cpu, strict=True)]
        total = [mc + p for mc, p in zip(memory_cpu, found.pipeline, strict=True)]
        ax.fill_between(found.t, found.memory, step="post", color="#1971c2", alpha=0.6, label="AgentCore memory")
        ax.fill_between(found.t, found.memory, memory_cpu, step="post", color="#f0a202", alpha=0.6,
                        label="AgentCore CPU")  # fmt: skip
        ax.fill_between(found.t, memory_cpu, total, step="post", color="#2b8a3e", alpha=0.6, label="pipeline AWS")
        ax.step(found.t, total, where="post", color="#212529", linewidth=1.2)
        ax.set_xlabel("seconds since the batch was created (rollouts priced as they ended)")
        ax.set_ylabel("USD, cumulative")
        ax.legend(loc="upper left", frameon=False)

    n = len(found.per_rollout)
    caption = (
        f"${found.total:.6f} for {n} rollouts (median ${statistics.median(found.per_rollout):.6f} each); memory "
        f"${found.memory[-1]:.6f}, CPU ${found.cpu[-1]:.6f} (measured for {found.cpu_measured} of {n}, bounded for "
        f"the rest), pipeline ${found.pipeline[-1]:.6f}. As published: each session's end estimated at its event; "
        f"rollouts cost prints the exact figure. {found.priced_as}."
    )
    return Chart("cost", "Cost", caption, n, _svg(draw, _WIDE))


CHARTS: Final = (
    _timeline_chart,
    _sessions_chart,
    _reward_chart,
    _group_chart,
    _duration_chart,
    _latency_chart,
    _failure_chart,
    _retry_chart,
    _cost_chart,
)

_CSS: Final = """
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:0;background:#f8f9fa;color:#212529}
header{background:#212529;color:#f8f9fa;padding:18px 28px}
header h1{margin:0;font-size:20px}header p{margin:4px 0 0;color:#adb5bd;font-size:13px}
main{padding:18px 28px;max-width:1220px}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin-bottom:16px}
.card{background:#fff;border:1px solid #dee2e6;border-radius:6px;padding:8px 14px;min-width:110px}
.card b{display:block;font-size:20px}.card span{font-size:12px;color:#495057}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:14px}
.chart{background:#fff;border:1px solid #dee2e6;border-radius:6px;padding:10px 14px}
.chart.wide{grid-column:1/-1}
.chart h2{font-size:15px;margin:0 0 2px}.chart p{font-size:12px;color:#495057;margin:0 0 6px}
.chart svg{width:100%;height:auto}.empty{color:#868e96;font-style:italic}
footer{font-size:11px;color:#868e96;padding:0 28px 18px}
"""


def _cards(data: ReportData) -> str:
    status = data.status
    groups = series.rewards_by_group(data)
    varied, scored = series.groups_with_signal(groups)
    mean = status.get("reward_mean")
    durations = series.durations_s(data)
    line = series.timeline(data)
    items = [
        ("rollouts", str(status.get("rollouts_total") if status.get("rollouts_total") is not None else len(data.rows))),
        ("succeeded", str(status.get("succeeded", 0))),
        ("failed", str(status.get("failed", 0))),
        ("reward mean", "n/a" if mean is None else f"{mean:.3f}"),
        ("groups with signal", f"{varied}/{scored}"),
        ("batch duration", _batch_duration(data, line)),
        ("p50 duration", f"{statistics.median(durations):.1f} s" if durations else "n/a"),
        ("cost (USD)", f"{series.costs(data).total:.4f}" if series.costs(data).t else "n/a"),
        ("model replies cut, empty or failed", str(series.model_warnings(data))),
    ]
    return "".join(f'<div class="card"><b>{html.escape(v)}</b><span>{html.escape(k)}</span></div>' for k, v in items)


def _batch_duration(data: ReportData, line: series.Timeline) -> str:
    """Creation to completion (as `Batch Completed` says); while the batch runs, up to its last finished rollout."""
    duration = series.batch_duration(data)
    if duration is not None:
        return f"{duration:.1f} s"
    return f"{line.t[-1]:.0f} s so far" if line.t else "n/a"


def render(data: ReportData) -> str:
    """The report as one HTML document (no external resources)."""
    charts = [build(data) for build in CHARTS]
    sections = []
    for chart in charts:
        body = chart.svg or f'<p class="empty">{html.escape(chart.caption)}</p>'
        caption = f"<p>{html.escape(chart.caption)}</p>" if chart.svg else ""
        wide = " wide" if chart.name in {"timeline", "groups", "cost"} else ""
        sections.append(
            f'<section class="chart{wide}" id="chart-{chart.name}" data-points="{chart.points}">'
            f"<h2>{html.escape(chart.title)}</h2>{caption}{body}</section>"
        )
    status = data.status
    subtitle = (
        f"experiment {data.experiment} · status {status.get('status')}"
        f"{', done' if status.get('done') and status.get('status') != 'completed' else ''}"
        f" · created {status.get('created_at') or '?'}"
        f" · completed {status.get('completed_at') or '-'} · source {status.get('source') or '-'}"
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f"<title>Batch {html.escape(data.batch_id)}</title><style>{_CSS}</style></head><body>"
        f"<header><h1>Batch {html.escape(data.batch_id)}</h1><p>{html.escape(subtitle)}</p></header>"
        f'<main><div class="cards">{_cards(data)}</div><div class="grid">{"".join(sections)}</div></main>'
        f"<footer>Generated {html.escape(data.generated_at)} by rollouts report from the ledger, "
        f"{len(data.rows)} export rows and {len(data.events)} recorded events.</footer>"
        "</body></html>\n"
    )
