"""HTTP routing: the falcon app and its resources. No serving logic and no schema here."""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass

import falcon

from host_runtime.auth.keystore import KeyVerifier
from host_runtime.common.sockets import peer_closed
from host_runtime.engine.ipc import EngineClient, EngineUnavailable
from host_runtime.engine.readiness import Verdict, WedgePolicy, unanswered
from host_runtime.serving import protocol
from host_runtime.serving.errors import APIError, handle_api_error, handle_falcon_error, handle_unexpected
from host_runtime.serving.handlers import ServingLogic, engine_down

OPEN_PATHS = {"/health", "/ready", "/openapi.json"}  # probes and the API's description carry no key;
# /metrics follows AppConfig.metrics_access


@dataclass(frozen=True)
class AppConfig:
    engine_socket: str
    keys_file: str | None = None
    max_body_bytes: int = 1 << 20
    ready_max_age_s: float = 5.0  # a canary that passed this recently is not run again
    ready_wait_s: float = 2.0  # a probe waits this long for the canary that runs, then answers from progress
    wedge_floor_s: float = 30.0  # for an engine that never answered: see engine/readiness.py
    # "open", "key", or "loopback" (the front lets only this machine reach /metrics; here it needs no key)
    metrics_access: str = "key"


class AuthMiddleware:
    def __init__(self, verifier: KeyVerifier, metrics_access: str = "key"):
        self._verifier = verifier
        self._open = OPEN_PATHS | ({"/metrics"} if metrics_access != "key" else set())

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if req.path in self._open:
            return
        if req.path == "/metrics" and is_local_reader(req):
            return
        header = req.get_header("Authorization") or ""
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise APIError(401, "no API key: send 'Authorization: Bearer <key>'", code="missing_api_key")
        if self._verifier.verify(token.strip()) is None:
            raise APIError(401, "the API key is not valid for this box", code="invalid_api_key")


class ModelIdentity:
    """The served model's id, learnt from the engine once and then kept."""

    def __init__(self, client: EngineClient):
        self._client = client
        self._model_id: str | None = None
        self._lock = threading.Lock()

    def get(self) -> str:
        if self._model_id is None:
            with self._lock:
                if self._model_id is None:
                    try:
                        self._model_id = self._client.call({"op": "info"}, timeout=5.0)["model_id"]
                    except EngineUnavailable as exc:
                        raise engine_down(exc) from None
        return self._model_id


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
    return protocol.parse_json_body(raw)


def is_local_reader(req: falcon.Request) -> bool:
    """A program on this box reading the Unix socket directly (the console, the boot check), not a LAN client via
    the front: the front always sets X-Forwarded-For, and the socket's directory admits only the box's services."""
    sock = req.env.get("gunicorn.socket")
    return (sock is not None and sock.family == socket.AF_UNIX
            and req.get_header("X-Forwarded-For") is None)


def client_watch(req: falcon.Request):
    """A check that the HTTP client is still connected, where the server exposes its socket (gunicorn does)."""
    sock = req.env.get("gunicorn.socket")
    return (lambda: peer_closed(sock)) if sock is not None else None


def _json(resp: falcon.Response, doc: dict, status: int = 200) -> None:
    resp.status = falcon.code_to_http_status(status)
    resp.content_type = falcon.MEDIA_JSON
    resp.text = json.dumps(doc)


class Health:
    def __init__(self, client: EngineClient):
        self._client = client

    def on_get(self, req, resp):
        try:
            info = self._client.call({"op": "info"}, timeout=1.0)
            engine, detail = info["state"], info.get("reason")
        except EngineUnavailable as exc:
            engine, detail = "unreachable", str(exc)
        from host_runtime.update.system import status

        system = status(with_entries=False)
        _json(resp, {"status": "ok", "engine": engine, "engine_detail": detail,
                     "system": {k: system[k] for k in ("version", "slot", "last_update")}})


