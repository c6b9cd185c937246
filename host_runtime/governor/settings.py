"""The governor's settings (governor.toml): written by provisioning from box.toml's [power], read by
`everycycle governor run --settings`. Command-line options given explicitly win (make run, tests)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

from host_runtime.common.service_user import SERVICE_USER
from host_runtime.common.setting_rules import SettingsError, check_fields, one_of

BACKENDS = ("auto", "nvml", "amdgpu", "simulator")
MODES = ("observe", "enforce")
# The rules box.toml's [power] shares (provisioning/box_model.py)
Mode = Annotated[one_of(MODES), Field(description="observe (default): decide and publish limits; enforce: apply "
                                                  "them to the cards")]
TargetC = Annotated[float, Field(ge=30, le=95, description="the temperature the cards are held under, C")]
CeilingC = Annotated[float, Field(ge=40, le=105, description="the temperature the governor never lets a card reach, "
                                                            "C (above target_c)")]
SafeFraction = Annotated[float, Field(gt=0, le=1, description="the fail-safe limit, this far from a card's minimum "
                                                             "power limit to its maximum")]


@dataclass(frozen=True)
class GovernorSettings:
    backend: one_of(BACKENDS) = "auto"
    # observe: decide and publish, never touch a card (the default: an owner opts in to enforcing).
    mode: Mode = "observe"
    target_c: TargetC = 75.0
    ceiling_c: CeilingC = 87.0
    safe_fraction: SafeFraction = 0.5

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.target_c < self.ceiling_c:
            raise SettingsError("ceiling_c", f"must be above target_c ({self.target_c}), got {self.ceiling_c}")


def process_environment(settings: GovernorSettings) -> bytes:
    """governor.env, which systemd reads: the user the governor runs as. Root only to enforce (NVML's power-limit
    write needs it); the services' unprivileged user to observe. Fixed text, never a value from a bundle."""
    user = "root" if settings.mode == "enforce" else SERVICE_USER
    return f"EVERYCYCLE_GOVERNOR_USER={user}\n".encode()


def from_box(box: dict) -> GovernorSettings:
    """box.toml's [power] as the governor's settings; errors name the box.toml field."""
    power = box.get("power", {})
    defaults = GovernorSettings()
    try:
        return GovernorSettings(mode=power.get("mode", defaults.mode),
                                target_c=float(power.get("target_c", defaults.target_c)),
                                ceiling_c=float(power.get("ceiling_c", defaults.ceiling_c)),
                                safe_fraction=float(power.get("safe_fraction", defaults.safe_fraction)))
    except SettingsError as exc:
        raise SettingsError(f"power.{exc.field}", exc.message) from None
