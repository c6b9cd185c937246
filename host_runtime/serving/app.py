"""HTTP routing: the falcon app and its resources. No serving logic and no schema here."""

from __future__ import annotations

import json
import socket
import secrets
import time
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path

import falcon

from host_runtime.auth.fleet_vouch import PREFIX as VOUCH_PREFIX
from host_runtime.auth.fleet_vouch import VOUCH_HEADER, Vouch
from host_runtime.auth.keystore import KeyVerifier
from host_runtime.common.errors import EveryCycleError
from host_runtime.common.prometheus_text import merge, up_text
from host_runtime.common.sockets import peer_closed
from host_runtime.engine import wire
from host_runtime.engine.client import EngineClient
from host_runtime.engine.errors import RequestRejected
from host_runtime.engine.ipc import EngineUnavailable
from host_runtime.engine.key_ledger_file import SharedKeyLedger
from host_runtime.engine.readiness import WedgePolicy, unanswered
from host_runtime.engine.wire import PRIORITIES
from host_runtime.fleet.state import GatewayState
from host_runtime.governor.state_file import read_state
from host_runtime.pool.residency import parse_keep_alive
from host_runtime.serving import (anthropic_protocol, ollama_protocol, protocol, request_models, responses_protocol,
                                  transcription)
from host_runtime.serving.anthropic_logic import MessagesLogic
from host_runtime.serving.capabilities import CapabilitiesResource
from host_runtime.serving.errors import (APIError, handle_api_error, handle_box_error, handle_falcon_error,
                                        handle_unexpected)
from host_runtime.serving.key_privacy import cache_scope_of, metrics_for_key
from host_runtime.serving.key_tokens import KeyTokens
from host_runtime.serving.fleet_unroutable import FleetUnroutable
from host_runtime.serving.handlers import ServingLogic, call_engine, engine_down
from host_runtime.serving.infill import InfillLogic, parse_infill
from host_runtime.models.errors import StoreError
from host_runtime.models.pull_hosts import PullHosts
from host_runtime.models.store import Store
from host_runtime.serving.model_pull import PullJob
from host_runtime.serving.ollama_logic import OllamaLogic
from host_runtime.serving.ready_stamp import READY_MARGIN_S, ReadyStamp
from host_runtime.serving.responses_logic import ResponsesLogic
from host_runtime.serving.routing import Router
from host_runtime.serving.tracing import TraceMiddleware, Tracing
from host_runtime.update.system import status

OPEN_PATHS = {"/health", "/ready", "/openapi.json", "/api/version"}  # probes and the API's description carry no key;
# /metrics follows AppConfig.metrics_access


@dataclass(frozen=True)
class AppConfig:
    engine_socket: str
    keys_file: str | None = None
    max_body_bytes: int = 1 << 20
    # A generation's body with images (#58): up to this, of which at most max_body_bytes may be other than images
    max_media_body_bytes: int = 32 << 20
    ready_max_age_s: float = 5.0  # a canary that passed this recently is not run again
    ready_wait_s: float = 2.0  # a probe waits this long for the canary that runs, then answers from progress
    wedge_floor_s: float = 30.0  # for an engine that never answered: see engine/readiness.py
    # "open", "key", or "loopback" (the front lets only this machine reach /metrics; here it needs no key)
    metrics_access: str = "key"
    governor_state: str | None = None  # its .prom file beside it joins /metrics
    pool_socket: str | None = None  # the engine pool (several models); None: only the one engine
    fleet_router: str | None = None  # on the fleet's gateway: the router's loopback HOST:PORT
    # The prefix cache is scoped by API key unless the owner shares it between keys (one team, the fleet key).
    prefix_cache_shared: bool = False
    # [serving] aliases: (name or pattern a client may ask for, the store model that answers it), in box.toml's order
    aliases: tuple[tuple[str, str], ...] = ()
    model_store: str | None = None  # the store /api/pull adds to (None: pulls are refused)
    pull_hosts: tuple[str, ...] = ()  # serving.toml's pull_hosts (models/pull_hosts.py)
    trace_endpoint: str | None = None  # an OTLP/HTTP collector: requests are traced (serving/tracing.py)
    trace_sample_ratio: float = 1.0
    key_ledger: str | None = None  # the box's tokens by key (engine/key_ledger_file.py; None: this process's memory)
    # This box's name for its vouched keys' use, in its capability map and the gateway's vouchers (made once per
    # `serve`, before its workers fork: boxes in network namespaces share a host name)
    use_id: str = field(default_factory=lambda: secrets.token_hex(8))
    fleet_state: str | None = None  # on the gateway: the controller's state file, with the fleet's vouched use


FLEET_PREFIX = "/fleet/"


class FleetPrefix:
    """The fleet's router knows each (box, model) pair as its own worker, at BOX/fleet/MODEL (it keys workers by
    URL; host_runtime/fleet/controller.py): the prefix is dropped before routing and the request's body names
    the model as usual."""

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if req.path.startswith(FLEET_PREFIX):
            _, _, rest = req.path[len(FLEET_PREFIX):].partition("/")
            req.path = "/" + rest
            req.context.fleet_prefixed = True  # AuthMiddleware: no open path but /health behind the prefix


