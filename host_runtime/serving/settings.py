"""The serving API's settings (serving.toml): written by provisioning from box.toml's [model] and [serving], read
by `everycycle serve --settings`. Command-line options given explicitly win (make run, tests)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import Field

from host_runtime.common.host_port import split_host_port
from host_runtime.common.lan import on_the_lan
from host_runtime.common.setting_rules import SettingsError, check_fields, setting
from host_runtime.engine.limits import DEFAULT_CTX, DEFAULT_KV_BUDGET_MIB
from host_runtime.engine.setting_types import (CacheType, ContextLength, KvBudgetMib, ModelsMemoryMib, Parallel,
                                               Speculation)
from host_runtime.models import catalog
from host_runtime.models.errors import SourceRefused, StoreError
from host_runtime.models.manifest import check_name, name_for_file
from host_runtime.models.pull_hosts import check_entry
from host_runtime.models.sources import check_sha256, hf_quant_parts, source_file_name
from host_runtime.placement.kv_types import DEFAULT_KV
from host_runtime.pool.residency import KEEP_ALIVE_S, parse_keep_alive
from host_runtime.shard.wire_key import check_member_address

__all__ = ["CacheType", "ContextLength", "KvBudgetMib", "ModelsMemoryMib", "Parallel", "ServingSettings",
           "Speculation", "TraceSampleRatio"]

# box.toml's [tracing] shares this rule (provisioning/box_model.py); [serving]'s are engine/setting_types.py's.
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
    # box.toml's [fleet] shard_hosts: the boxes lending their devices to this box's models (serve --shard-host),
    # and the file of their wire keys provisioning writes (the serving user's, 0600; never the fleet key itself).
    shard_hosts: tuple[str, ...] = ()
    shard_key_file: str = ""
    # box.toml's [api] prefix_cache = "shared": requests of every API key may reuse each other's cached prefixes
    # (by default each key finds only its own: serving/app.py cache_scope).
    prefix_cache_shared: bool = False
    # box.toml's [serving]: what a GPU owner tunes, each said once here: its rule (the type), its value where unset
    # (0 or empty: serve's own default), that default, the words box.toml's schema and serve's --help both show,
    # and serve's flag for it (cli/options.py makes the flags from these; box.toml's [serving] is made from them).
    context_length: ContextLength = setting(
        0, flag="--ctx-size", default=DEFAULT_CTX,
        description="tokens per sequence, at most the model's trained context (default: the trained context, up "
                    "to {default})")
    parallel: Parallel = setting(0, flag="--parallel", description="sequences served at once (default: as many as "
                                                                   "kv_budget_mib holds at full context, up to 16)")
    kv_budget_mib: KvBudgetMib = setting(0, flag="--kv-budget-mib", default=DEFAULT_KV_BUDGET_MIB,
                                         description="memory for the KV cache of running sequences, MiB")
    speculation: Speculation = setting(
        "off", flag="--speculation", default="off", flag_also=("draft",),
        description="ngram: each decoding sequence drafts from the prompt's own text and the model verifies the "
                    "drafts in the same call",
        flag_details="; edits and quotes come several tokens a step; drafts stop when a step holds 16 tokens or "
                     "the measured cost of calls says they would not pay (--draft-always). The output is the one "
                     "decoding without it gives (on the CPU in the default batching mode, which then lays "
                     "attention out for it: docs/). draft (command line only): a smaller model of the same "
                     "vocabulary (--draft-model) drafts its most likely tokens. off: one token a step")
    keep_alive: str = setting("", flag="--keep-alive", default=f"{KEEP_ALIVE_S / 60:g}m",
                              description="how long a model loaded on demand stays after its last request: seconds "
                                          "or '10m', '1h'; negative: forever; a request's keep_alive wins")
    models_memory_mib: ModelsMemoryMib = setting(
        0, flag="--models-memory-mib", description="memory for loaded models, the one served at start included, "
                                                   "MiB; no model's plan takes more host RAM (default: 90% of what "
                                                   "is available at start)")
    aliases: dict = setting({}, description="other names clients may ask for (or patterns of names, with * and "
                                            "?), each naming a model of the store, e.g. "
                                            "{ \"gpt-4o-mini\" = \"qwen2.5-7b-instruct\" }")
    cache_type_k: CacheType = setting("", flag="--cache-type-k", default=DEFAULT_KV[0],
                                      description="the KV cache's K type, as llama-server names them; a quantized "
                                                  "one turns flash attention on")
    cache_type_v: CacheType = setting("", flag="--cache-type-v", default=DEFAULT_KV[1],
                                      description="the KV cache's V type, as llama-server names them; a quantized "
                                                  "one turns flash attention on")
    # Where per-key usage is kept across restarts (engine/usage_file.py): the box's data partition, written by
    # provisioning; empty: counted in memory only.
    usage_dir: str = ""
    # box.toml's [tracing]: the OTLP/HTTP collector the API sends its request spans to (serving/tracing.py);
    # empty: no tracing. The share of requests traced where the client's traceparent does not decide.
    trace_endpoint: str = ""
    trace_sample_ratio: TraceSampleRatio = 1.0
    pull_hosts: list = setting([], description="the hosts a pull through the API may fetch from: names, "
                                               "addresses or networks (default: any but loopback, link-local and "
                                               "metadata addresses, which only a named entry opens)")

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
        self._check_shards()
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

    def _check_shards(self) -> None:
        object.__setattr__(self, "shard_hosts", tuple(self.shard_hosts))
        for i, host in enumerate(self.shard_hosts):
            try:
                check_member_address(host)
            except (ValueError, AttributeError):
                raise SettingsError(f"shard_hosts[{i}]", f"must be a box's ADDR:PORT like 10.0.0.3:50052 (its "
                                                         f"fleet shard-host --listen), got {host!r}") from None
        if len(set(self.shard_hosts)) != len(self.shard_hosts):
            raise SettingsError("shard_hosts", "names a box twice")
        if self.shard_hosts and not self.shard_key_file.startswith("/"):
            raise SettingsError("shard_key_file", f"must be an absolute path with shard_hosts, got "
                                                  f"{self.shard_key_file!r}")
        if self.shard_key_file and not self.shard_hosts:
            raise SettingsError("shard_key_file", "is only used with shard_hosts")

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
        listed = self.pull_url.startswith("hf://") and hf_quant_parts(self.pull_url) is not None
        try:
            catalogued = catalog.resolve(self.pull_url) is not None
        except SourceRefused as exc:
            raise SettingsError("url", str(exc)) from None
        if not (catalogued or self.pull_url.startswith(("http://", "https://", "hf://"))):
            raise SettingsError("url", f"must be a name from the box's catalog (qwen3:8b), an http(s):// URL or "
                                       f"hf://OWNER/REPO:QUANT or hf://OWNER/REPO/FILE.gguf, got {self.pull_url!r}")
        if not self.pull_sha256 and not (catalogued or listed):
            raise SettingsError("sha256", "is required with a URL or a file: the box checks what it pulls against it "
                                          "(a catalog name's or hf://OWNER/REPO:QUANT's is the Hub listing's own)")
        try:
            if self.pull_sha256:
                check_sha256(self.pull_sha256, "sha256")
            check_name(self.pulled_name, "name")
        except StoreError as exc:
            field, _, message = str(exc).partition(": ")
            raise SettingsError(field if field in ("sha256", "name", "url") else "url", message or str(exc)) from None

    @property
    def pulled_name(self) -> str:
        """The name the pulled model has in the store (a catalog name's: NAME-TAG)."""
        if self.pull_name:
            return self.pull_name
        catalogued = catalog.resolve(self.pull_url)
        return catalogued[0].store_name if catalogued else name_for_file(source_file_name(self.pull_url))