class Ready:
    """The engine's readiness verdict (engine/readiness.py); when the engine does not answer at all, this worker
    judges from the last verdict it got and how long the engine has been silent."""

    def __init__(self, client: EngineClient, config: AppConfig):
        self._client = client
        self._config = config
        self._lock = threading.Lock()
        self._last: Verdict | None = None
        self._answered_at: float | None = None  # the last answer, else the first question

    def on_get(self, req, resp):
        wait = self._config.ready_wait_s
        try:
            doc = self._client.call({"op": "ready", "max_age": self._config.ready_max_age_s, "wait": wait},
                                    timeout=wait + 3.0)
            verdict = Verdict.from_wire(doc)
            with self._lock:
                self._last, self._answered_at = verdict, time.monotonic()
        except EngineUnavailable as exc:
            with self._lock:
                now = time.monotonic()
                if self._answered_at is None:
                    self._answered_at = now
                verdict = unanswered(self._last, now - self._answered_at,
                                     WedgePolicy(floor_s=self._config.wedge_floor_s), str(exc))
        _json(resp, {"status": "ready" if verdict.ready else "not_ready", **verdict.to_wire()},
              200 if verdict.ready else 503)
        if not verdict.ready:
            resp.set_header("Retry-After", "5")


class Metrics:
    def __init__(self, client: EngineClient):
        self._client = client

    def on_get(self, req, resp):
        resp.content_type = "text/plain; version=0.0.4; charset=utf-8"
        try:
            resp.text = self._client.call({"op": "metrics"}, timeout=5.0)["text"]
        except EngineUnavailable:
            resp.status = falcon.HTTP_503
            resp.text = "everycycle_up 0\n"
            return
        resp.text = "# TYPE everycycle_up gauge\neverycycle_up 1\n" + resp.text


class OpenAPIDocument:
    """The API's description (host_runtime/serving/openapi.json, checked against these routes by a test)."""

    def __init__(self):
        from importlib import resources

        self._text = resources.files("host_runtime.serving").joinpath("openapi.json").read_text()

    def on_get(self, req, resp):
        resp.content_type = falcon.MEDIA_JSON
        resp.text = self._text


class Models:
    def __init__(self, identity: ModelIdentity):
        self._identity = identity

    def on_get(self, req, resp):
        _json(resp, {"object": "list", "data": [
            {"id": self._identity.get(), "object": "model", "created": 0, "owned_by": "everycycle"}]})


class Generation:
    def __init__(self, logic: ServingLogic, identity: ModelIdentity, config: AppConfig, kind: str):
        self._logic = logic
        self._identity = identity
        self._config = config
        self._kind = kind

    def on_post(self, req, resp):
        body = read_json(req, self._config.max_body_bytes)
        model_id = self._identity.get()
        parse = protocol.parse_chat if self._kind == "chat" else protocol.parse_completion
        call = parse(body, model_id)
        if call.stream:
            resp.content_type = "text/event-stream"
            resp.set_header("Cache-Control", "no-cache")
            resp.set_header("X-Accel-Buffering", "no")  # the front passes each event on at once
            resp.stream = self._logic.stream(call, self._kind, model_id)
        else:
            _json(resp, self._logic.complete(call, self._kind, model_id, client_watch(req)))


class Embeddings:
    def __init__(self, logic: ServingLogic, identity: ModelIdentity, config: AppConfig):
        self._logic = logic
        self._identity = identity
        self._config = config

    def on_post(self, req, resp):
        body = read_json(req, self._config.max_body_bytes)
        model_id = self._identity.get()
        _json(resp, self._logic.embed(protocol.parse_embeddings(body, model_id), model_id, client_watch(req)))


def create_app(config: AppConfig) -> falcon.App:
    client = EngineClient(config.engine_socket)
    middleware = [AuthMiddleware(KeyVerifier(config.keys_file), config.metrics_access)] if config.keys_file else []
    app = falcon.App(middleware=middleware)
    identity = ModelIdentity(client)
    logic = ServingLogic(client)
    app.add_route("/health", Health(client))
    app.add_route("/ready", Ready(client, config))
    app.add_route("/metrics", Metrics(client))
    app.add_route("/openapi.json", OpenAPIDocument())
    app.add_route("/v1/models", Models(identity))
    app.add_route("/v1/chat/completions", Generation(logic, identity, config, "chat"))
    app.add_route("/v1/completions", Generation(logic, identity, config, "completion"))
    app.add_route("/v1/embeddings", Embeddings(logic, identity, config))
    # Most specific last: falcon picks the handler registered for the closest class.
    app.add_error_handler(Exception, handle_unexpected)
    app.add_error_handler(falcon.HTTPError, handle_falcon_error)
    app.add_error_handler(APIError, handle_api_error)
    return app