class KeyCheck:
    """GET /v1/everycycle/auth: 204 when the request's key is valid here (the middleware refused it otherwise).
    The fleet gateway's front asks this before passing a client's request to the router (nginx auth_request); on
    the gateway (its key file holds the fleet key's signing seed) the answer carries the voucher the front sends
    on in the key's place, so that its limits hold on the box that serves it (auth/fleet_vouch.py)."""

    def __init__(self, verifier: KeyVerifier | None = None, fleet_state: str | None = None):
        self._verifier = verifier
        self._fleet_use = FleetUse(fleet_state)

    def on_get(self, req, resp):
        resp.status = falcon.HTTP_204
        voucher = self._verifier.voucher() if self._verifier is not None else None
        if voucher is None or not self._fleet_use.vouching():
            return  # the router adds the fleet key (fleet/controller.vouches): no second bearer beside it
        policy = req.context.get("key_policy")
        name = req.context.get("key_name") or ""
        limited = policy is not None and (policy.tokens_per_minute or policy.tokens_per_day)
        vouch = Vouch(name, req.context.get("key_priority") or "default", req.context.get("key_max_concurrent") or 0,
                      policy.tokens_per_minute if policy else 0, policy.tokens_per_day if policy else 0,
                      tuple(policy.models) if policy else (), self._fleet_use.of(name) if limited else {})
        resp.set_header(VOUCH_HEADER, voucher.issue(vouch, time.time()))


NO_FLEET_VIEW = GatewayState(0.0, "")


class FleetUse:
    """The fleet's vouched use by key, from the gateway controller's state file (fleet/state.GatewayState, read
    again when it changes: every poll, about a second)."""

    def __init__(self, path: str | None):
        self._path = Path(path) if path else None
        self._stamp: tuple | None = None
        self._state = NO_FLEET_VIEW

    def _read(self) -> GatewayState:
        if self._path is None:
            return self._state
        try:
            st = self._path.stat()
            if (st.st_ino, st.st_mtime_ns, st.st_size) != self._stamp:
                self._state = GatewayState.from_json(json.loads(self._path.read_bytes()))
                self._stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        except (OSError, ValueError, TypeError, AttributeError):
            self._state = NO_FLEET_VIEW  # no fleet view yet: no vouchers, the router adds the fleet key
        return self._state

    def vouching(self) -> bool:
        """Whether the controller registered the router's workers without the fleet key (fleet/controller.py)."""
        return self._read().vouching

    def of(self, key: str) -> dict[str, list[int]]:
        use = self._read().vouched_use.get(key)
        return use if isinstance(use, dict) else {}


class LinkProbe:
    """GET /v1/everycycle/probe?bytes=N: N zero bytes (default 8 MiB, at most 16 MiB), so that `everycycle
    measure` times the link a request takes (through the front, as a client's does) without loading the engine."""

    DEFAULT_BYTES = 8 << 20
    MAX_BYTES = 16 << 20  # a key holder's request: kept small (the front does not spool it either)
    CHUNK = 1 << 20

    def on_get(self, req, resp):
        raw = req.get_param("bytes") or str(self.DEFAULT_BYTES)
        try:
            n = int(raw)
        except ValueError:
            n = -1
        if not 1 <= n <= self.MAX_BYTES:
            raise APIError(400, f"bytes is {raw!r}; it must be a whole number from 1 to {self.MAX_BYTES}",
                           param="bytes", code="invalid_value")
        chunk = bytes(self.CHUNK)

        def body():
            left = n
            while left > 0:
                yield chunk[:min(left, self.CHUNK)]
                left -= self.CHUNK

        resp.content_type = "application/octet-stream"
        resp.content_length = n
        resp.stream = body()


