"""A service's settings file: one frozen dataclass per service, TOML on disk, written by provisioning (and
make run) and read by the service itself. Unknown keys and wrong types are refused naming the field; a missing
file means the defaults."""

from __future__ import annotations

import tomllib
from dataclasses import asdict, fields
from pathlib import Path
from typing import TypeVar

import tomli_w

from host_runtime.common.atomic_file import atomic_write
from host_runtime.common.setting_rules import SettingsError, base_type

__all__ = ["SettingsError", "from_mapping", "load", "dump", "save"]

T = TypeVar("T")
_TYPES = {int: (int,), float: (int, float), str: (str,), bool: (bool,)}
_WORDS = {int: "an integer", float: "a number", str: "a str", bool: "a bool"}


def from_mapping(cls: type[T], doc: dict) -> T:
    known = {f.name: f for f in fields(cls)}
    values = {}
    for key, value in doc.items():
        if key not in known:
            raise SettingsError(key, "unknown setting")
        kind = base_type(cls, key)
        allowed = _TYPES.get(kind)
        if allowed is not None:
            if (isinstance(value, bool) and kind is not bool) or not isinstance(value, allowed):
                raise SettingsError(key, f"must be {_WORDS[kind]}")
            if kind is float:
                value = float(value)
        values[key] = value
    return cls(**values)


def load(cls: type[T], path: str | Path | None) -> T:
    """The settings in `path`; the defaults where there is no file."""
    if path is None or not Path(path).exists():
        return cls()
    try:
        doc = tomllib.loads(Path(path).read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SettingsError("(file)", f"{path} is not valid TOML: {exc}") from None
    return from_mapping(cls, doc)


def dump(settings) -> bytes:
    return tomli_w.dumps(asdict(settings)).encode()


def save(settings, path: str | Path, mode: int = 0o644) -> None:
    atomic_write(Path(path), dump(settings), mode)
