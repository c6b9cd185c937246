"""A setting's rule, said once: a type annotated with pydantic's Field (bounds, a pattern, the allowed values, a
description). The service's settings class checks its fields by it, box.toml's model (provisioning/box_model.py)
takes the same type for the same field, and box.toml's JSON Schema is generated from that model, so the three
cannot disagree. Errors name the field and say the rule in words, as the hand-written checks did."""

from __future__ import annotations

import functools
import typing
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Annotated, Any, Literal

import annotated_types
import pydantic
from host_runtime.common.errors import InputError


class SettingsError(InputError, ValueError):
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
def adapter(hint) -> pydantic.TypeAdapter:
    """pydantic's validator for a type, made once (making one costs far more than using it)."""
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


BOUND_ERRORS = {"greater_than_equal": "ge", "greater_than": "gt", "less_than_equal": "le", "less_than": "lt"}
LENGTH_ERRORS = ("too_short", "too_long", "string_too_short", "string_too_long")


def bound_words(error: dict, metadata=()) -> str:
    """A broken bound as the whole rule ("between 0 and 2"): the type's bounds where it has them, else the one
    pydantic names."""
    return range_words(bounds(metadata) or {BOUND_ERRORS[error["type"]]: next(iter(error["ctx"].values()))})


def length_words(error: dict, items: str) -> str:
    """A list or a text of the wrong length: "must not be empty", "must have at most 4 <items>"."""
    kind, ctx = error["type"], error["ctx"]
    n = ctx.get("min_length", ctx.get("max_length"))
    if kind.endswith("too_short") and n == 1:
        return "must not be empty"
    unit = "characters" if kind.startswith("string") else items
    return f"must have {'at least' if kind.endswith('too_short') else 'at most'} {n} {unit}"


def error_words(error: dict, metadata=(), description: str | None = None) -> str:
    """A pydantic error as the box's own words: what the setting must be, and what it was given."""
    kind, value = error["type"], error.get("input")
    if kind == "literal_error":
        allowed = error["ctx"]["expected"].replace("' or '", "', '")
        return f"must be one of {allowed}, got {value!r}"
    if kind in BOUND_ERRORS:
        return f"must be {bound_words(error, metadata)}, got {value!r}"
    if kind == "string_pattern_mismatch":
        return f"{value!r} is not {description}" if description else f"{value!r} does not match {error['ctx']['pattern']}"
    if kind in LENGTH_ERRORS:
        return length_words(error, "entries")
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
        adapter(hint).validate_python(value, strict=True)
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


def setting(unset, *, description: str, default=None, flag: str | None = None, flag_details: str = "",
            flag_also: tuple = (), box: bool = True) -> Any:
    """A settings dataclass field said once. `unset`: its value where the file gives none; `default`: what the
    service then uses (None: it decides at start, as `description` says; a real value as `unset`, 75.0, is its own
    default); `description`: box.toml's schema words and the flag's help; `flag`: the command-line option that
    gives it (serve --ctx-size), with `flag_details` added to its help and `flag_also` values only the command
    line takes; `box`: whether box.toml says it too (its table's model is made from these)."""
    if default is None and not isinstance(unset, bool | dict | list) and unset not in (0, ""):
        default = unset
    metadata = {"description": description, "default": default, "flag": flag, "flag_details": flag_details,
                "flag_also": tuple(flag_also), "box": box}
    if isinstance(unset, dict | list):  # a fresh empty table or list for each instance
        return field(default_factory=type(unset), metadata=metadata)
    return field(default=unset, metadata=metadata)


@dataclass(frozen=True)
class Tunable:
    """One field declared with `setting`: what the flags, the file's reader and box.toml's model are made from."""
    name: str
    hint: Any
    unset: Any
    description: str
    default: Any
    flag: str | None
    flag_details: str
    flag_also: tuple
    box: bool

    @property
    def dest(self) -> str:
        """The flag's attribute on argparse's namespace (--ctx-size: ctx_size); the field's name without a flag."""
        return self.flag.lstrip("-").replace("-", "_") if self.flag else self.name

    @property
    def described(self) -> str:
        """The description with the service's default, as box.toml's schema and the flag's help say it."""
        default = _number(self.default) if isinstance(self.default, int | float) else self.default
        if "{default}" in self.description:
            return self.description.format(default=default)
        return f"{self.description} (default {default})" if self.default is not None else self.description


def _unset(f) -> Any:
    return f.default_factory() if f.default is MISSING else f.default


@functools.cache
def tunables(cls) -> tuple[Tunable, ...]:
    """The fields of a settings dataclass declared with `setting`, in their order."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return tuple(Tunable(f.name, hints[f.name], _unset(f),
                         f.metadata["description"], f.metadata["default"],
                         f.metadata["flag"], f.metadata["flag_details"], f.metadata["flag_also"], f.metadata["box"])
                 for f in fields(cls) if "description" in f.metadata)


def _as_toml_gives(tunable: Tunable, value):
    """TOML's whole number where a setting takes a number (target_c = 80), or a duration's text (keep_alive = 90)."""
    base = hint_parts(tunable.hint)[0]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value) if base is float else str(value) if base is str else value
    return value


def from_table(cls, table: dict, where: str, onto=None):
    """A box.toml table as a settings class (or onto settings already made, `onto`): the fields declared with
    `setting` and box=True, checked by the class; errors name box.toml's field ("power.target_c")."""
    values = {t.name: _as_toml_gives(t, table[t.name]) for t in tunables(cls) if t.box and t.name in table}
    try:
        return replace(onto, **values) if onto is not None else cls(**values)
    except SettingsError as exc:
        raise SettingsError(f"{where}.{exc.field}", exc.message) from None
