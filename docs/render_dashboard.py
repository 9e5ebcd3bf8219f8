"""Render the layout of an experiment's dashboard (docs/dashboard.png) from the synthesized dashboard body.

Offline (no AWS): synthesizes the stack, resolves the body's CloudFormation tokens to placeholders, and draws each
widget at its grid position with its title and the metrics it plots (no data: CloudWatch draws those).
Run: `PYTHONPATH=. .venv/bin/python docs/render_dashboard.py [out.png]` (needs matplotlib).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from tests.infra.conftest import synthesize

GRID_WIDTH = 24


def resolve(value: Any) -> str:
    """A Fn::Join body with Refs/GetAtts as readable placeholders."""
    if isinstance(value, str):
        return value
    if "Fn::Join" in value:
        sep, parts = value["Fn::Join"]
        return str(sep).join(resolve(part) for part in parts)
    if "Ref" in value:
        return {"AWS::Region": "us-west-2"}.get(value["Ref"], f"<{value['Ref']}>")
    if "Fn::GetAtt" in value:
        return f"<{value['Fn::GetAtt'][0]}>"
    return json.dumps(value)


def series(properties: dict[str, Any]) -> list[str]:
    labels = []
    for metric in properties.get("metrics", []):
        options = metric[-1] if metric and isinstance(metric[-1], dict) else {}
        label = options.get("label") or (metric[1] if len(metric) > 1 and isinstance(metric[1], str) else "")
        if options.get("visible", True) is not False and label:
            labels.append(label)
    return labels


def main(out: Path) -> None:
    synthesized = synthesize(Path(tempfile.mkdtemp()))
    (dashboard,) = synthesized.of_type("AWS::CloudWatch::Dashboard").values()
    body = json.loads(resolve(dashboard["Properties"]["DashboardBody"]))
    widgets = body["widgets"]
    height = max(w["y"] + w["height"] for w in widgets)
    fig, ax = plt.subplots(figsize=(16, height * 0.55))
    ax.set_xlim(0, GRID_WIDTH)
    ax.set_ylim(height, 0)
    ax.axis("off")
    for widget in widgets:
        x, y, w, h = widget["x"], widget["y"], widget["width"], widget["height"]
        ax.add_patch(Rectangle((x + 0.1, y + 0.1), w - 0.2, h - 0.2, facecolor="#f7f9fb", edgecolor="#8a9aa9"))
        props = widget.get("properties", {})
        title = props.get("title") or props.get("markdown", "").lstrip("# ")
        ax.text(x + 0.4, y + 0.7, title, fontsize=10, fontweight="bold", va="center")
        labels = series(props) if widget["type"] == "metric" else [a.split(":")[-1] for a in props.get("alarms", [])]
        annotations = [a.get("label", "") for a in props.get("annotations", {}).get("horizontal", [])]
        lines = labels[:9] + [f"--- {a}" for a in annotations if a]
        for i, label in enumerate(lines):
            ax.text(x + 0.6, y + 1.5 + i * 0.5, label[:60], fontsize=8, color="#33475b", va="center")
    fig.suptitle(f"Dashboard {dashboard['Properties']['DashboardName']} (layout and series; data drawn by CloudWatch)")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    print(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("dashboard.png"))
