"""A service's settings file: one frozen dataclass per service, TOML on disk, written by provisioning (and
make run) and read by the service itself. Unknown keys and wrong types are refused naming the field; a missing
file means the defaults."""

from __future__ import annotations

import tomllib
from dataclasses import asdict, fields
from pathlib import Path
from typing import TypeVar

from host_runtime.common.atomic_file import atomic_write

T = TypeVar("T")
_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,)}


class SettingsError(ValueError):
    """A settings value that cannot be used; names the field."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def from_mapping(cls: type[T], doc: dict) -> T:
    known = {f.name: f for f in fields(cls)}
    values = {}
    for key, value in doc.items():
        if key not in known:
            raise SettingsError(key, "unknown setting")
        kind = str(known[key].type)
        allowed = _TYPES.get(kind)
        if allowed is not None:
            if (isinstance(value, bool) and kind != "bool") or not isinstance(value, allowed):
                raise SettingsError(key, f"must be {'a number' if kind == 'float' else 'an integer' if kind == 'int' else 'a ' + kind}")
            if kind == "float":
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
    import tomli_w

    return tomli_w.dumps(asdict(settings)).encode()


def save(settings, path: str | Path, mode: int = 0o644) -> None:
    atomic_write(Path(path), dump(settings), mode)
