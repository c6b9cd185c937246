"""The serving API's settings (serving.toml): written by provisioning from box.toml's [model] and [serving], read
by `everycycle serve --settings`. Command-line options given explicitly win (make run, tests)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import Field

from host_runtime.common.host_port import split_host_port
from host_runtime.common.lan import on_the_lan
from host_runtime.common.setting_rules import SettingsError, check_fields, one_of
from host_runtime.engine.limits import (MAX_CONTEXT, MAX_MIB, MAX_PARALLEL, MIN_CONTEXT, MIN_KV_BUDGET_MIB,
                                       SPECULATION)
from host_runtime.models.errors import StoreError
from host_runtime.models.manifest import check_name, name_for_file
from host_runtime.models.pull_hosts import check_entry
from host_runtime.models.sources import check_sha256, source_file_name
from host_runtime.placement.kv_types import KV_TYPES
from host_runtime.pool.residency import parse_keep_alive

# The rules box.toml's [serving], [model] and [tracing] share (provisioning/box_model.py). 0 or "" in these
# settings: not set, the server's default.
ContextLength = Annotated[int, Field(ge=MIN_CONTEXT, le=MAX_CONTEXT)]
Parallel = Annotated[int, Field(ge=1, le=MAX_PARALLEL)]
KvBudgetMib = Annotated[int, Field(ge=MIN_KV_BUDGET_MIB, le=MAX_MIB)]
ModelsMemoryMib = Annotated[int, Field(ge=64, le=MAX_MIB)]
Speculation = one_of(SPECULATION)
CacheType = one_of(KV_TYPES)
TraceSampleRatio = Annotated[float, Field(gt=0, le=1)]


def check_trace_endpoint(url: str, name: str) -> None:
    """An OTLP/HTTP collector's URL: http(s)://HOST[:PORT][/PATH] (its /v1/traces is added where PATH is empty)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a port that is not a number raises here)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise SettingsError(name, f"must be an OTLP/HTTP collector's http(s)://HOST[:PORT] URL, got {url!r}")
    if parts.scheme == "http" and not on_the_lan(parts.hostname):
        # Spans name the keys and paths of every request: in clear only to a collector on this LAN (#56, item 13)
        raise SettingsError(name, f"a collector beyond this LAN must be reached over https://, got {url!r} (plain "
                                  "http:// is taken for the LAN's addresses and .local, .lan, .internal, .home.arpa "
                                  "or one-label names)")


