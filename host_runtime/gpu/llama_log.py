"""llama.cpp's log, taken in one place: warnings and errors go to Python logging (never swallowed), and
a `capture()` block collects the text llama.cpp writes meanwhile (its buffer-size reports, for the proof).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading

log = logging.getLogger("llama.cpp")
# ggml.h's ggml_log_level: 1 debug, 2 info, 3 warn, 4 error, 5 continuation of the previous message.
# (llama-cpp-python's own logger still maps the older numbering, and so misfiles every level.)
_LEVELS = {0: logging.INFO, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}

_lock = threading.Lock()
_captures: list[list[str]] = []
_installed = None
_pending: dict[str, object] = {"level": logging.INFO, "text": ""}


def _emit(level: int, text: str) -> None:
    """Forward whole lines at WARNING and above; llama.cpp sends some messages in pieces."""
    if level != 5:
        _pending["level"] = _LEVELS.get(level, logging.INFO)
    buf = str(_pending["text"]) + text
    *lines, rest = buf.split("\n")
    _pending["text"] = rest
    for line in lines:
        if line.strip() and int(_pending["level"]) >= logging.WARNING:
            log.log(int(_pending["level"]), "%s", line.strip())


def install() -> None:
    """Route llama.cpp's log through this module (idempotent; the callback must outlive every call)."""
    global _installed
    if _installed is not None:
        return
    import llama_cpp
    import llama_cpp._logger  # noqa: F401  (installs its own callback first; ours replaces it)

    @llama_cpp.llama_log_callback
    def callback(level: int, text: bytes, user_data) -> None:
        decoded = text.decode("utf-8", "replace")
        with _lock:
            for sink in _captures:
                sink.append(decoded)
            _emit(level, decoded)

    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
    _installed = callback


@contextlib.contextmanager
def capture():
    """Collect what llama.cpp logs (every level) inside the block; yields a list that fills with text pieces."""
    install()
    sink: list[str] = []
    with _lock:
        _captures.append(sink)
    try:
        yield sink
    finally:
        with _lock:
            _captures.remove(sink)
