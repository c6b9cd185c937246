"""box.toml as one typed model (pydantic): what a bundle may say, field by field. Where a field becomes a service's
setting its type is the service's own (serving/settings.py, front/settings.py, governor/settings.py...), so
provisioning and the service judge a value by one rule. box_schema.json, the JSON Schema owners' editors read, is
generated from this model (`python -m provisioning.box_model --write`; a test keeps the two equal).

Only the shape and each value's own rule are here; what depends on several fields or on the bundle's files
(a gateway inside its network, a key file's mode, the model a file holds) is validate.py's."""

from __future__ import annotations

import json
import sys
import typing
from pathlib import Path
from typing import Annotated, Literal, Union

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from host_runtime.engine.wire import PRIORITIES
from host_runtime.common import generated_file
from host_runtime.common.generated_file import readable_schema
from host_runtime.common.setting_rules import TYPE_WORDS, error_words, hint_parts, one_of, tunables
from host_runtime.fleet.settings import (Mdns, Policy, Role, RouteBySpeed, ShardHosts, ShardLendMib, ShardListen,
                                         VrrpPriority, VrrpRouterId)
from host_runtime.front.settings import BOX_HTTP_MODES, MetricsAccess, Port
from host_runtime.governor.settings import GovernorSettings
from host_runtime.measure.requirement import AnswerTokens, ConcurrentUsers, PromptTokens, TimePerToken, TtftP50
from host_runtime.models.manifest import ModelName
from host_runtime.serving.settings import ContextLength, ServingSettings, TraceSampleRatio

SCHEMA_FILE = Path(__file__).with_name("box_schema.json")

Hostname = Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
                                description="a hostname: lowercase letters, digits and '-', 1 to 63 characters, not "
                                            "starting or ending with '-'")]
InterfaceName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,15}$",
                                     description="an interface name: up to 15 letters, digits, '_', '.' or '-'")]
KeyDigest = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$", description="a key's SHA-256 as 64 lowercase hex digits "
                                                                       "(see 'everycycle keys create')")]
FileDigest = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$",
                                  description="the file's SHA-256 as 64 lowercase hex digits")]
PullDigest = Annotated[str, Field(pattern=r"^[0-9a-fA-F]{64}$", description="a SHA-256 as 64 hex digits")]
NonEmpty = Annotated[str, Field(min_length=1)]
Limit = Annotated[int, Field(ge=0)]


class Table(BaseModel):
    """A box.toml table: unknown keys refused, types as TOML gives them (no "8080" for 8080)."""
    model_config = ConfigDict(extra="forbid", strict=True)


class Interface(Table):
    name: InterfaceName
    mode: Literal["dhcp", "static"]
    address: str = None
    gateway: str = None
    dns: list[str] = None


class Network(Table):
    interfaces: Annotated[list[Interface], Field(min_length=1)]


class ApiKey(Table):
    name: NonEmpty
    sha256: KeyDigest


class KeyPolicy(Table):
    priority: one_of(PRIORITIES) = Field(None, description="its requests' class in the engine's queue")
    max_concurrent: Limit = Field(None, description="its requests running or waiting at once, at most (0: no limit)")
    tokens_per_minute: Limit = Field(None, description="prompt and generated tokens in any minute, at most "
                                                       "(0: no limit)")
    tokens_per_day: Limit = Field(None, description="the same in any 24 hours (0: no limit)")
    models: list[NonEmpty] = Field(None, description="the models (or aliases) it may ask for; empty: every one")
    allowed_from: list[NonEmpty] = Field(None, description="the client addresses or networks it is valid from; "
                                                           "empty: any")
    may_pull: bool = Field(None, description="whether it may change the box's models through the API (/api/pull): "
                                             "a model it adds serves every key that names it (default: no)")


