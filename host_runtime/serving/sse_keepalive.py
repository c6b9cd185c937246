"""A streamed answer that says it is alive while the engine is quiet: an SSE comment whenever no chunk came for
KEEPALIVE_S (#55: an engine stalled 22 s sent its streams no byte, and a client or proxy with a shorter read
timeout dropped them). Comments are SSE's own no-op lines: every client ignores them."""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Iterable, Iterator

KEEPALIVE_S = 15.0  # well under the read timeouts clients and proxies use (nginx's default 60 s, many SDKs' 30+)
COMMENT = b": keep-alive\n\n"
_DONE = object()


class _Raised:
    def __init__(self, exc: BaseException):
        self.exc = exc


def with_keepalive(chunks: Iterable[bytes], every_s: float = KEEPALIVE_S) -> Iterator[bytes]:
    """The chunks as they come, and COMMENT after every every_s without one. A thread reads them (the request's
    context carried over: its trace, its key); a client that leaves ends this generator, and the reader's stream
    ends on its own at its next check of the client (engine/ipc.py)."""
    handoff: queue.SimpleQueue = queue.SimpleQueue()
    stop = threading.Event()

    def pump() -> None:
        try:
            for chunk in chunks:
                handoff.put(chunk)
                if stop.is_set():
                    break
        except BaseException as exc:  # noqa: BLE001 - raised again where the chunks are read
            handoff.put(_Raised(exc))
        finally:
            handoff.put(_DONE)

    threading.Thread(target=contextvars.copy_context().run, args=(pump,), name="sse-pump", daemon=True).start()
    try:
        while True:
            try:
                item = handoff.get(timeout=every_s)
            except queue.Empty:
                yield COMMENT
                continue
            if item is _DONE:
                return
            if isinstance(item, _Raised):
                raise item.exc
            yield item
    finally:
        stop.set()
