"""Several models on one box: the gunicorn master keeps one engine process per loaded model (each the only holder
of its weights) and answers the HTTP workers on a control socket: which engine serves a model, starting it when
a request names a model from the store, unloading the least recently used idle ones to make room within the
memory budget, and those whose keep-alive has run out (engine/residency.py decides; this file acts).

The model given to `serve` (--model, or the built-in one) is started with the server and pinned: it is never
unloaded, and if its engine dies the server stops, so supervisord restarts the pair as before.
"""

from __future__ import annotations

import logging
import os
import queue
import socketserver
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from host_runtime.engine.client import EngineClient
from host_runtime.engine.errors import RequestRejected
from host_runtime.engine.ipc import EngineUnavailable, LineReader, MessageTooLarge, send_message
from host_runtime.models.errors import StoreError
from host_runtime.models.store import Store
from host_runtime.pool.engine_child import EngineChild
from host_runtime.pool.protocol import (DEFAULT_KEEP_ALIVE, Acquire, Acquired, Download, ListModels, PoolModel,
                                        Unload, refusal_to_wire, request_from_wire)
from host_runtime.pool.residency import Resident, expired, expires_in, load_room, plan_load

log = logging.getLogger("everycycle.serve")
JANITOR_S = 2.0


@dataclass
class Loaded:
    name: str
    path: str
    socket: str
    child: object              # engine_child.EngineChild
    pinned: bool
    keep_alive_s: float | None
    last_used: float = field(default_factory=time.monotonic)


