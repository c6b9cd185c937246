"""box.toml's [requirement]: what the box or fleet must serve (one typed structure; its rules are the ones
provisioning checks the bundle by: provisioning/box_model.py). `everycycle measure` reads it and reports the
measured figures against it."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import Field

from host_runtime.common import settings_file
from host_runtime.common.setting_rules import SettingsError, check_fields

BOX_TOML = "/etc/everycycle/box.toml"


# The rules box.toml's [requirement] shares (provisioning/box_model.py)
TtftP50 = Annotated[float, Field(gt=0, description="time to first token, median, seconds")]
TimePerToken = Annotated[float, Field(gt=0, description="between generated tokens, median, seconds")]
ConcurrentUsers = Annotated[int, Field(ge=1, le=1024)]
PromptTokens = Annotated[int, Field(ge=1, le=131072, description="a typical prompt")]
AnswerTokens = Annotated[int, Field(ge=1, le=32768, description="a typical answer")]


@dataclass(frozen=True)
class Requirement:
    ttft_p50_s: TtftP50 = 2.0
    time_per_token_s: TimePerToken = 0.1  # 10 tokens/s per user
    concurrent_users: ConcurrentUsers = 4
    prompt_tokens: PromptTokens = 512
    answer_tokens: AnswerTokens = 128

    def __post_init__(self) -> None:
        check_fields(self)


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
