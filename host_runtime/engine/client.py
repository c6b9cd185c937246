"""The typed client of an engine process, used by the HTTP workers, the pool and the tools: engine/wire.py's
requests in, its replies and events out. EngineUnavailable when the engine does not answer (ipc.py), its
RequestRejected when it refuses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Iterator

from host_runtime.engine import wire
from host_runtime.engine.ipc import EngineUnavailable, LineClient, LineStream


def _decode(doc: dict):
    try:
        return wire.event_from_wire(doc)
    except wire.WireError as exc:
        raise EngineUnavailable(f"the engine answered something this worker cannot read: {exc}") from None


class Quiet:
    """A generation's stream had no event for its quiet_s (the engine busy with a long prompt, or stalled): a
    streaming handler says it is alive (an SSE comment), so that no client's or proxy's read timeout drops it."""


QUIET = Quiet()


class GenerationStream:
    """One generation's events after `Accepted`: Token and Finish, ending with Done or Error; with `quiet_s` set,
    QUIET between them wherever the engine sent nothing for that long. `close()` (or leaving the `with`) cancels
    the generation at the engine."""

    def __init__(self, lines: LineStream, accepted: wire.Accepted):
        self._lines = lines
        self.prompt_tokens = accepted.prompt_tokens
        self.thinking = accepted.thinking  # how the answer starts (engine/reasoning.py MODES)
        self.on_event: Callable[[object], None] | None = None  # sees each event first (serving/tracing.py)
        self.quiet_s: float | None = None

    def __iter__(self) -> Iterator[wire.Token | wire.Finish | wire.Done | wire.Error | Quiet]:
        while True:
            line = self._lines.next_line_or_quiet(self.quiet_s)
            if line is None:
                yield QUIET
                continue
            event = _decode(line)
            if self.on_event is not None:
                self.on_event(event)
            yield event
            if isinstance(event, wire.FINAL):
                return

    def close(self) -> None:
        self._lines.close()

    def __enter__(self) -> "GenerationStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class EngineClient:
    def __init__(self, socket_path: str, timeout: float = 10.0):
        self._lines = LineClient(socket_path, timeout)
        self.socket_path = socket_path

    def call(self, request, timeout: float | None = None, client_gone: Callable[[], bool] | None = None):
        """One request, its one typed reply (wire.REPLY_OF). With `client_gone`, a client that leaves first
        closes the call (ipc.ClientGone)."""
        reply = _decode(self._lines.call(wire.request_to_wire(request), timeout, client_gone))
        if isinstance(reply, wire.Error):
            raise reply.error
        expected = wire.REPLY_OF[type(request)]
        if not isinstance(reply, expected):
            raise EngineUnavailable(f"the engine answered {type(request).__name__} with {type(reply).__name__}")
        return reply

    def info(self, timeout: float = 5.0) -> wire.EngineInfo:
        return self.call(wire.Info(), timeout)

    def generate(self, request: wire.Generate, first_event_timeout: float, idle_timeout: float,
                 client_gone: Callable[[], bool] | None = None) -> GenerationStream:
        """Start a generation and wait until the engine accepts it (its refusal raised as RequestRejected)."""
        lines = self._lines.stream(wire.request_to_wire(request), first_event_timeout, idle_timeout, client_gone)
        try:
            first = _decode(lines.next_line())
            if isinstance(first, wire.Error):
                raise first.error
            if not isinstance(first, wire.Accepted):
                raise EngineUnavailable(f"the engine began a generation with {type(first).__name__}")
        except BaseException:
            lines.close()
            raise
        return GenerationStream(lines, first)
