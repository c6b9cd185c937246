"""An engine process's settings, as one typed object: built once (from `serve`'s or `engine`'s command line),
handed to the engine process as itself (its JSON on the child's stdin: EngineChild), never turned back into argv.
An engine for a model loaded on demand gets a copy changed where that model needs it (`for_on_demand`)."""

from __future__ import annotations

import functools
import json
import os
from dataclasses import asdict, dataclass, field, replace

import pydantic

from host_runtime.common.errors import InputError
from host_runtime.engine.limits import PREFIX_CACHE_DISK_MIB, PREFIX_CACHE_RAM_MIB
from host_runtime.engine.model import ContextConfig, model_id_for
from host_runtime.engine.readiness import WedgePolicy
from host_runtime.engine.speculation import SpeculationConfig
from host_runtime.shard.holder import ShardConfig


@dataclass(frozen=True)
class PrefixCacheConfig:
    enabled: bool = True
    ram_bytes: int = PREFIX_CACHE_RAM_MIB << 20
    disk_bytes: int = PREFIX_CACHE_DISK_MIB << 20
    directory: str | None = None  # None: no disk tier


class OptionsError(InputError, ValueError):
    """An options document that is not one this version writes (a field unknown or of a wrong type)."""


@functools.cache
def _reader() -> pydantic.TypeAdapter:
    # made from the dataclasses themselves, so a field added to one is read without a line here
    return pydantic.TypeAdapter(EngineOptions)


def _unknown(doc, known, where: str = "") -> str | None:
    """The first key of `doc` that the options written back (`known`) do not have: one this version does not
    read, which pydantic would drop without a word."""
    if not isinstance(doc, dict):
        return None
    for key, value in doc.items():
        if key not in known:
            return f"{where}{key}"
        found = _unknown(value, known[key], f"{where}{key}.") if isinstance(known[key], dict) else None
        if found:
            return found
    return None


@dataclass(frozen=True)
class EngineOptions:
    model: str                  # the GGUF's path, resolved
    context: ContextConfig = field(default_factory=ContextConfig)
    prefix_cache: PrefixCacheConfig = field(default_factory=PrefixCacheConfig)
    speculation: SpeculationConfig = field(default_factory=SpeculationConfig)
    draft_model: str | None = None  # speculation.kind "draft": the drafting model's GGUF
    governor_state: str | None = None
    wedge: WedgePolicy = field(default_factory=WedgePolicy)
    usage_file: str | None = None  # per-key usage kept across restarts (engine/usage_file.py); None: memory only
    mmproj: str | None = None  # the model's projector GGUF (images: engine/projector.py); None: text only
    shards: ShardConfig = field(default_factory=ShardConfig)  # other boxes lending devices (shard/holder.py)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> "EngineOptions":
        """The options to_json wrote: each field checked by its type (strict: "ten" is not a number), a field
        left out at its default, an unknown one refused."""
        try:
            options = _reader().validate_json(text, strict=True)
        except pydantic.ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error["loc"]) or "(document)"
            raise OptionsError(f"not an engine options document: {where}: {error['msg']}") from None
        unknown = _unknown(json.loads(text), asdict(options))
        if unknown:
            raise OptionsError(f"not an engine options document: {unknown}: unknown field")
        return options

    def with_serving(self, ctx_size: int = 0, parallel: int = 0, kv_budget_mib: int = 0,
                     speculation: str = "") -> "EngineOptions":
        """These settings with a model's own (models/model_settings.py) where it gives them, by the name of the
        serve option each stands for."""
        context, drafting = self.context, self.speculation
        if ctx_size:
            context = replace(context, n_ctx_per_seq=ctx_size)
        if parallel:
            context = replace(context, n_parallel=parallel)
        if kv_budget_mib:
            context = replace(context, kv_budget_bytes=kv_budget_mib << 20)
        if speculation:
            on = speculation != "off"
            drafting = replace(drafting, enabled=on, kind="ngram")
            context = replace(context, speculation=on)
        return replace(self, context=context, speculation=drafting)

    def for_on_demand(self, model: str) -> "EngineOptions":
        """These settings for another model of the store, loaded on demand beside this one: its own prefix cache
        (entries are valid only for their weights), its own usage file, and no draft model (it drafts for this
        model, not that), and no projector (one is made for its model), and no shard hosts (a member lends its
        devices to one model at a time: this one's)."""
        options = replace(self, model=model, mmproj=None, shards=ShardConfig())
        if self.usage_file:
            options = replace(options, usage_file=os.path.join(os.path.dirname(self.usage_file),
                                                               f"{model_id_for(model)}.json"))
        if self.prefix_cache.directory:
            options = replace(options, prefix_cache=replace(
                self.prefix_cache, directory=f"{self.prefix_cache.directory}-models/{model_id_for(model)}"))
        if self.speculation.enabled and self.speculation.kind == "draft":
            options = replace(options, draft_model=None,
                              speculation=replace(self.speculation, enabled=False, kind="ngram", p_min=0.0),
                              context=replace(options.context, speculation=False))
        return options
