"""The serving API's settings (serving.toml): written by provisioning from box.toml's [model], read by
`everycycle serve --settings`. Command-line options given explicitly win (make run, tests)."""

from __future__ import annotations

from dataclasses import dataclass

from host_runtime.common.settings_file import SettingsError

MAX_CONTEXT = 1 << 20


@dataclass(frozen=True)
class ServingSettings:
    model: str = ""            # a GGUF path; empty: the image's default model
    context_length: int = 0    # tokens per sequence; 0: the server's default
    quantization: str = ""     # what the owner asked for, checked against the model at provisioning

    def __post_init__(self) -> None:
        if self.model and not self.model.startswith("/"):
            raise SettingsError("model", f"must be an absolute path, got {self.model!r}")
        if not 0 <= self.context_length <= MAX_CONTEXT:
            raise SettingsError("context_length", f"must be between 1 and {MAX_CONTEXT} (0: the default)")