@dataclass(frozen=True)
class ServingSettings:
    model: str = ""            # a GGUF path; empty: the image's default model
    context_length: ContextLength = 0  # tokens per sequence; 0: the server's default
    quantization: str = ""     # what the owner asked for, checked against the model at provisioning
    # box.toml's [model] source = "pull": a model the box pulls into its store at first boot and then serves
    # (until it has, `model` or the built-in one answers). Checked here, by the type both sides use.
    pull_url: str = ""         # http(s)://... on the LAN, or hf://OWNER/REPO/FILE.gguf[@REVISION]
    pull_sha256: str = ""
    pull_name: str = ""        # its name in the store
    # On a fleet's gateway: a loopback HOST:PORT the API also listens on, for the gateway's router (which speaks
    # TCP only; the API's own socket is a Unix one). host_runtime/fleet/settings.py OWN_API.
    fleet_listen: str = ""
    # On a fleet's gateway: the router's loopback HOST:PORT, which the API asks which models the fleet has when the
    # router could not route a request (serving/fleet_unroutable.py).
    fleet_router: str = ""
    # box.toml's [api] prefix_cache = "shared": requests of every API key may reuse each other's cached prefixes
    # (by default each key finds only its own: serving/app.py cache_scope).
    prefix_cache_shared: bool = False
    # box.toml's [serving]: what a GPU owner tunes. 0 or empty: serve's own default (the planner's choice of
    # sequences, a 1 GiB KV budget, 5 minutes, 90% of the memory available at start).
    parallel: Parallel = 0     # sequences served at once
    kv_budget_mib: KvBudgetMib = 0  # the KV cache's memory when the planner chooses the sequences
    speculation: Speculation = "off"  # off or ngram (drafts from the prompt's own text)
    keep_alive: str = ""       # how long a model loaded on demand stays after its last request ('10m', '-1')
    models_memory_mib: ModelsMemoryMib = 0  # memory for loaded models, the one served at start included
    # another name a client may ask for, or a pattern of names (* and ?), -> a model of the store
    aliases: dict = field(default_factory=dict)
    cache_type_k: CacheType = ""  # the KV cache's types, by llama-server's names (placement/kv_types.py)
    cache_type_v: CacheType = ""
    # Where per-key usage is kept across restarts (engine/usage_file.py): the box's data partition, written by
    # provisioning; empty: counted in memory only.
    usage_dir: str = ""
    # box.toml's [tracing]: the OTLP/HTTP collector the API sends its request spans to (serving/tracing.py);
    # empty: no tracing. The share of requests traced where the client's traceparent does not decide.
    trace_endpoint: str = ""
    trace_sample_ratio: TraceSampleRatio = 1.0
    # The hosts a pull through the API (/api/pull) may fetch from (models/pull_hosts.py): names, addresses or
    # networks. Empty: any but loopback, link-local and metadata addresses, which only a named entry opens.
    pull_hosts: list = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.model and not self.model.startswith("/"):
            raise SettingsError("model", f"must be an absolute path, got {self.model!r}")
        if self.usage_dir and not self.usage_dir.startswith("/"):
            raise SettingsError("usage_dir", f"must be an absolute path, got {self.usage_dir!r}")
        check_fields(self)
        if self.keep_alive:
            try:
                parse_keep_alive(self.keep_alive)
            except ValueError as exc:
                raise SettingsError("keep_alive", str(exc).removeprefix("keep_alive ")) from None
        self._check_aliases()
        for name in ("fleet_listen", "fleet_router"):
            if getattr(self, name):
                self._check_loopback(name)
        if self.trace_endpoint:
            check_trace_endpoint(self.trace_endpoint, "trace_endpoint")
        if not isinstance(self.pull_hosts, list | tuple):
            raise SettingsError("pull_hosts", "must be a list of host names, addresses or networks")
        for i, entry in enumerate(self.pull_hosts):
            try:
                check_entry(entry)
            except ValueError as exc:
                raise SettingsError(f"pull_hosts[{i}]", str(exc)) from None
        if self.pull_url:
            self._check_pull()
        elif self.pull_sha256 or self.pull_name:
            raise SettingsError("url", "is required when a model is to be pulled")

    def _check_aliases(self) -> None:
        if not isinstance(self.aliases, dict):
            raise SettingsError("aliases", "must be a table of NAME = MODEL")
        for alias, target in self.aliases.items():
            if not isinstance(target, str):
                raise SettingsError(f"aliases.{alias}", "must be a model's name (a string)")
            try:
                # A name, or a pattern of one with * and ? (claude-* for every name Claude Code sends)
                check_name(alias.replace("*", "x").replace("?", "x"), f"aliases.{alias}")
                check_name(target, f"aliases.{alias}")
            except StoreError as exc:
                raise SettingsError(f"aliases.{alias}", str(exc).split(": ", 1)[1]) from None
            if target in self.aliases:
                raise SettingsError(f"aliases.{alias}", f"names another alias ({target!r}); name a model")

    def serving(self, model: str) -> "ServingSettings":
        """These settings with `model` (a store model's file; "": the image's built-in one) served from the next
        start. A bundle's pull is left behind: the model it named is in the store by then, or the caller refused."""
        return replace(self, model=model, pull_url="", pull_sha256="", pull_name="")

    @property
    def keep_alive_s(self) -> float | None | str:
        """keep_alive in seconds (None: forever), or "" where unset."""
        return parse_keep_alive(self.keep_alive) if self.keep_alive else ""

    def _check_loopback(self, name: str) -> None:
        value = getattr(self, name)
        try:
            loopback = split_host_port(value)[0].is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise SettingsError(name, f"must be a loopback HOST:PORT (the API is reached on the LAN only through the "
                                      f"front, the router on this box only), got {value!r}")

    def _check_pull(self) -> None:
        if self.model:
            raise SettingsError("path", "a model is either carried (path) or pulled (url), not both")
        if not self.pull_url.startswith(("http://", "https://", "hf://")):
            raise SettingsError("url", f"must be an http(s):// URL or hf://OWNER/REPO/FILE.gguf, got {self.pull_url!r}")
        if not self.pull_sha256:
            raise SettingsError("sha256", "is required with url: the box checks what it pulls against it")
        try:
            check_sha256(self.pull_sha256, "sha256")
            check_name(self.pull_name or name_for_file(source_file_name(self.pull_url)), "name")
        except StoreError as exc:
            field, _, message = str(exc).partition(": ")
            raise SettingsError(field if field in ("sha256", "name", "url") else "url", message or str(exc)) from None

    @property
    def pulled_name(self) -> str:
        """The name the pulled model has in the store."""
        return self.pull_name or name_for_file(source_file_name(self.pull_url))
