"""The governor's settings (governor.toml): written by provisioning from box.toml's [power], read by
`everycycle governor run --settings`. Command-line options given explicitly win (make run, tests)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

from host_runtime.common.service_user import SERVICE_USER
from host_runtime.governor.control import PowerPolicy
from host_runtime.common.setting_rules import SettingsError, check_fields, from_table, one_of, setting

BACKENDS = ("auto", "nvml", "amdgpu", "simulator")
MODES = ("observe", "enforce")
# Each setting's rule, words and default said once: governor run's flags, box.toml's [power] (provisioning/box_model.py)
# and from_box are made from these declarations.
Backend = one_of(BACKENDS)
Mode = one_of(MODES)  # box.toml's [power] mode takes this same type
TargetC = Annotated[float, Field(ge=30, le=95)]
CeilingC = Annotated[float, Field(ge=40, le=105)]
SafeFraction = Annotated[float, Field(gt=0, le=1)]


@dataclass(frozen=True)
class GovernorSettings:
    backend: Backend = setting(
        "auto", flag="--backend", box=False,
        description="where temperatures come from and limits go (auto: nvml, else amdgpu, else no GPU to govern; "
                    "simulator: simulated GPUs, for demos and tests)")
    # observe: decide and publish, never touch a card (the default: an owner opts in to enforcing).
    mode: Mode = setting("observe", flag="--mode",
                                  description="observe: decide and publish limits, never change a card; enforce: "
                                              "apply them to the cards",
                                  flag_details="; without --settings the simulator's default is enforce")
    # the defaults are the control loop's own (governor/control.py PowerPolicy)
    target_c: TargetC = setting(PowerPolicy.target_c, flag="--target",
                                description="the temperature the cards are held under, C")
    ceiling_c: CeilingC = setting(PowerPolicy.ceiling_c,
                                  description="the temperature the governor never lets a card reach, above target_c, C")
    safe_fraction: SafeFraction = setting(PowerPolicy.safe_fraction,
                                          description="the fail-safe limit, this far from a card's minimum power limit "
                                                      "to its maximum")

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
    return from_table(GovernorSettings, box.get("power", {}), "power")
