"""Which engine answers a request: the one serving the model it names. The model `serve` started with answers
directly; any other model of the store is asked of the engine pool in the gunicorn master (pool/pool.py),
which loads it on demand; the request waits (bounded) while it loads."""

from __future__ import annotations

import fnmatch
import threading

from dataclasses import replace

import tenacity

from host_runtime.engine.client import EngineClient
from host_runtime.engine.errors import RequestRejected
from host_runtime.engine.ipc import EngineUnavailable
from host_runtime.engine.wire import EngineInfo
from host_runtime.serving.errors import APIError
from host_runtime.serving.handlers import engine_down
from host_runtime.pool.protocol import PoolClient, PoolModel

LOAD_WAIT_S = 300.0  # a request for a model that is loading waits this long at most
POLL_S = 0.25
# Requests of one HTTP worker that may wait for a model's load at once: each holds a thread the engine's admission
# does not count (http_threads.py sizes for it, plus a reserve of 16 for health and metrics), so more would take
# the threads that requests for loaded models and /health need. Past it: a 503 with Retry-After at once.
MAX_LOAD_WAITERS = 8


class Router:
    def __init__(self, default: EngineClient, pool_socket: str | None = None, aliases: dict[str, str] | None = None):
        self.default = default
        self.pool = PoolClient(pool_socket) if pool_socket else None
        self.aliases = aliases or {}  # box.toml's [serving] aliases: another name -> the model that answers
        self._default_info: EngineInfo | None = None
        self._lock = threading.Lock()
        self._load_waiters = threading.BoundedSemaphore(MAX_LOAD_WAITERS)

    def default_info(self) -> EngineInfo:
        """The default engine's info (model id, context, tool format), kept once it is ready."""
        if self._default_info is None:
            try:
                info = self.default.info(timeout=5.0)
            except EngineUnavailable as exc:
                raise engine_down(exc) from None
            if not info.ready:
                return info
            with self._lock:
                self._default_info = info
        return self._default_info

    def engine_for(self, model, keep_alive="default") -> tuple[EngineClient, EngineInfo]:
        """(the engine's client, its info) for the model a request names (None or not a string: the default's,
        so that the wire schema names the field)."""
        target = self.alias_target(model) if isinstance(model, str) else None
        if target is not None:
            # Answered under the name asked for (as Ollama answers for a copied model), so that the APIs' own
            # check of the body's model holds and the client sees the name it uses.
            client, info = self.engine_for(target, keep_alive)
            return client, replace(info, model_id=model)
        info = self.default_info()
        if not isinstance(model, str) or model == info.model_id or self.pool is None:
            return self.default, info
        try:
            acquired = self.pool.acquire(model, keep_alive)  # its refusal (RequestRejected) is the API's answer
        except EngineUnavailable as exc:
            raise engine_down(exc) from None
        client = EngineClient(acquired.socket)
        try:
            info = client.info(timeout=5.0)
            if info.ready:
                return client, info
        except EngineUnavailable:
            pass  # its engine is starting: wait below
        if not self._load_waiters.acquire(blocking=False):
            raise APIError(503, f"the model '{model}' is loading, and {MAX_LOAD_WAITERS} requests already wait "
                                "here for models to load; retry shortly", error_type="server_busy",
                           code="model_loading", retry_after=10)
        try:
            return self._wait_for_load(client, model)
        finally:
            self._load_waiters.release()

    def _wait_for_load(self, client: EngineClient, model: str) -> tuple[EngineClient, EngineInfo]:
        def look() -> EngineInfo | None:
            try:
                info = client.info(timeout=5.0)
            except EngineUnavailable:
                return None  # its engine is starting: the socket comes first
            if info.state == "failed":  # its file's state, which the owner can change (the pool's refusal too)
                raise APIError(409, f"the model '{model}' failed to load: {info.reason}; replace its file "
                                    "(everycycle models rm, then models add|pull) and ask again",
                               code="model_load_failed", param="model")
            return info

        def gave_up(_) -> None:
            raise APIError(503, f"the model '{model}' is still loading after {LOAD_WAIT_S:.0f} s; retry shortly",
                           error_type="server_busy", code="model_loading", retry_after=10)

        # Ask every POLL_S until it is ready (a failed load is the answer at once), for LOAD_WAIT_S at most.
        info = tenacity.Retrying(retry=tenacity.retry_if_result(lambda info: info is None or not info.ready),
                                 wait=tenacity.wait_fixed(POLL_S), stop=tenacity.stop_after_delay(LOAD_WAIT_S),
                                 retry_error_callback=gave_up)(look)
        return client, info

    def alias_target(self, name: str) -> str | None:
        """The model an alias names: an exact alias first, then the first pattern (in box.toml's order) that
        matches; None for a name no alias covers (a model's own name is never an alias's)."""
        if name in self.aliases:
            return self.aliases[name]
        pattern = self.covering_alias(name)
        # Only a name a pattern matches costs a look at the models (the pool is asked once, not on every request).
        return None if pattern is None or name in self._model_names() else self.aliases[pattern]

    def covering_alias(self, name: str) -> str | None:
        """The alias, or the first pattern in box.toml's order, that names `name`, whatever models there are."""
        if name in self.aliases:
            return name
        return next((pattern for pattern in self.aliases
                     if any(c in pattern for c in "*?") and fnmatch.fnmatchcase(name, pattern)), None)

    def _model_names(self) -> set[str]:
        names = {self.default_info().model_id}
        if self.pool is not None:
            try:
                names |= {r.id for r in self.pool.models(timeout=5.0)}
            except EngineUnavailable:
                pass
        return names

    def models(self) -> list[PoolModel]:
        """Every model with its state (loaded, loading, available, downloading) and context length."""
        info = self.default_info()
        if self.pool is None:
            rows = [PoolModel(info.model_id, "loaded" if info.ready else "loading", True, info.n_ctx,
                              trained_context_length=info.n_ctx_train)]
        else:
            try:
                rows = self.pool.models()
            except EngineUnavailable as exc:
                raise engine_down(exc) from None
            # The default engine's context is what it runs with, not what the file was trained for.
            rows = [replace(r, context_length=info.n_ctx, trained_context_length=info.n_ctx_train)
                    if r.id == info.model_id else r for r in rows]
        # Each alias is listed as the model it names (clients pick from the list); an alias of a model the box
        # lacks is not listed, and a request for it gets the model's own 404.
        # (A pattern is not a name a client could pick: not listed.)
        by_id = {r.id: r for r in rows}
        return rows + [replace(by_id[target], id=alias, socket=None) for alias, target in sorted(self.aliases.items())
                       if target in by_id and not any(c in alias for c in "*?")]

    def loaded_clients(self) -> list[EngineClient]:
        """Clients of every loaded engine (for /metrics)."""
        clients = [self.default]
        if self.pool is not None:
            try:
                rows = self.pool.models(timeout=5.0)
            except EngineUnavailable:
                return clients
            default_id = self.default_info().model_id
            clients += [EngineClient(r.socket) for r in rows if r.socket and r.id != default_id]
        return clients

    def pool_metrics(self) -> str:
        """The pool's own families (loaded models, memory, loads and unloads, the bundle's pull), or nothing."""
        if self.pool is None:
            return ""
        try:
            return self.pool.metrics_text()
        except (EngineUnavailable, RequestRejected):
            return ""
