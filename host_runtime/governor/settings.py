"""The governor's settings (governor.toml): written by provisioning from box.toml's [power], read by
`everycycle governor run --settings`. Command-line options given explicitly win (make run, tests)."""

from __future__ import annotations

from dataclasses import dataclass

from host_runtime.common.service_user import SERVICE_USER
from host_runtime.common.settings_file import SettingsError

BACKENDS = ("auto", "nvml", "amdgpu", "simulator")
MODES = ("observe", "enforce")


@dataclass(frozen=True)
class GovernorSettings:
    backend: str = "auto"
    # observe: decide and publish, never touch a card (the default: an owner opts in to enforcing).
    mode: str = "observe"
    target_c: float = 75.0
    ceiling_c: float = 87.0
    safe_fraction: float = 0.5  # the fail-safe limit, this far from a card's minimum to its maximum

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise SettingsError("backend", f"must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.mode not in MODES:
            raise SettingsError("mode", f"must be observe or enforce, got {self.mode!r}")
        if not 30.0 <= self.target_c <= 95.0:
            raise SettingsError("target_c", f"must be between 30 and 95 C, got {self.target_c}")
        if not self.target_c < self.ceiling_c <= 105.0:
            raise SettingsError("ceiling_c", f"must be above target_c ({self.target_c}) and at most 105 C")
        if not 0.0 < self.safe_fraction <= 1.0:
            raise SettingsError("safe_fraction", f"must be above 0 and at most 1, got {self.safe_fraction}")


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
