"""JSON Schemas of the event details, generated from the pydantic models in `rollout_pipeline.contracts`.

`python -m rollout_pipeline.schemas` rewrites the `*.schema.json` files beside this module; a test fails when the
committed files drift from the models.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rollout_pipeline.contracts import DETAIL_MODELS, EVENT_SOURCE

SCHEMA_DIR = Path(__file__).parent


def schema_file_name(detail_type: str) -> str:
    return detail_type.lower().replace(" ", "-") + ".schema.json"


def generate() -> dict[str, dict[str, Any]]:
    """File name -> JSON Schema of the event detail, for every detail type."""
    schemas: dict[str, dict[str, Any]] = {}
    for detail_type, model in DETAIL_MODELS.items():
        schema = model.model_json_schema(mode="serialization")
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["$id"] = f"urn:{EVENT_SOURCE}:{schema_file_name(detail_type)}"
        schema["description"] = (
            f"Detail of the EventBridge event with source '{EVENT_SOURCE}' and detail-type '{detail_type}'. "
            + (model.__doc__ or "").strip()
        ).strip()
        schemas[schema_file_name(detail_type)] = schema
    return schemas


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write(directory: Path = SCHEMA_DIR) -> list[Path]:
    written = []
    for name, schema in generate().items():
        path = directory / name
        path.write_text(render(schema))
        written.append(path)
    return written


def load(detail_type: str) -> dict[str, Any]:
    """The committed schema of one detail type."""
    loaded: dict[str, Any] = json.loads((SCHEMA_DIR / schema_file_name(detail_type)).read_text())
    return loaded