class Api(Table):
    port: Port = Field(None, description="the HTTPS port LAN clients use (default 8443)")
    keys: list[ApiKey] = None
    generate_keys: list[NonEmpty] = None
    tls_certificate: str = None
    tls_key: str = None
    http_port: Port = Field(None, description="the plain-HTTP port, which only redirects to HTTPS (default 8080)")
    http: one_of(BOX_HTTP_MODES) = Field(
        None, description="plain HTTP: redirect to HTTPS (default), off, or serve-lan: the whole API in clear on the "
                          "LAN too (keys and prompts readable by anyone on the network: for an owner whose clients "
                          "cannot use TLS at all)")
    metrics: MetricsAccess = None
    prefix_cache: Literal["per-key", "shared"] = Field(
        None, description="whether one API key's requests may reuse the prefix cache entries of another's: per-key "
                          "(default: a hit, its cached-token count and its speed tell no key about another's "
                          "prompts) or shared (one team)")
    policies: dict[str, KeyPolicy] = Field(
        None, description="limits and a priority class per API key, by the key's name (one of api.keys or "
                          "api.generate_keys), as `everycycle keys create|set-limit|set-priority` set them")
    lan_name: bool = Field(None, description="announce the box as HOSTNAME.local on the LAN by mDNS, with its API as "
                                             "an _https._tcp service (default true)")


class Ssh(Table):
    authorized_keys: str = None


class Model(Table):
    source: Literal["image", "bundle", "pull", "store"]
    path: str = None
    url: str = Field(None, description="source = 'pull': a name from the box's catalog (qwen3:8b), an http(s) URL "
                                       "on the LAN, hf://OWNER/REPO:QUANT or hf://OWNER/REPO/FILE.gguf[@REVISION], "
                                       "pulled into the model store at first boot")
    sha256: PullDigest = Field(None, description="source = 'pull': the file's sha256; the pull is refused unless it "
                                                 "matches (required for a URL or a file; a catalog name's or "
                                                 "REPO:QUANT's is the Hub listing's own)")
    name: ModelName = Field(None, description="source = 'pull': the model's name in the store (default: the file's "
                                              "name without .gguf); source = 'store': the model already in the box's "
                                              "store to serve (added by the first-boot wizard from a USB stick, or by "
                                              "`everycycle models add`)")
    context_length: ContextLength = None
    quantization: str = None


# [serving] is made from serving.toml's declarations (serving/settings.py: each field's rule, words and default said
# once, the flags made from the same); TOML's own shapes where they differ from the settings' (a keep_alive of
# seconds as a number, the tables' and lists' item types), and what only box.toml says, are here.
_SERVING_SHAPES = {"keep_alive": Union[str, float], "aliases": dict[str, str], "pull_hosts": list[NonEmpty]}
_SERVING_NOTES = {"context_length": "; also accepted as [model] context_length, not both"}
Serving = pydantic.create_model(
    "Serving", __base__=Table, __doc__="box.toml's [serving]: serving.toml's tunables, field by field.",
    **{t.name: (_SERVING_SHAPES.get(t.name, t.hint),
                Field(None, description=t.described + _SERVING_NOTES.get(t.name, "")))
       for t in tunables(ServingSettings) if t.box})


class Tracing(Table):
    endpoint: Annotated[str, Field(pattern=r"^https?://", description="an http(s):// URL")] = Field(
        None, description="the collector's OTLP/HTTP URL, e.g. http://10.0.0.5:4318 (spans go to its /v1/traces)")
    sample_ratio: TraceSampleRatio = Field(None, description="the share of requests traced where the client's "
                                                             "traceparent does not decide (default 1)")


class Bmc(Table):
    mode: Literal["none", "ipmi"]
    address: str = None
    user: str = None
    password_file: str = None


Power = pydantic.create_model(
    "Power", __base__=Table, __doc__="box.toml's [power]: governor.toml's settings, field by field.",
    **{t.name: (t.hint, Field(None, description=t.described)) for t in tunables(GovernorSettings) if t.box})


class Requirement(Table):
    ttft_p50_s: TtftP50 = None
    time_per_token_s: TimePerToken = None
    concurrent_users: ConcurrentUsers = None
    prompt_tokens: PromptTokens = None
    answer_tokens: AnswerTokens = None


