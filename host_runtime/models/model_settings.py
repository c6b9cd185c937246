"""A model's own serving settings, kept in the store beside its manifest (ROOT/<name>/settings.toml), as
llama-server's presets or an Ollama Modelfile's parameters: they win over box.toml's [serving] wherever the model
is loaded (served from the start or on demand); a `serve` option given on the command line still wins over both.
0 or "" leaves a setting to [serving]."""

from __future__ import annotations

from dataclasses import dataclass

from host_runtime.common.setting_rules import check_fields
from host_runtime.engine.setting_types import ContextLength, KvBudgetMib, Parallel, Speculation

FILE = "settings.toml"


@dataclass(frozen=True)
class ModelSettings:
    # serving.toml's rules, by the same types (engine/setting_types.py); 0 or "" leaves a setting to box.toml's
    context_length: ContextLength = 0  # tokens per sequence (at most what the model was trained for: the engine caps it)
    parallel: Parallel = 0             # sequences at once
    kv_budget_mib: KvBudgetMib = 0     # the KV cache's memory when the planner chooses the sequences
    speculation: Speculation = ""  # off or ngram ("": unset, which the rule is not asked about)

    def __post_init__(self) -> None:
        check_fields(self)

    def serve_options(self) -> dict:
        """The settings given, by the name of `serve`'s option each stands for."""
        given = {"ctx_size": self.context_length, "parallel": self.parallel, "kv_budget_mib": self.kv_budget_mib,
                 "speculation": self.speculation}
        return {name: value for name, value in given.items() if value}
