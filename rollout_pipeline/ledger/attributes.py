"""DynamoDB AttributeValues to and from plain Python values: the one codec every ledger module uses."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Final

#: The type tags of a DynamoDB AttributeValue.
TYPE_TAGS: Final = frozenset({"S", "N", "B", "BOOL", "NULL", "M", "L", "SS", "NS", "BS"})


def to_attribute_value(value: Any) -> dict[str, Any]:
    """A plain value as an AttributeValue (sets become string sets; floats keep their repr)."""
    if value is None:
        return {"NULL": True}
    if isinstance(value, bool):
        return {"BOOL": value}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, int | float | Decimal):
        return {"N": _num(value)}
    if isinstance(value, Mapping):
        return {"M": {str(k): to_attribute_value(v) for k, v in value.items()}}
    if isinstance(value, frozenset | set):
        return {"SS": sorted(str(v) for v in value)}
    if isinstance(value, list | tuple):
        return {"L": [to_attribute_value(v) for v in value]}
    raise TypeError(f"cannot store {type(value).__name__} in the ledger")


def _num(value: float | int | Decimal) -> str:
    if isinstance(value, float):
        return repr(value)
    return str(value)


def from_attribute_value(av: Mapping[str, Any]) -> Any:
    """An AttributeValue as a plain value (numbers: int when integral, else float; sets as sets)."""
    ((kind, value),) = av.items()
    if kind == "S":
        return value
    if kind == "N":
        text = str(value)
        return int(text) if text.lstrip("-").isdigit() else float(Decimal(text))
    if kind == "BOOL":
        return bool(value)
    if kind == "NULL":
        return None
    if kind == "M":
        return {k: from_attribute_value(v) for k, v in value.items()}
    if kind == "L":
        return [from_attribute_value(v) for v in value]
    if kind in ("SS", "NS"):
        return set(value)
    return value
