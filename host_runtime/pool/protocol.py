"""The engine pool's control socket (RUN_DIR/models.sock): its requests and replies as typed structures, and the
client the HTTP workers and `everycycle models` use. The pool (pool.py) answers with the same types.

A refusal is the engine's own RequestRejected on the wire ({"error": ...}), so that the workers turn it into the
API's error the way they turn an engine's."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from host_runtime.engine.errors import RequestRejected
from host_runtime.engine.ipc import LineClient

DEFAULT_KEEP_ALIVE = "default"  # the request said nothing: the pool's --keep-alive applies


@dataclass(frozen=True)
class Download:
    """The bundle's model while it is pulled (or why its pull failed)."""
    done_bytes: int
    total_bytes: int | None
    error: str | None = None


@dataclass(frozen=True)
class PoolModel:
    id: str
    state: str                  # loaded, loading, available, downloading, failed
    pinned: bool = False
    context_length: int | None = None  # the context it is served at (its engine's; else what its engine would get)
    socket: str | None = None   # its engine's socket, while it has one
    download: Download | None = None
    trained_context_length: int | None = None  # what it was trained for (its GGUF's context_length)
    # A loaded model's seconds until its keep-alive unloads it, counted from its last use (None: it stays: pinned,
    # the server's own, or keep_alive forever); Ollama's /api/ps says it as expires_at
    expires_in_s: float | None = None
    # A model not loaded: what loading it would take now (fleet/capabilities.ModelCapability.room says the values)
    room: str | None = None
    size_bytes: int | None = None  # its file

    def to_wire(self) -> dict:
        return asdict(self)

    @classmethod
    def from_wire(cls, doc: dict) -> "PoolModel":
        download = doc.get("download")
        return cls(str(doc["id"]), str(doc["state"]), bool(doc.get("pinned")), doc.get("context_length"),
                   doc.get("socket"), Download(**download) if download else None, doc.get("trained_context_length"),
                   doc.get("expires_in_s"), doc.get("room"), doc.get("size_bytes"))


# ---- requests ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Acquire:
    """The engine serving `model`, loaded first if it is not (the caller waits for it to be ready)."""
    model: str
    keep_alive: float | None | str = DEFAULT_KEEP_ALIVE  # seconds; None: forever


@dataclass(frozen=True)
class ListModels:
    pass


@dataclass(frozen=True)
class Unload:
    model: str


@dataclass(frozen=True)
class PoolMetrics:
    pass


OPS = {"acquire": Acquire, "list": ListModels, "unload": Unload, "metrics": PoolMetrics}
_OP_OF = {cls: op for op, cls in OPS.items()}


def request_to_wire(request) -> dict:
    return {"op": _OP_OF[type(request)], **asdict(request)}


def request_from_wire(doc: dict):
    """The typed request; ValueError naming what is wrong."""
    cls = OPS.get(doc.get("op")) if isinstance(doc, dict) else None
    if cls is None:
        raise ValueError(f"unknown engine pool op {doc.get('op') if isinstance(doc, dict) else doc!r}")
    try:
        return cls(**{k: v for k, v in doc.items() if k != "op"})
    except TypeError as exc:
        raise ValueError(f"engine pool op {doc['op']}: {exc}") from None


# ---- replies -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Acquired:
    socket: str
    state: str


def refusal_to_wire(rejected: RequestRejected) -> dict:
    return {"error": rejected.to_wire()}


def _raise_refusal(reply: dict) -> dict:
    if "error" in reply:
        raise RequestRejected.from_wire(reply["error"])
    return reply


class PoolClient:
    """Calls to the pool. EngineUnavailable when it does not answer; RequestRejected when it refuses."""

    def __init__(self, socket_path: str):
        self._client = LineClient(socket_path)

    def _call(self, request, timeout: float) -> dict:
        return _raise_refusal(self._client.call(request_to_wire(request), timeout=timeout))

    def acquire(self, model: str, keep_alive=DEFAULT_KEEP_ALIVE, timeout: float = 30.0) -> Acquired:
        return Acquired(**self._call(Acquire(model, keep_alive), timeout))

    def models(self, timeout: float = 10.0) -> list[PoolModel]:
        return [PoolModel.from_wire(row) for row in self._call(ListModels(), timeout)["models"]]

    def unload(self, model: str, timeout: float = 60.0) -> bool:
        return bool(self._call(Unload(model), timeout)["unloaded"])

    def metrics_text(self, timeout: float = 5.0) -> str:
        return str(self._call(PoolMetrics(), timeout)["text"])