class AuthMiddleware:
    def __init__(self, verifier: KeyVerifier, metrics_access: str = "key", key_tokens: KeyTokens | None = None,
                 use_id: str = ""):
        self._verifier = verifier
        self._open = OPEN_PATHS | ({"/metrics"} if metrics_access != "key" else set())
        self._key_tokens = key_tokens  # the box's ledger, for a vouched key's use across the fleet
        self._use_id = use_id          # this box's name in the gateway's view of the fleet's use (AppConfig)

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        # Behind /fleet/BOX/ only /health is open (the router's health check): /metrics is open here only where
        # the front lets no LAN client reach it (metrics = "loopback"), and the front passes /fleet/ to anyone.
        prefixed = req.context.get("fleet_prefixed", False)
        if req.path in self._open and (not prefixed or req.path == "/health"):
            self._note_key(req)  # an open path answers more to a key (/health: the system's version and slot)
            return
        if req.path == "/metrics" and not prefixed and is_local_reader(req):
            return
        token = _presented_key(req)
        if not token:
            raise APIError(401, "no API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                           code="missing_api_key")
        if token.startswith(VOUCH_PREFIX):
            self._vouched(req, token)
            return
        name = self._verifier.verify(token)
        if name is None:
            raise APIError(401, "the API key is not valid for this box", code="invalid_api_key")
        policy = self._verifier.policy_of(name)
        if policy is not None and not policy.allows_address(client_address(req)):
            raise APIError(403, "this API key is not valid from this address", code="address_not_allowed")
        req.context.key_name = name  # the prefix cache's scope (cache_scope)
        req.context.key_priority = self._verifier.priority_of(name)  # its requests' class at most (priority_for)
        req.context.key_max_concurrent = self._verifier.max_concurrent_of(name)
        req.context.key_policy = policy  # its token limits and models (generation_call)


    def _vouched(self, req: falcon.Request, token: str) -> None:
        """A client's key as the fleet's gateway vouches for it (auth/fleet_vouch.py): its limits and class apply
        here under the name KEY@fleet; the fleet key's address rule (its gateways' addresses) applies too."""
        found = self._verifier.vouched(token, time.time())
        if found is None:
            raise APIError(401, "the fleet gateway's voucher is not valid here (out of date, or signed for another "
                                "fleet)", code="invalid_api_key")
        record, policy, vouch = found
        if not record.allows_address(client_address(req)):
            raise APIError(403, "this API key is not valid from this address", code="address_not_allowed")
        req.context.vouched = True  # a refusal for its limits goes back as VOUCHED_LIMIT_STATUS (serving/errors.py)
        req.context.key_name = policy.name
        req.context.key_priority = policy.priority
        req.context.key_max_concurrent = policy.max_concurrent
        req.context.key_policy = policy
        if self._key_tokens is not None:  # its tokens on the other boxes count here too
            self._key_tokens.check(req.context, vouch.elsewhere(self._use_id))

    def _note_key(self, req: falcon.Request) -> None:
        token = _presented_key(req)
        name = self._verifier.verify(token) if token else None
        if name is not None:
            policy = self._verifier.policy_of(name)
            if policy is None or policy.allows_address(client_address(req)):
                req.context.key_name = name


def _presented_key(req: falcon.Request) -> str:
    header = req.get_header("Authorization") or ""
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        token = req.get_header("X-Api-Key") or ""  # the Anthropic SDK's header
    return token.strip()


def keep_alive_of(body: dict):
    """A request's own keep_alive (Ollama's), checked; "default" when it has none."""
    if body.get("keep_alive") is None:
        return "default"
    try:
        return parse_keep_alive(body["keep_alive"])
    except ValueError as exc:
        raise APIError(400, str(exc), param="keep_alive", code="invalid_value") from None


DRAIN_FACTOR = 16  # read and drop an oversized body up to this multiple of the limit, so the client sees the 413


def read_json(req: falcon.Request, limit: int) -> dict:
    if req.content_length is not None and req.content_length > limit:
        # A client still sending when we answer gets a broken pipe instead of our error: drain
        # moderately oversized bodies first; past that, answer at once and drop the connection.
        if req.content_length <= limit * DRAIN_FACTOR:
            while req.bounded_stream.read(1 << 16):
                pass
        raise APIError(413, f"the request body is {req.content_length} bytes; the limit is {limit}",
                       code="request_too_large")
    raw = req.bounded_stream.read(limit + 1)
    if len(raw) > limit:
        raise APIError(413, f"the request body is over the limit of {limit} bytes", code="request_too_large")
    req.context["body_bytes"] = len(raw)
    return protocol.parse_json_body(raw)


def check_text_size(req: falcon.Request, config: "AppConfig", call) -> None:
    """A generation's body was read up to the media limit: what is not its images' (or audio's) base64 keeps the
    text limit."""
    media = getattr(call.request.prompt, "media", None) or []
    text = req.context.get("body_bytes", 0) - sum(len(item) for item in media)
    if text > config.max_body_bytes:
        raise APIError(413, f"the request body is {text} bytes besides its images; the limit is "
                            f"{config.max_body_bytes} (images may take up to {config.max_media_body_bytes} in all)",
                       code="request_too_large")


def cache_scope(req: falcon.Request, config: "AppConfig") -> str | None:
    """Whose prefixes a request may reuse in the engine's prefix cache: its API key's (by name), unless the owner
    shares the cache between keys (prefix_cache_shared) or the API takes no key (None: shared)."""
    if config.prefix_cache_shared:
        return None
    name, policy = req.context.get("key_name"), req.context.get("key_policy")
    if name and policy is not None:
        return cache_scope_of(name, policy.sha256)  # not the name alone: a later key of that name is another
    return name or None


def priority_for(req: falcon.Request, body: dict) -> str:
    """A request's priority class: its key's (keys create --priority), or a lower one the body asks for with
    EveryCycle's own `priority` field (a batch job says "batch"); never higher than its key's."""
    key_class = req.context.get("key_priority") or "default"
    asked = body.get("priority")
    if asked is None:
        return key_class
    if asked not in PRIORITIES:
        raise APIError(400, f"'priority' must be one of {', '.join(PRIORITIES)}, got {asked!r}", param="priority",
                       code="invalid_value")
    return max(asked, key_class, key=PRIORITIES.index)


def _over_unix_socket(req: falcon.Request) -> bool:
    sock = req.env.get("gunicorn.socket")
    return sock is not None and sock.family == socket.AF_UNIX


def is_local_reader(req: falcon.Request) -> bool:
    """A program on this box reading the Unix socket directly (the console, the boot check), not a LAN client via
    the front: the front always sets X-Forwarded-For, and the socket's directory admits only the box's services."""
    return _over_unix_socket(req) and req.get_header("X-Forwarded-For") is None


def client_address(req: falcon.Request) -> str | None:
    """The client's address: over the Unix socket it is the front's X-Forwarded-For (the front sets it to the
    connection's address, replacing any the client sent); over TCP, the connection's own (a client's header is
    not believed there). None for a program on this box reading the socket directly."""
    return req.get_header("X-Forwarded-For") if _over_unix_socket(req) else req.remote_addr


def client_watch(req: falcon.Request):
    """A check that the HTTP client is still connected, where the server exposes its socket (gunicorn does)."""
    sock = req.env.get("gunicorn.socket")
    return (lambda: peer_closed(sock)) if sock is not None else None


def event_stream(resp: falcon.Response, events) -> None:
    """Server-sent events, each passed on at once by the front."""
    resp.content_type = "text/event-stream"
    resp.set_header("Cache-Control", "no-cache")
    resp.set_header("X-Accel-Buffering", "no")
    resp.stream = events  # each says it is alive while the engine is quiet (serving/sse_keepalive.py)


def _json(resp: falcon.Response, doc: dict, status: int = 200) -> None:
    resp.status = falcon.code_to_http_status(status)
    resp.content_type = falcon.MEDIA_JSON
    resp.text = json.dumps(doc)


class Health:
    def __init__(self, client: EngineClient, keyless: bool = False):
        self._client = client
        self._keyless = keyless  # an API that takes no key (a developer's) tells everyone everything

    def on_get(self, req, resp):
        try:
            info = self._client.info(timeout=1.0)
            engine, detail = info.state, info.reason
        except EngineUnavailable as exc:
            engine, detail = "unreachable", str(exc)
        if not (self._keyless or req.context.get("key_name") or is_local_reader(req)):
            # Without a key (plain HTTP passes /health to anyone on the LAN): alive or not, nothing that tells
            # an attacker which version runs or why the last update failed.
            _json(resp, {"status": "ok", "engine": engine})
            return

        system = status(with_entries=False)
        _json(resp, {"status": "ok", "engine": engine, "engine_detail": detail,
                     "system": {k: system[k] for k in ("version", "slot", "last_update")}})


class Ready:
    """The engine's readiness verdict (engine/readiness.py); when the engine does not answer at all, this worker
    judges from the last verdict it got and how long the engine has been silent."""

    def __init__(self, client: EngineClient, config: AppConfig):
        self._client = client
        self._config = config
        # The last answer, shared by every worker (each kept its own, and their stall timers disagreed).
        self._stamp = ReadyStamp(config.engine_socket + ".ready")

    def on_get(self, req, resp):
        wait = self._config.ready_wait_s
        try:
            # The engine answers within the wait less a margin, so the probe ends within --ready-wait (it took up
            # to 5 s, the wait plus 3, while the engine was stopped).
            verdict = self._client.call(wire.Ready(self._config.ready_max_age_s, max(0.0, wait - READY_MARGIN_S)),
                                        timeout=wait)
            self._stamp.answered(verdict)
        except EngineUnavailable as exc:
            last, silent_for = self._stamp.silence()
            verdict = unanswered(last, silent_for, WedgePolicy(floor_s=self._config.wedge_floor_s), str(exc))
        _json(resp, {"status": "ready" if verdict.ready else "not_ready", **verdict.to_wire()},
              200 if verdict.ready else 503)
        if not verdict.ready:
            resp.set_header("Retry-After", "5")


class Metrics:
    """The engine's metrics, and the governor's where it publishes them: one scrape covers the box. An engine that
    does not answer is `everycycle_up 0` with a 200, so that Prometheus keeps the sample (it drops a 503's)."""

    def __init__(self, router: Router, config: AppConfig):
        self._router = router
        self._config = config

    def on_get(self, req, resp):
        resp.content_type = "text/plain; version=0.0.4; charset=utf-8"
        try:
            texts = [self._router.default.call(wire.Metrics(), timeout=5.0).text]
        except EngineUnavailable:
            resp.text = up_text(False) + self._governor_text()
            return
        for client in self._router.loaded_clients()[1:]:  # engines loaded on demand: the model label tells apart
            try:
                texts.append(client.call(wire.Metrics(), timeout=5.0).text)
            except EngineUnavailable:
                continue
        text = (up_text(True) + (texts[0] if len(texts) == 1 else merge(texts)) + self._router.pool_metrics()
                + self._governor_text())
        policy = req.context.get("key_policy")
        if self._config.metrics_access == "key" and not is_local_reader(req) and not (policy and policy.may_pull):
            text = metrics_for_key(text, req.context.get("key_name"))  # its own per-key series, no other key's
        resp.text = text

    def _governor_text(self) -> str:
        """The governor's Prometheus file (written beside its state file, with it), while that state is fresh."""
        if not read_state(self._config.governor_state).fresh:
            return ""
        try:
            return Path(self._config.governor_state).with_suffix(".prom").read_text()
        except OSError:
            return ""


class OpenAPIDocument:
    """The API's description (host_runtime/serving/openapi.json, checked against these routes by a test)."""

    def __init__(self):
        self._text = resources.files("host_runtime.serving").joinpath("openapi.json").read_text()

    def on_get(self, req, resp):
        resp.content_type = falcon.MEDIA_JSON
        resp.text = self._text


class Models:
    def __init__(self, router: Router):
        self._router = router

    @staticmethod
    def _entry(row) -> dict:
        """A pool.protocol.PoolModel as the API lists it."""
        entry = {"id": row.id, "object": "model", "created": 0, "owned_by": "everycycle",
                 "context_length": row.context_length, "trained_context_length": row.trained_context_length,
                 "state": row.state, "pinned": row.pinned}
        if row.download is not None:  # the bundle's model, being pulled: how far, or why it failed
            entry["download"] = asdict(row.download)
        return entry

    def on_get(self, req, resp):
        _json(resp, {"object": "list", "data": [self._entry(r) for r in self._router.models()]})

    def on_get_one(self, req, resp, model_id: str):
        rows = self._router.models()
        row = next((r for r in rows if r.id == model_id), None)
        if row is None:
            raise APIError(404, f"the model '{model_id}' does not exist; this box has: "
                           f"{', '.join(r.id for r in rows)}", param="model", code="model_not_found")
        _json(resp, self._entry(row))


class Tokens:
    """llama-server's /tokenize and /detokenize."""

    def __init__(self, router: Router, config: AppConfig, op: str, key_tokens: KeyTokens):
        self._router = router
        self._config = config
        self._op = op
        self._key_tokens = key_tokens

    def on_post(self, req, resp):
        body = read_json(req, self._config.max_body_bytes)
        request = (protocol.parse_tokenize(body) if self._op == "tokenize" else protocol.parse_detokenize(body))
        # A key kept to some models loads no other here either (#56, item 10: it loaded any, evicting idle ones).
        check_model_allowed(req.context.get("key_policy"), body.get("model"), self._router)
        self._key_tokens.check(req.context)
        client, _ = self._router.engine_for(body.get("model"))  # llama-server's shape has no model: the default
        reply = call_engine(client, request, 30.0)
        self._key_tokens.count(req.context, len(request.tokens) if self._op == "detokenize" else len(reply.tokens))
        _json(resp, asdict(reply))


class Generation:
    def __init__(self, router: Router, config: AppConfig, kind: str):
        self._router = router
        self._config = config
        self._kind = kind

    def on_post(self, req, resp):
        parse = protocol.parse_chat if self._kind == "chat" else \
            (lambda body, model_id, _tool_format: protocol.parse_completion(body, model_id))
        body, client, info, call = generation_call(req, self._router, self._config, parse)
        logic = ServingLogic(client)
        answer(req, resp, call, lambda: logic.stream(call, self._kind, info.model_id),
               lambda gone: logic.complete(call, self._kind, info.model_id, gone))


class Infill:
    """llama-server's /infill: fill in the middle for editor autocomplete (serving/infill.py)."""

    def __init__(self, router: Router, config: AppConfig):
        self._router = router
        self._config = config

    def on_post(self, req, resp):
        body, client, info, call = generation_call(
            req, self._router, self._config, lambda body, model_id, _fmt: parse_infill(body, model_id))
        logic = InfillLogic(ServingLogic(client))
        answer(req, resp, call, lambda: logic.stream(call, info.model_id),
               lambda gone: logic.complete(call, info.model_id, gone))


def generation_call(req, router: Router, config: AppConfig, parse, model_of=lambda body: body.get("model"),
                    body: dict | None = None):
    """A generation's common path for every API: its body read (or the one a handler already read), its model's
    engine found (loaded first if it must be), the body parsed by parse(body, model_id, tool_format), and the key's
    prefix scope and class set."""
    body = read_json(req, config.max_media_body_bytes) if body is None else body
    policy = req.context.get("key_policy")
    check_model_allowed(policy, model_of(body), router)
    client, info = router.engine_for(model_of(body), keep_alive_of(body))
    call = parse(body, info.model_id, info.tool_format or "generic")
    check_text_size(req, config, call)
    trace = req.context.get("trace")
    if trace is not None:
        trace.model(info.model_id)
        call = replace(call, trace=trace)
    return body, client, info, call.scoped(cache_scope(req, config), priority_for(req, body),
                                           req.context.get("key_name"), req.context.get("key_max_concurrent") or 0,
                                           policy.tokens_per_minute if policy else 0,
                                           policy.tokens_per_day if policy else 0)


def check_model_allowed(policy, model, router: Router) -> None:
    """A key limited to some models asks for one of them (by its name, or an alias of it; a request naming no
    model gets the default one, which must be among them too)."""
    if policy is None or not policy.models:
        return
    asked = model if isinstance(model, str) else router.default_info().model_id
    if asked in policy.models or router.alias_target(asked) in policy.models:
        return
    raise APIError(403, f"the key {policy.name!r} may not use the model '{asked}'; it may use: "
                        f"{', '.join(policy.models)} (keys set-limit --models)", error_type="permission_error",
                   code="model_not_allowed", param="model")


def answer(req, resp, call, stream, complete, streamed=None) -> None:
    """The answer streamed (`stream()`'s chunks; SSE unless `streamed` says otherwise) or whole (`complete(gone)`,
    gone telling whether the client left)."""
    if call.stream:
        (streamed or event_stream)(resp, stream())
    else:
        _json(resp, complete(client_watch(req)))


class Messages:
    """The Anthropic Messages API (POST /v1/messages and /v1/messages/count_tokens)."""

    def __init__(self, router: Router, config: AppConfig, key_tokens: KeyTokens):
        self._router = router
        self._config = config
        self._key_tokens = key_tokens

    def on_post(self, req, resp):
        _, client, info, call = generation_call(req, self._router, self._config, anthropic_protocol.parse_messages)
        logic = MessagesLogic(ServingLogic(client))
        answer(req, resp, call, lambda: logic.stream(call, info.model_id),
               lambda gone: logic.complete(call, info.model_id, gone))

    def on_post_count(self, req, resp):
        body = read_json(req, self._config.max_body_bytes)
        check_model_allowed(req.context.get("key_policy"), body.get("model"), self._router)
        self._key_tokens.check(req.context)  # checked, not counted: serving/key_tokens.py says why
        client, info = self._router.engine_for(body.get("model"))
        logic = MessagesLogic(ServingLogic(client))
        _json(resp, logic.count_tokens(anthropic_protocol.parse_count_tokens(body, info.model_id)))


class Responses:
    """OpenAI's Responses API (POST /v1/responses), stateless: what Codex CLI and the Agents SDK speak."""

    def __init__(self, router: Router, config: AppConfig):
        self._router = router
        self._config = config

    def on_post(self, req, resp):
        body, client, info, call = generation_call(req, self._router, self._config,
                                                   responses_protocol.parse_responses)
        logic = ResponsesLogic(ServingLogic(client))
        answer(req, resp, call, lambda: logic.stream(call, body, info.model_id),
               lambda gone: logic.complete(call, body, info.model_id, gone))


class Transcriptions:
    """OpenAI's POST /v1/audio/transcriptions (multipart): a Whisper model's engine writes the sound down
    (speech/service.py, with its timed segments); a chat model whose projector takes audio is asked to, as
    llama-server answers it (serving/transcription.py)."""

    def __init__(self, router: Router, config: AppConfig, key_tokens: KeyTokens):
        self._router = router
        self._config = config
        self._key_tokens = key_tokens

    def on_post(self, req, resp):
        fields, audio = read_form(req, self._config.max_media_body_bytes)
        ask = transcription.parse(fields, audio)
        check_model_allowed(req.context.get("key_policy"), ask.model, self._router)
        client, info = self._router.engine_for(ask.model)
        if info.task == "transcribe":
            self._key_tokens.check(req.context)
            heard = client.call(transcription.engine_request(ask), transcription.engine_timeout_s(ask),
                                client_watch(req))
            self._key_tokens.count(req.context, heard.tokens)
            content_type, body = transcription.render(ask, heard.text, heard.segments, heard.language,
                                                      heard.duration_s)
        else:
            transcription.check_timed_format(ask)
            _, client, info, call = generation_call(req, self._router, self._config, protocol.parse_chat,
                                                    body=transcription.chat_body(ask))
            done = ServingLogic(client).complete(call, "chat", info.model_id, client_watch(req))
            content_type, body = transcription.render(ask, (done["choices"][0]["message"]["content"] or "").strip())
        if isinstance(body, dict):
            _json(resp, body)
        else:
            resp.content_type, resp.data = content_type, body


FORM_FIELD_BYTES = 64 << 10  # a form's text field (a prompt of earlier words is the longest)


def read_form(req: falcon.Request, limit: int) -> tuple[dict[str, str], bytes | None]:
    """A multipart/form-data body's text fields and its `file`, within `limit` bytes in all."""
    if not (req.content_type or "").startswith("multipart/form-data"):
        raise APIError(400, "the body must be multipart/form-data (a `file` and the form's fields)",
                       code="invalid_content_type")
    if req.content_length is None or req.content_length > limit:
        raise APIError(413, f"the request body must give its length and be at most {limit} bytes",
                       code="request_too_large")
    fields: dict[str, str] = {}
    audio = None
    try:
        for part in req.get_media():
            if part.name == "file":
                audio = part.stream.read(limit + 1)
            elif part.name:
                value = part.stream.read(FORM_FIELD_BYTES + 1)
                if len(value) > FORM_FIELD_BYTES:
                    raise APIError(400, f"'{part.name}' is longer than {FORM_FIELD_BYTES} bytes", param=part.name)
                fields[part.name] = value.decode("utf-8", errors="replace")
    except falcon.MediaMalformedError as exc:
        raise APIError(400, f"the multipart body is malformed: {exc.description or exc.title}",
                       code="invalid_multipart") from None
    return fields, audio


def ndjson_stream(resp: falcon.Response, lines) -> None:
    """Ollama's streamed answers: one JSON object per line, each passed on at once by the front."""
    resp.content_type = "application/x-ndjson"
    resp.set_header("Cache-Control", "no-cache")
    resp.set_header("X-Accel-Buffering", "no")
    resp.stream = lines


class Ollama:
    """Ollama's API beside ours (/api/*; serving/ollama_protocol.py says what is mapped and what is ignored)."""

    def __init__(self, router: Router, config: AppConfig, key_tokens: KeyTokens):
        self._router = router
        self._config = config
        self._key_tokens = key_tokens

    def on_get_version(self, req, resp):
        _json(resp, {"version": ollama_protocol.VERSION})

    def _listed(self, loaded_only: bool) -> list[dict]:
        default = self._router.default_info()
        out = []
        for row in self._router.models():
            if loaded_only and row.state != "loaded":
                continue
            size = 0
            if row.id == default.model_id:
                try:
                    size = Path(default.model_path).stat().st_size
                except OSError:
                    pass
            entry = {"name": ollama_protocol.listed_name(row.id), "model": ollama_protocol.listed_name(row.id),
                     "modified_at": ollama_protocol.now_iso(), "size": size, "digest": "",
                     "details": ollama_protocol.details(None)}
            if loaded_only:
                entry |= {"expires_at": ollama_protocol.expires_at(row.expires_in_s), "size_vram": 0}
            out.append(entry)
        return out

    def on_get_tags(self, req, resp):
        _json(resp, {"models": self._listed(loaded_only=False)})

    def on_get_ps(self, req, resp):
        _json(resp, {"models": self._listed(loaded_only=True)})

    def on_post_show(self, req, resp):
        body = read_json(req, self._config.max_body_bytes)
        request_models.check(request_models.OllamaShowRequest, body)
        name = ollama_protocol.model_name(body, "")
        row = next((r for r in self._router.models() if r.id == name), None)
        if row is None:
            raise APIError(404, f"model '{name}' not found", param="model", code="model_not_found")
        default = self._router.default_info()
        info = default if row.id == default.model_id else None
        _json(resp, {"modelfile": "", "parameters": "", "template": "", "details": ollama_protocol.details(None),
                     "model_info": {
                                    "context_length": row.context_length,
                                    "trained_context_length": row.trained_context_length},
                     "capabilities": ["embedding"] if info is not None and info.pooling else
                     ["completion", "tools"] + (["vision"] if "vision" in self._takes(row.id, info) else []),
                     "modified_at": ollama_protocol.now_iso()})

    def _takes(self, name: str, info) -> str:
        """What a model's projector takes (Open WebUI offers an image upload for a model whose capabilities say
        vision): the engine's word for the served model, the store's manifest for another."""
        if info is not None:
            return info.media or ""
        if not self._config.model_store:
            return ""
        try:
            return Store(Path(self._config.model_store)).get(name).projector_takes
        except StoreError:
            return ""  # an alias of one, or a model it cannot read: no more than text is promised

    def on_post_pull(self, req, resp):
        body = read_json(req, self._config.max_body_bytes)
        source, stream = ollama_protocol.parse_pull(body)
        self._may_change_models(req)
        if not self._config.model_store:
            raise APIError(400, "this server has no model store to pull into (it serves one model file)",
                           param="model", code="no_model_store")
        job = PullJob(self._config.model_store, source, PullHosts(self._config.pull_hosts))
        alias = self._router.covering_alias(job.name)
        if alias is not None:  # else every request for that name would go to the pulled model
            raise APIError(409, f"'{job.name}' is a name the owner's aliases give to "
                                f"'{self._router.aliases[alias]}' ({alias!r} in [serving.aliases]); a pulled model "
                                "may not take it over: pull it under another file name, or change the alias",
                           error_type="invalid_request_error", code="name_is_an_alias", param="model")
        job.start()
        if stream:
            ndjson_stream(resp, (json.dumps(line).encode() + b"\n" for line in job.lines()))
            return
        last = {}
        for line in job.lines():
            last = line
        if job.error is not None:
            raise job.error
        _json(resp, last)

    def _generation(self, req, resp, kind: str):
        body = read_json(req, self._config.max_media_body_bytes)  # images: generation_call checks the rest
        if ollama_protocol.loads_only(body, kind):
            self._load_or_unload(req, resp, kind, body)
            return
        parse = ollama_protocol.parse_chat if kind == "chat" else ollama_protocol.parse_generate
        _, client, info, call = generation_call(req, self._router, self._config, parse,
                                                lambda body: ollama_protocol.model_name(body, ""), body)
        logic = OllamaLogic(ServingLogic(client))
        name = ollama_protocol.listed_name(info.model_id)
        answer(req, resp, call, lambda: logic.stream(call, kind, name),
               lambda gone: logic.complete(call, kind, name, gone), ndjson_stream)

    def _load_or_unload(self, req, resp, kind: str, body: dict) -> None:
        """Ollama's idioms with nothing to generate: an empty prompt or messages loads the model (and keeps it for
        the request's keep_alive), and with keep_alive 0 unloads it now."""
        name = ollama_protocol.model_name(body, "")
        check_model_allowed(req.context.get("key_policy"), name, self._router)
        keep_alive = keep_alive_of(body)
        if keep_alive == 0:
            target = self._router.alias_target(name) or name
            if self._router.pool is None or target == self._router.default_info().model_id:
                raise APIError(409, f"'{name}' is the model the server started with (serving.toml or --model): it "
                                    "stays loaded", code="model_in_use", param="model")
            try:
                self._router.pool.unload(target)  # False where it was not loaded: unloaded all the same
            except EngineUnavailable as exc:
                raise engine_down(exc) from None
            reason = "unload"
        else:
            self._router.engine_for(name, keep_alive)  # loaded, and ready, or the refusal says why not
            reason = "load"
        _json(resp, ollama_protocol.load_answer(ollama_protocol.listed_name(name), kind, reason))

    def on_delete_delete(self, req, resp):
        """DELETE /api/delete: a model out of the store, with the permission a pull needs (it changes what every key's
        requests for that name get); a loaded one is unloaded first, the server's own model refused."""
        body = read_json(req, self._config.max_body_bytes)
        request_models.check(request_models.OllamaDeleteRequest, body)
        name = ollama_protocol.model_name(body, "")
        self._may_change_models(req)
        store = self._store_holding(name, "model")
        if self._router.pool is None or name == self._router.default_info().model_id:
            raise APIError(409, f"'{name}' is the model the server started with (serving.toml or --model): change "
                                "that first", code="model_in_use", param="model")
        try:
            self._router.pool.unload(name)
        except EngineUnavailable as exc:
            raise engine_down(exc) from None
        store.remove(name)
        resp.status = falcon.HTTP_200

    def on_post_copy(self, req, resp):
        """/api/copy: a store model under a second name (the same file, hard-linked), with the pull's permission; a
        name one of the owner's aliases covers is refused as a pull's would be."""
        body = read_json(req, self._config.max_body_bytes)
        request = request_models.check(request_models.OllamaCopyRequest, body)
        self._may_change_models(req)
        source = ollama_protocol.model_name({"model": request.source}, "")
        name = ollama_protocol.model_name({"model": request.destination}, "")
        alias = self._router.covering_alias(name)
        if alias is not None:
            raise APIError(409, f"'{name}' is a name the owner's aliases give to '{self._router.aliases[alias]}' "
                                f"({alias!r} in [serving.aliases]): copy it under another name",
                           code="name_is_an_alias", param="destination")
        store = self._store_holding(source, "source")
        try:
            store.copy(source, name)
        except StoreError as exc:
            raise APIError(400, str(exc), param="destination", code="invalid_value") from None
        resp.status = falcon.HTTP_200

    def _store_holding(self, name: str, param: str) -> Store:
        """The box's model store, where `name` is a model (404 where it is not; 400 where there is no store)."""
        if not self._config.model_store:
            raise APIError(400, "this server has no model store (it serves one model file)", param=param,
                           code="no_model_store")
        store = Store(Path(self._config.model_store))
        try:
            store.get(name)
        except StoreError:
            raise APIError(404, f"model '{name}' not found", error_type="not_found_error", code="model_not_found",
                           param=param) from None
        return store

    def _may_change_models(self, req) -> None:
        policy = req.context.get("key_policy")
        if policy is not None and policy.models:  # a key kept to some models does not add others to the box
            raise APIError(403, f"the key {policy.name!r} may use only {', '.join(policy.models)}; it may not pull "
                                "or remove models", error_type="permission_error", code="pull_not_allowed",
                           param="model")
        if policy is not None and not policy.may_pull:  # a model it adds would serve every key that names it
            raise APIError(403, f"the key {policy.name!r} may not change the box's models; the owner grants it with "
                                f"'everycycle keys set-limit --keys FILE {policy.name} --may-pull yes'",
                           error_type="permission_error", code="pull_not_allowed", param="model")

    def on_post_chat(self, req, resp):
        self._generation(req, resp, "chat")

    def on_post_generate(self, req, resp):
        self._generation(req, resp, "generate")

    def on_post_embed(self, req, resp):
        body = read_json(req, self._config.max_body_bytes)
        check_model_allowed(req.context.get("key_policy"), ollama_protocol.model_name(body, ""), self._router)
        self._key_tokens.check(req.context)
        client, info = self._router.engine_for(ollama_protocol.model_name(body, ""), keep_alive_of(body))
        started = time.monotonic_ns()
        doc = ServingLogic(client).embed(ollama_protocol.parse_embed(body, info.model_id), info.model_id,
                                         client_watch(req))
        self._key_tokens.count(req.context, doc["usage"]["prompt_tokens"])
        vectors = [d["embedding"] for d in doc["data"]]
        if req.path == "/api/embeddings":  # the legacy endpoint: one prompt, one vector
            _json(resp, {"embedding": vectors[0]})
            return
        _json(resp, {"model": ollama_protocol.listed_name(info.model_id), "embeddings": vectors,
                     "total_duration": time.monotonic_ns() - started, "load_duration": 0,
                     "prompt_eval_count": doc["usage"]["prompt_tokens"]})


class Pooled:
    """The endpoints of a pooling model, answered whole: /v1/embeddings (ServingLogic.embed) and /v1/rerank
    (ServingLogic.rerank, llama-server's, for a reranker GGUF). `parse(body, model_id)` checks the body, and
    `answer(logic, call, model_id, client_gone)` is the ServingLogic method that answers it."""

    def __init__(self, router: Router, config: AppConfig, parse, answer, key_tokens: KeyTokens):
        self._router = router
        self._config = config
        self._parse = parse
        self._answer = answer
        self._key_tokens = key_tokens

    def on_post(self, req, resp):
        body = read_json(req, self._config.max_body_bytes)
        check_model_allowed(req.context.get("key_policy"), body.get("model"), self._router)
        self._key_tokens.check(req.context)
        client, info = self._router.engine_for(body.get("model"), keep_alive_of(body))
        doc = self._answer(ServingLogic(client), self._parse(body, info.model_id), info.model_id, client_watch(req))
        self._key_tokens.count(req.context, doc["usage"]["prompt_tokens"])
        _json(resp, doc)


def create_app(config: AppConfig) -> falcon.App:
    # The grammar converter (tools, response_format) pulls in llama_cpp and numpy. Imported here, before the
    # worker's threads serve: a first import of it in a request thread while another thread was importing failed
    # once in the suite with numpy "partially initialized" (a 400 for a valid tool schema).
    import llama_cpp.llama_grammar  # noqa: F401  (imported for its side effect: loaded before the threads)

    client = EngineClient(config.engine_socket)
    middleware = [FleetPrefix()]
    verifier = KeyVerifier(config.keys_file) if config.keys_file else None
    key_tokens = KeyTokens(SharedKeyLedger(config.key_ledger))
    if verifier is not None:
        middleware.append(AuthMiddleware(verifier, config.metrics_access, key_tokens, config.use_id))
    if config.trace_endpoint:  # after the key check: only an accepted key's requests make spans
        middleware.append(TraceMiddleware(Tracing(config.trace_endpoint, config.trace_sample_ratio),
                                          keys_required=bool(config.keys_file)))
    app = falcon.App(middleware=middleware)
    router = Router(client, config.pool_socket, dict(config.aliases))
    app.add_route("/health", Health(client, keyless=not config.keys_file))
    app.add_route("/ready", Ready(client, config))
    app.add_route("/metrics", Metrics(router, config))
    app.add_route("/openapi.json", OpenAPIDocument())
    models = Models(router)
    app.add_route("/v1/models", models)
    app.add_route("/v1/models/{model_id}", models, suffix="one")
    app.add_route("/tokenize", Tokens(router, config, "tokenize", key_tokens))
    app.add_route("/detokenize", Tokens(router, config, "detokenize", key_tokens))
    app.add_route("/v1/chat/completions", Generation(router, config, "chat"))
    app.add_route("/v1/completions", Generation(router, config, "completion"))
    app.add_route("/infill", Infill(router, config))
    app.add_route("/v1/embeddings", Pooled(router, config, protocol.parse_embeddings, ServingLogic.embed, key_tokens))
    rerank = Pooled(router, config, protocol.parse_rerank, ServingLogic.rerank, key_tokens)
    app.add_route("/v1/rerank", rerank)
    app.add_route("/rerank", rerank)
    messages = Messages(router, config, key_tokens)
    app.add_route("/v1/messages", messages)
    app.add_route("/v1/messages/count_tokens", messages, suffix="count")
    app.add_route("/v1/responses", Responses(router, config))
    app.add_route("/v1/audio/transcriptions", Transcriptions(router, config, key_tokens))
    ollama = Ollama(router, config, key_tokens)
    for path, suffix in (("version", "version"), ("tags", "tags"), ("ps", "ps"), ("show", "show"), ("chat", "chat"),
                         ("generate", "generate"), ("embed", "embed"), ("embeddings", "embed"), ("pull", "pull"),
                         ("delete", "delete"), ("copy", "copy")):
        app.add_route(f"/api/{path}", ollama, suffix=suffix)

    app.add_route("/v1/everycycle/capabilities", CapabilitiesResource(router, config, verifier, key_tokens.ledger))
    app.add_route("/v1/everycycle/auth", KeyCheck(verifier, config.fleet_state))
    app.add_route("/v1/everycycle/probe", LinkProbe())
    app.add_route("/v1/everycycle/fleet/unroutable", FleetUnroutable(config.fleet_router, config.max_body_bytes))
    # Most specific last: falcon picks the handler registered for the closest class.
    app.add_error_handler(Exception, handle_unexpected)
    app.add_error_handler(falcon.HTTPError, handle_falcon_error)
    app.add_error_handler(EveryCycleError, handle_box_error)
    app.add_error_handler(RequestRejected, handle_api_error)
    return app
