"""A setting's rule, said once: a type annotated with pydantic's Field (bounds, a pattern, the allowed values, a
description). The service's settings class checks its fields by it, box.toml's model (provisioning/box_model.py)
takes the same type for the same field, and box.toml's JSON Schema is generated from that model, so the three
cannot disagree. Errors name the field and say the rule in words, as the hand-written checks did."""

from __future__ import annotations

import functools
import typing
from dataclasses import MISSING, fields
from typing import Annotated, Any, Literal

import annotated_types
import pydantic


class SettingsError(ValueError):
    """A settings value that cannot be used; names the field."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

TYPE_WORDS = {"int_type": "a whole number", "float_type": "a number", "string_type": "a string",
              "bool_type": "true or false", "list_type": "a list", "dict_type": "a table",
              "model_type": "a table", "literal_error": None}


def one_of(values) -> Any:
    """The type of a setting that takes one of `values` (a tuple of the owner's constants)."""
    return Literal[tuple(values)]


@functools.cache
def _adapter(hint) -> pydantic.TypeAdapter:
    return pydantic.TypeAdapter(hint)


def bounds(metadata) -> dict:
    found = {}
    for item in metadata:
        for constraint in getattr(item, "metadata", [item]):
            for kind in ("ge", "gt", "le", "lt"):
                if isinstance(constraint, getattr(annotated_types, kind.capitalize())):
                    found[kind] = getattr(constraint, kind)
    return found


def _number(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def range_words(bounds: dict) -> str:
    low = (f"at least {_number(bounds['ge'])}" if "ge" in bounds else
           f"above {_number(bounds['gt'])}" if "gt" in bounds else "")
    high = (f"at most {_number(bounds['le'])}" if "le" in bounds else
            f"below {_number(bounds['lt'])}" if "lt" in bounds else "")
    if "ge" in bounds and "le" in bounds:
        return f"between {_number(bounds['ge'])} and {_number(bounds['le'])}"
    return " and ".join(w for w in (low, high) if w)


def error_words(error: dict, metadata=(), description: str | None = None) -> str:
    """A pydantic error as the box's own words: what the setting must be, and what it was given."""
    kind, value = error["type"], error.get("input")
    if kind == "literal_error":
        allowed = error["ctx"]["expected"].replace("' or '", "', '")
        return f"must be one of {allowed}, got {value!r}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        found = bounds(metadata) or {kind.replace("greater_than_equal", "ge").replace("less_than_equal", "le")
                                       .replace("greater_than", "gt").replace("less_than", "lt"):
                                       next(iter(error["ctx"].values()))}
        return f"must be {range_words(found)}, got {value!r}"
    if kind == "string_pattern_mismatch":
        return f"{value!r} is not {description}" if description else f"{value!r} does not match {error['ctx']['pattern']}"
    if kind in ("too_short", "too_long"):
        ctx = error["ctx"]
        n = ctx.get("min_length", ctx.get("max_length"))
        if kind == "too_short" and n == 1:
            return "must not be empty"
        unit = "characters" if ctx.get("field_type") == "String" else "entries"
        return f"must have {'at least' if kind == 'too_short' else 'at most'} {n} {unit}"
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "unknown setting"
    if TYPE_WORDS.get(kind):
        return f"must be {TYPE_WORDS[kind]}, got {type(value).__name__}"
    return error["msg"]


def hint_parts(hint) -> tuple[Any, tuple, str | None]:
    """(base type, metadata, description) of an Annotated type (the type itself and nothing else otherwise)."""
    if typing.get_origin(hint) is not Annotated:
        return hint, (), None
    base, *metadata = typing.get_args(hint)
    description = next((m.description for m in metadata if isinstance(m, pydantic.fields.FieldInfo)
                        and m.description), None)
    return base, tuple(metadata), description


def check_value(name: str, hint, value) -> None:
    """`value` against the rule `hint` says; SettingsError(name, words) where it breaks it."""
    try:
        _adapter(hint).validate_python(value, strict=True)
    except pydantic.ValidationError as exc:
        _, metadata, description = hint_parts(hint)
        raise SettingsError(name, error_words(exc.errors()[0], metadata, description)) from None


@functools.cache
def _rules(cls) -> tuple[tuple[str, Any, Any], ...]:
    hints = typing.get_type_hints(cls, include_extras=True)
    return tuple((f.name, hints[f.name], f.default) for f in fields(cls)
                 if typing.get_origin(hints[f.name]) in (Annotated, Literal))


def check_fields(settings) -> None:
    """Every field of a settings dataclass whose type carries a rule, checked by it. A field at its default is
    not: a default such as 0 or "" means "not set, the service chooses", and is valid by definition."""
    for name, hint, default in _rules(type(settings)):
        value = getattr(settings, name)
        if default is not MISSING and type(value) is type(default) and value == default:
            continue
        check_value(name, hint, value)


def base_type(cls, name: str):
    """A settings field's plain type (int, float, str, bool, a Literal's str...), for settings_file's type check."""
    base = hint_parts(typing.get_type_hints(cls, include_extras=True)[name])[0]
    if typing.get_origin(base) is Literal:
        return type(typing.get_args(base)[0])
    return base