class Fleet(Table):
    role: Role = None
    key_file: str = Field(None, description="the fleet key (one line, 0600): the same file in every box's bundle")
    peers: list[str] = Field(None, description="gateway: the other boxes' API URLs, like https://10.0.0.3:8443 (its "
                                               "own is added)")
    peer_certificates: list[str] = Field(None, description="gateway: PEM certificates to trust for the peers' HTTPS "
                                                           "(their own certificates or a CA's)")
    mdns: Mdns = None
    policy: Policy = None
    route_by_speed: RouteBySpeed = None
    gateway_address: Union[str, list[str]] = Field(
        None, description="member: the gateway's IP address (its requests carry every client's), or both gateways' "
                          "where two share a virtual address")
    virtual_address: str = Field(None, description="gateway, one of two: the address clients use, with its prefix "
                                                   "length (192.168.1.50/24); keepalived's VRRP moves it to the other "
                                                   "gateway when this one stops")
    vrrp_priority: VrrpPriority = None
    vrrp_router_id: VrrpRouterId = None
    vrrp_peers: list[str] = Field(None, description="gateway with virtual_address: the other gateway's address, for "
                                                    "unicast adverts (default: multicast)")
    vrrp_interface: str = Field(None, description="gateway with virtual_address: the interface to hold it on "
                                                  "(default: the one on its network)")
    shard_listen: ShardListen = None
    shard_lend_mib: ShardLendMib = None
    shard_hosts: ShardHosts = None


class Box(Table):
    model_config = ConfigDict(extra="forbid", strict=True, title="EveryCycle box.toml, schema 1")
    schema_version: Literal[1]
    hostname: Hostname
    network: Network
    api: Api
    ssh: Ssh = None
    model: Model
    serving: Serving = Field(None, description="how the box serves: written into serving.toml, read by the serving "
                                               "API at start")
    tracing: Tracing = Field(None, description="request tracing with OpenTelemetry: each request's spans (queue, "
                                               "prefix-cache restore, prefill, decode, stream) sent to an OTLP/HTTP "
                                               "collector; off without an endpoint")
    bmc: Bmc
    power: Power
    requirement: Requirement = Field(None, description="what the box (or fleet) must serve: everycycle measure "
                                                       "reports the measured figures against it")
    fleet: Fleet = None
    files: dict[str, FileDigest] = None


# ---- errors, named as box.toml names the field ---------------------------------------------------------------------

def _where(path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def _walk(loc: tuple) -> tuple[tuple, object, bool]:
    """How far `loc` names a box.toml field (pydantic adds a union's member after it), the type there, and whether
    the walk stopped at a union."""
    hint, path = Box, []
    for part in loc:
        base = hint_parts(hint)[0]
        if isinstance(base, type) and issubclass(base, BaseModel):
            hints = typing.get_type_hints(base, include_extras=True)
            if part not in hints:
                break
            hint = hints[part]
        elif typing.get_origin(base) in (list, dict):
            hint = typing.get_args(base)[-1]
        else:
            return tuple(path), hint, typing.get_origin(base) is Union
        path.append(part)
    return tuple(path), hint, typing.get_origin(hint_parts(hint)[0]) is Union


def errors(box: dict) -> list[tuple[str, str]]:
    """Every (field, words) where `box` breaks the model, in box.toml's order of fields."""
    try:
        Box.model_validate(box)
    except pydantic.ValidationError as exc:
        found: dict[str, list] = {}
        for e in exc.errors(include_url=False):
            if e["type"] == "extra_forbidden":
                parent = _where(e["loc"][:-1])
                found.setdefault(parent, []).append(f"unknown setting {e['loc'][-1]!r}")
                continue
            path, hint, union = _walk(e["loc"])
            field = _where(path)
            if union:  # one error per member type: said once, as the types it may be
                words = TYPE_WORDS.get(e["type"]) or e["msg"]
                previous = found.get(field)
                if previous and previous[-1].startswith("must be "):
                    previous[-1] = previous[-1].split(", got ")[0] + f" or {words}, got {type(e['input']).__name__}"
                else:
                    found.setdefault(field, []).append(f"must be {words}, got {type(e['input']).__name__}")
                continue
            _, metadata, description = hint_parts(hint)
            found.setdefault(field, []).append(error_words(e, metadata, description))
        return [(field, words) for field, all_words in found.items() for words in all_words]
    return []


# ---- the generated JSON Schema ----------------------------------------------------------------------------------

def json_schema() -> dict:
    raw = Box.model_json_schema()
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": raw["title"],
              **readable_schema(raw, raw.get("$defs", {}))}
    return schema


def schema_text() -> str:
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    sys.exit(generated_file.main(None, SCHEMA_FILE, schema_text,
                                 "box.toml's JSON Schema, generated from provisioning/box_model.py"))