class EnginePool:
    def __init__(self, *, run_dir: Path, default_name: str, default_path: str, default_socket: str, default_child,
                 engine_options, store: Store | None, budget_bytes: int, need_for, keep_alive_s: float | None):
        """engine_options(model_path) -> the settings of an engine for that model; need_for(model_path)
        -> the bytes it holds once loaded, by the placement planner's accounting (weights, KV, compute)."""
        self.run_dir = run_dir
        self.control_socket = str(run_dir / "models.sock")
        self.store = store
        self.budget = budget_bytes
        self._need_for = need_for
        self._needs: dict[tuple[str, float], int] = {}
        self.keep_alive_s = keep_alive_s
        self.engine_options = engine_options
        self.default_name = default_name
        self._lock = threading.Lock()
        self._loaded: dict[str, Loaded] = {default_name: Loaded(
            default_name, default_path, default_socket, default_child, True, None)}
        self._stopping = False
        # Engines taken out of _loaded whose processes are still stopping (up to 10 s each): their memory still
        # counts against the budget, but no lock is held while they stop (listing, /metrics and the capability map
        # went on waiting behind one before).
        self._stopping_bytes = 0
        self._launches: queue.Queue = queue.Queue()
        self.loads: Counter = Counter({default_name: 1})     # model -> engines started for it
        self.unloads: Counter = Counter()                     # (model, reason) -> engines stopped
        self.provisioned = None  # models.provisioned.ProvisionedPull: the bundle's model, pulled at first boot
        # Models whose load failed, with their file's (size, mtime) then and the reason: refused at once until the
        # file changes, instead of an engine started (and kept, 137 MB) for every retry.
        self._failed: dict[str, tuple[tuple[int, int] | None, str]] = {}

    # ---- what exists -----------------------------------------------------------------------------------------

    def _served_context(self, path: str, trained: int) -> int | None:
        """The context a model not loaded would be served at: its trained one, capped by the engines' setting
        (the planner may lower it further where memory is short; its engine's own figure replaces this)."""
        options = self.engine_options(path)
        cap = options.context.n_ctx_per_seq if options is not None else None
        return min(cap, trained) if cap else trained

    def _need(self, path: str) -> int:
        """Room a model takes, as the planner counts it (kept per file version: asked on every acquire and sweep)."""
        try:
            key = (path, os.path.getmtime(path))
        except OSError:
            return 0  # gone: its engine's own load says so
        if key not in self._needs:
            try:
                self._needs[key] = int(self._need_for(path))
            except Exception as exc:  # an unreadable table: the engine's load names the fault
                log.warning("could not plan %s (%s); counting its file size", path, exc)
                self._needs[key] = os.path.getsize(path)
        return self._needs[key]

    def available(self) -> dict[str, dict]:
        """Every model this box can serve, by name: the default one and the store's."""
        out = {self.default_name: {"path": self._loaded[self.default_name].path, "pinned": True,
                                   "context_length": None}}
        if self.store is not None:
            for m in self.store.list():
                out.setdefault(m.name, {"path": str(self.store.path_of(m)), "pinned": m.pinned,
                                        "context_length": m.context_length})
        return out

    def listing(self) -> list[PoolModel]:
        with self._lock:
            loaded = dict(self._loaded)
            room_now = self.budget - self._stopping_bytes
        now = time.monotonic()
        rows = []
        available = self.available()
        # Each loaded engine asked once: its state for its row, whether it is busy for the others' room.
        answers = {name: _engine_info(entry.socket) for name, entry in loaded.items()}
        residents = None  # only where a model is not loaded
        for name, info in available.items():
            state, served, trained, room = "available", None, info["context_length"], None
            if name in loaded:
                state, served, n_ctx_train = _state_of(answers[name])
                trained = trained or n_ctx_train
            else:
                if residents is None:
                    residents = self._residents(loaded.values(), available, answers)
                room = load_room(plan_load(self._need(info["path"]), room_now, residents))
            if served is None and trained and name != self.default_name:
                served = self._served_context(info["path"], trained)
            pinned = bool(info["pinned"]) or name == self.default_name
            rows.append(PoolModel(name, state, pinned, served, loaded[name].socket if name in loaded else None,
                                  trained_context_length=trained,
                                  expires_in_s=None if pinned or name not in loaded
                                  else expires_in(loaded[name].keep_alive_s, loaded[name].last_used, now),
                                  room=room, size_bytes=_file_size(info["path"])))
        pulling = self.provisioned.status if self.provisioned is not None else None
        if pulling is not None and pulling.state != "pulled" and all(r.id != pulling.name for r in rows):
            rows.append(PoolModel(pulling.name, "downloading" if pulling.state != "failed" else "failed",
                                  download=Download(pulling.done_bytes, pulling.total_bytes, pulling.error or None)))
        return rows

    def snapshot(self) -> dict:
        """What /metrics shows of the pool: each loaded model's planned and resident memory, the load and
        unload counts, and the bundle's pull."""
        with self._lock:
            loaded = [(e.name, e.path, getattr(e.child, "proc", None)) for e in self._loaded.values()]
        memory = {}
        for name, path, proc in loaded:
            memory[name] = {"planned": self._need(path), "resident": _rss(proc)}
        status = self.provisioned.status if self.provisioned is not None else None
        return {"memory": memory, "budget": self.budget, "loads": dict(self.loads),
                "unloads": [(m, r, n) for (m, r), n in self.unloads.items()], "pull": status}

    # ---- acquiring -----------------------------------------------------------------------------------------

    def acquire(self, name: str, keep_alive_s: float | None | str = DEFAULT_KEEP_ALIVE) -> Acquired:
        """The engine serving `name`, loading it first if needed; RequestRejected when it cannot be."""
        keep = self.keep_alive_s if keep_alive_s == DEFAULT_KEEP_ALIVE else keep_alive_s
        with self._lock:
            if name in self._loaded:
                return self._loaded_answer(name, keep)
        self._check_file(name)  # without the lock: it may hash gigabytes
        with self._lock:
            if name in self._loaded:  # loaded by another request meanwhile
                return self._loaded_answer(name, keep)
            info = self.available().get(name)
            if info is None and self.provisioned is not None and self.provisioned.status.name == name \
                    and self.provisioned.status.state != "failed":
                status = self.provisioned.status
                done = f"{status.done_bytes / 2**20:,.0f} of {status.total_bytes / 2**20:,.0f} MiB" \
                    if status.total_bytes else f"{status.done_bytes / 2**20:,.0f} MiB"
                raise _refusal(503, f"'{name}' is still being pulled onto this box ({done}); retry later",
                                code="model_downloading", error_type="server_busy", retry_after=30)
            if info is None:
                raise _refusal(404, f"the model '{name}' does not exist on this box; it has: "
                                     f"{', '.join(sorted(self.available()))} (everycycle models pull)",
                                code="model_not_found")
            need = self._need(info["path"])
            plan = plan_load(need, self.budget - self._stopping_bytes, self._residents())
            if plan.shortfall:
                raise _refusal(507, f"'{name}' needs about {need / 2**30:.2f} GiB with its KV cache and compute buffers; the models' "
                                     f"memory budget is {self.budget / 2**30:.2f} GiB ({plan.shortfall / 2**30:.2f} "
                                     "GiB short) even with nothing else loaded", code="insufficient_memory",
                                error_type="server_error")
            if plan.pinned_hold:
                raise _refusal(507, f"'{name}' needs about {need / 2**30:.2f} GiB; pinned models hold "
                                     f"{plan.pinned_hold / 2**30:.2f} GiB of the {self.budget / 2**30:.2f} GiB budget "
                                     "(everycycle models pin --off)", code="insufficient_memory",
                                error_type="server_error")
            if plan.wait:
                raise _refusal(503, f"no room to load '{name}' until a busy model goes idle; retry shortly",
                                code="models_busy", error_type="server_busy", retry_after=5)
            victims = [self._take_out_locked(victim, f"to make room for {name}", "room") for victim in plan.evict]
            socket_path = str(self.run_dir / f"engine-{name}.sock")

            child = EngineChild(socket_path, self.engine_options(info["path"]))
            # Listed from now on (a second acquire of it waits for this load); started once the victims are gone.
            self._loaded[name] = Loaded(name, info["path"], socket_path, child, bool(info["pinned"]), keep)
            self.loads[name] += 1
        self._finish_stopping(victims)
        self._launch(child, lambda n=name: self._died(n))
        log.info("loading %s on demand (about %.2f GiB; budget %.2f GiB)", name, need / 2**30, self.budget / 2**30)
        return Acquired(socket_path, "loading")

    def _loaded_answer(self, name: str, keep) -> Acquired:
        """Under the lock: the engine serving `name`. One whose load failed is taken out (its process stopped)
        and the failure kept against its file, so the next request after the file changes loads it afresh."""
        entry = self._loaded[name]
        info = _engine_info(entry.socket)
        state = _state_of(info)[0]
        if state == "failed" and name != self.default_name:
            reason = _reason_of(info)
            self._failed[name] = (_file_signature(entry.path), reason)
            taken = self._take_out_locked(name, "its load failed", "failed")
            threading.Thread(target=self._finish_stopping, args=([taken],), daemon=True).start()
            raise _load_failed(name, reason)
        entry.last_used = time.monotonic()
        if not entry.pinned:
            # A request may lengthen a loaded model's stay, never shorten it: one key's keep_alive 0
            # would unload a model other keys use (hardening #35, item 7).
            entry.keep_alive_s = longer_keep_alive(entry.keep_alive_s, keep)
        return Acquired(entry.socket, state)

    def _check_file(self, name: str) -> None:
        """Before an engine is started for a store model: its file is the one admitted (Store.verify), and not
        one whose load failed unchanged since."""
        if self.store is None or name == self.default_name:
            return
        try:
            manifest = self.store.get(name)
        except StoreError:
            return  # not in the store: acquire says so
        failed = self._failed.get(name)
        if failed is not None:
            if failed[0] == _file_signature(str(self.store.path_of(manifest))):
                raise _load_failed(name, failed[1])
            self._failed.pop(name, None)  # the file changed: load it again
        try:
            self.store.verify(manifest)
        except StoreError as exc:
            raise _refusal(409, str(exc), code="model_damaged", param="model") from None

    def _launch(self, child, on_exit) -> None:
        """Start an engine from the launcher thread, which lives as long as the pool: an engine dies with the
        thread that started it (PR_SET_PDEATHSIG), and a request's handler thread ends with the request."""
        done = threading.Event()
        self._launches.put((child, on_exit, done))
        done.wait()

    def _launcher(self) -> None:
        while True:
            child, on_exit, done = self._launches.get()
            try:
                child.start(on_exit)
            finally:
                done.set()

    def _residents(self, entries=None, available=None, answers=None) -> list[Resident]:
        """answers: each engine's `info` by model name, where the caller asked already (else asked now)."""
        # Pinning is read from the store each time: `models pin` applies to a model already loaded too.
        available = self.available() if available is None else available
        return [Resident(e.name, self._need(e.path), e.last_used,
                         _busy_of(answers[e.name] if answers is not None else _engine_info(e.socket)),
                         e.pinned or bool(available.get(e.name, {}).get("pinned")), e.keep_alive_s)
                for e in (self._loaded.values() if entries is None else entries)]

    def _take_out_locked(self, name: str, why: str, reason: str) -> tuple[Loaded, int]:
        """Take an engine out of the pool (under the lock); _finish_stopping stops it after the lock is released.
        reason: the metric's label (room, keep_alive, removed, stopping)."""
        entry = self._loaded.pop(name)
        self.unloads[(name, reason)] += 1
        log.info("unloading %s (%s)", name, why)
        need = self._need(entry.path)
        self._stopping_bytes += need
        return entry, need

    def _finish_stopping(self, taken: list[tuple[Loaded, int]]) -> None:
        """Stop engines taken out of the pool, without its lock (each may take up to 10 s)."""
        for entry, need in taken:
            try:
                entry.child.stop()
                Path(entry.socket).unlink(missing_ok=True)
            finally:
                with self._lock:
                    self._stopping_bytes -= need

    def _died(self, name: str) -> None:
        with self._lock:
            entry = self._loaded.pop(name, None)
        if entry is not None and not self._stopping:
            self.unloads[(name, "exited")] += 1
            log.error("the engine for %s exited unexpectedly; it loads again when next asked for", name)

    def unload(self, name: str) -> bool:
        """`models rm --force`: stop the engine holding a model before its files go. The model the server
        started with cannot be: the server lives and dies with it."""
        with self._lock:
            if name == self.default_name:
                raise _refusal(409, f"'{name}' is the model the server started with (serving.toml or --model): "
                                     "change that and restart the serving service first", code="model_in_use")
            if name not in self._loaded:
                return False
            taken = [self._take_out_locked(name, "its removal was asked for", "removed")]
        self._finish_stopping(taken)
        return True

    # ---- housekeeping --------------------------------------------------------------------------------------

    def sweep(self) -> None:
        """Unload what has idled past its keep-alive."""
        with self._lock:
            taken = [self._take_out_locked(name, "its keep-alive passed", "keep_alive")
                     for name in expired(self._residents(), time.monotonic())]
        self._finish_stopping(taken)

    def start(self) -> None:
        Path(self.control_socket).unlink(missing_ok=True)
        pool = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                try:
                    message = LineReader(self.request).read()
                except (OSError, ValueError, MessageTooLarge):
                    return
                if not message:
                    return
                try:
                    request = request_from_wire(message)
                    if isinstance(request, Acquire):
                        acquired = pool.acquire(request.model, request.keep_alive)
                        reply = asdict(acquired)
                    elif isinstance(request, ListModels):
                        reply = {"models": [m.to_wire() for m in pool.listing()]}
                    elif isinstance(request, Unload):
                        reply = {"unloaded": pool.unload(request.model)}
                    else:
                        from host_runtime.pool.metrics import pool_text

                        reply = {"text": pool_text(pool.snapshot())}
                except ValueError as exc:
                    reply = refusal_to_wire(RequestRejected(500, str(exc), error_type="server_error"))
                except RequestRejected as exc:
                    reply = refusal_to_wire(exc)
                try:
                    send_message(self.request, reply)
                except OSError:
                    pass

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        self._server = Server(self.control_socket, Handler)
        os.chmod(self.control_socket, 0o600)
        threading.Thread(target=self._server.serve_forever, name="engine-pool", daemon=True).start()
        threading.Thread(target=self._launcher, name="engine-launcher", daemon=True).start()

        def janitor():
            while not self._stopping:
                time.sleep(JANITOR_S)
                try:
                    self.sweep()
                except Exception:  # housekeeping must not take the server down
                    log.exception("engine pool sweep failed")

        threading.Thread(target=janitor, name="engine-pool-janitor", daemon=True).start()
        if self.provisioned is not None:
            self.provisioned.start()

    def load_pulled(self, name: str) -> None:
        """The bundle's model has arrived: load it now and keep it (it is the default from the next start)."""
        try:
            self.acquire(name, None)
        except RequestRejected as exc:
            log.error("the pulled model %s could not be loaded: %s", name, exc.message)

    def stop(self) -> None:
        self._stopping = True
        if self.provisioned is not None:
            self.provisioned.stop()
        with self._lock:
            taken = [self._take_out_locked(name, "the server stops", "stopping")
                     for name in [n for n in self._loaded if n != self.default_name]]
        self._finish_stopping(taken)
        server = getattr(self, "_server", None)
        if server is not None:
            server.shutdown()
            server.server_close()


