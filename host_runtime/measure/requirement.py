"""box.toml's [requirement]: what the box or fleet must serve (one typed structure; the bundle's schema checks
the same fields at provisioning). `everycycle measure` reads it and reports the measured figures against it."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from host_runtime.common import settings_file
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
        for f in fields(self):   # types are settings_file's to check; this is the rule they do not know
            if getattr(self, f.name) <= 0:
                raise SettingsError(f.name, f"must be above 0, got {getattr(self, f.name)!r}")


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
    try:
        return settings_file.from_mapping(Requirement, section)
    except SettingsError as exc:   # named as box.toml names it
        raise SettingsError(f"requirement.{exc.field}", exc.message) from None
