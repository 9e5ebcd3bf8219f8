"""DynamoDB AttributeValues to and from plain Python values: the one codec every ledger module uses.

The table gateway (`ledger.table`) hands the ledger modules items as the low-level client returns them (typed:
`{"N": "3"}`); each module parses them once, with `item_values`, into its typed views (`ledger.items`). Nothing
outside the ledger sees a raw item."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from decimal import Context, Decimal
from typing import Any, Final, TypeVar

_View = TypeVar("_View")


def to_attribute_value(value: Any) -> dict[str, Any]:
    """A plain value as an AttributeValue (sets become string sets; numbers as `number_text`)."""
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


def text_value(text: str) -> dict[str, str]:
    """A string as an AttributeValue (the typed form items are built in)."""
    return {"S": text}


def int_value(number: int) -> dict[str, str]:
    """An integer as an AttributeValue."""
    return {"N": str(number)}


#: DynamoDB numbers: at most 38 significant digits, magnitude between 1E-130 and 9.99...E+125.
NUMBER_DIGITS: Final = 38
_NUMBER_CONTEXT: Final = Context(prec=NUMBER_DIGITS)
_MIN_MAGNITUDE: Final = Decimal("1E-130")
_MAX_MAGNITUDE: Final = Decimal("1E+126")


def number_text(value: float | int | Decimal) -> str:
    """A number as DynamoDB's `N` text in positional notation (never `1e-06`: moto and DynamoDB Local reject
    exponents in some expressions), rounded to 38 significant digits; magnitudes below 1E-130 become 0.
    Raises ValueError for NaN, infinities and magnitudes DynamoDB cannot store."""
    number = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    if not number.is_finite():
        raise ValueError(f"{value!r} is not a finite number")
    if number == 0 or abs(number) < _MIN_MAGNITUDE:
        return "0"
    if abs(number) >= _MAX_MAGNITUDE:
        raise ValueError(f"{value!r} is beyond DynamoDB's number range (1E+126)")
    return format(number.normalize(_NUMBER_CONTEXT), "f")


def _num(value: float | int | Decimal) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return number_text(value)


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


def plain_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """Plain Python values as AttributeValues (`to_attribute_value`), by name: an expression's values, an item."""
    return {name: to_attribute_value(value) for name, value in values.items()}


def item_values(item: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """A typed item (as GetItem, Query and UpdateItem return it) as plain Python values (`from_attribute_value`):
    the one converter from the table's form to the views' input."""
    return {name: from_attribute_value(value) for name, value in item.items()}


def int_at(item: Mapping[str, Any], name: str) -> int:
    """Attribute `name` of a plain-valued item (`item_values`) as an int; 0 when absent."""
    value = item.get(name)
    return int(value) if value is not None else 0


def float_at(item: Mapping[str, Any], name: str) -> float:
    """Attribute `name` of a plain-valued item as a float; 0.0 when absent."""
    value = item.get(name)
    return float(value) if value is not None else 0.0


def optional_float_at(item: Mapping[str, Any], name: str) -> float | None:
    """Attribute `name` of a plain-valued item as a float; None when absent."""
    value = item.get(name)
    return None if value is None else float(value)


def text_at(item: Mapping[str, Any], name: str) -> str | None:
    """Attribute `name` of a plain-valued item as text; None when absent."""
    value = item.get(name)
    return None if value is None else str(value)


def view_of(cls: type[_View], item: Mapping[str, Any], **given: Any) -> _View:
    """Dataclass `cls` from a plain-valued item: each field the item holds (not None) as its annotated type (`str`,
    `int`, `bool`, else float; `X | None` as `X`), the others at their defaults, `given` as given."""
    kinds = {"str": str, "str | None": str, "int": int, "bool": bool}
    held = [f for f in fields(cls) if f.name not in given and item.get(f.name) is not None]  # type: ignore[arg-type]
    return cls(**{f.name: kinds.get(str(f.type), float)(item[f.name]) for f in held}, **given)