def _refusal(status: int, message: str, **kw) -> RequestRejected:
    """A refusal, as the engine's own (the workers turn it into the API's error)."""
    kw.setdefault("param", "model" if status != 500 else None)
    return RequestRejected(status, message, **kw)


def longer_keep_alive(a: float | None, b: float | None) -> float | None:
    """The longer of two keep-alives (None: forever)."""
    return None if a is None or b is None else max(a, b)


def _engine_info(socket_path: str):
    """The engine's answer to `info`, or None where it does not answer (starting, or stuck)."""
    try:
        return EngineClient(socket_path).info(timeout=1.0)
    except EngineUnavailable:
        return None


def _state_of(info) -> tuple[str, int | None, int | None]:
    """(loaded, loading or failed, as the engine says; the context it serves at; the one it was trained for)."""
    if info is None:
        return "loading", None, None
    return {"ready": "loaded", "loading": "loading"}.get(info.state, info.state or "loading"), info.n_ctx, \
        info.n_ctx_train


def _reason_of(info) -> str:
    return "its engine stopped answering" if info is None else info.reason or "no reason given"


def _file_size(path: str) -> int | None:
    try:
        return os.path.getsize(path)
    except OSError:
        return None


def _file_signature(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def _load_failed(name: str, reason: str) -> RequestRejected:
    """A model that does not load is the state of its file, which the owner can change: a 409, not a 5xx."""
    return _refusal(409, f"the model '{name}' failed to load: {reason}; replace its file (everycycle models rm, "
                         "then models add|pull) and ask again", code="model_load_failed", param="model")


def _rss(proc) -> int | None:
    """An engine's resident memory (weights paged in, KV, buffers), or None once it is gone."""
    import psutil

    try:
        return psutil.Process(proc.pid).memory_info().rss if proc is not None else None
    except (psutil.Error, AttributeError):
        return None


def _busy_of(info) -> bool:
    return True if info is None else info.busy  # starting or stuck: not a candidate to unload now
