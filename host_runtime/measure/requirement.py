"""box.toml's [requirement]: what the box or fleet must serve (one typed structure; the bundle's schema checks
the same fields at provisioning). `everycycle measure` reads it and reports the measured figures against it."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from host_runtime.common.settings_file import SettingsError

BOX_TOML = "/etc/everycycle/box.toml"


@dataclass(frozen=True)
class Requirement:
    ttft_p50_s: float = 2.0           # time to first token, median
    time_per_token_s: float = 0.1     # between generated tokens, median (10 tokens/s per user)
    concurrent_users: int = 4
    prompt_tokens: int = 512          # a typical prompt
    answer_tokens: int = 128          # a typical answer

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            kind = int if f.type in ("int", int) else (int, float)
            if isinstance(value, bool) or not isinstance(value, kind) or value <= 0:
                what = "a whole number" if kind is int else "a number"
                raise SettingsError(f"requirement.{f.name}", f"must be {what} above 0, got {value!r}")


def load(box_toml: str | Path | None) -> Requirement:
    """[requirement] from box.toml; the defaults when the file or the section is absent. SettingsError names
    the field at fault."""
    if box_toml is None or not Path(box_toml).exists():
        return Requirement()
    try:
        doc = tomllib.loads(Path(box_toml).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError("box.toml", str(exc)) from None
    section = doc.get("requirement", {})
    if not isinstance(section, dict):
        raise SettingsError("requirement", "must be a table")
    known = {f.name for f in fields(Requirement)}
    for name in section:
        if name not in known:
            raise SettingsError(f"requirement.{name}", f"is not a known field ({', '.join(sorted(known))})")
    return Requirement(**section)
