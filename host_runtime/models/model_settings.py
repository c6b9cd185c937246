"""A model's own serving settings, kept in the store beside its manifest (ROOT/<name>/settings.toml), as
llama-server's presets or an Ollama Modelfile's parameters: they win over box.toml's [serving] wherever the model
is loaded (served from the start or on demand); a `serve` option given on the command line still wins over both.
0 or "" leaves a setting to [serving]."""

from __future__ import annotations

from dataclasses import dataclass

from host_runtime.common.settings_file import SettingsError
from host_runtime.engine.limits import (MAX_CONTEXT, MAX_MIB, MAX_PARALLEL, MIN_CONTEXT, MIN_KV_BUDGET_MIB,
                                       SPECULATION)

FILE = "settings.toml"


@dataclass(frozen=True)
class ModelSettings:
    context_length: int = 0   # tokens per sequence (at most what the model was trained for: the engine caps it)
    parallel: int = 0         # sequences at once
    kv_budget_mib: int = 0    # the KV cache's memory when the planner chooses the sequences
    speculation: str = ""     # off or ngram

    def __post_init__(self) -> None:
        # serving.toml's rules (serving/settings.py), 0 or "" meaning box.toml's
        if self.context_length and not MIN_CONTEXT <= self.context_length <= MAX_CONTEXT:
            raise SettingsError("context_length", f"must be between {MIN_CONTEXT} and {MAX_CONTEXT} (0: box.toml's)")
        if not 0 <= self.parallel <= MAX_PARALLEL:
            raise SettingsError("parallel", f"must be between 1 and {MAX_PARALLEL} (0: box.toml's)")
        if self.kv_budget_mib and not MIN_KV_BUDGET_MIB <= self.kv_budget_mib <= MAX_MIB:
            raise SettingsError("kv_budget_mib", f"must be between {MIN_KV_BUDGET_MIB} and {MAX_MIB} MiB "
                                                 "(0: box.toml's)")
        if self.speculation and self.speculation not in SPECULATION:
            raise SettingsError("speculation", f"must be one of {', '.join(SPECULATION)}, got {self.speculation!r}")

    def serve_options(self) -> dict:
        """The settings given, by the name of `serve`'s option each stands for."""
        given = {"ctx_size": self.context_length, "parallel": self.parallel, "kv_budget_mib": self.kv_budget_mib,
                 "speculation": self.speculation}
        return {name: value for name, value in given.items() if value}
