"""Stop strings over a token stream (pure).

Text that could be the start of a stop string is held back until it either
completes the stop (and is dropped) or diverges (and is released), so a client
never sees part of a stop string.
"""

from __future__ import annotations


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper start of `marker`: what to hold back while a marker
    (a stop string, a think tag, a harmony header) may be arriving."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class StopMatcher:
    def __init__(self, stops: list[str]):
        self._stops = [s for s in stops if s]
        self._held = ""
        self.matched: str | None = None  # the stop string that ended the text (the Messages API reports it)

    def feed(self, text: str) -> tuple[str, bool]:
        """Add generated text; return (text safe to emit, whether a stop string was hit)."""
        buf = self._held + text
        if not self._stops:
            self._held = ""
            return buf, False
        first = min((i for i in (buf.find(s) for s in self._stops) if i >= 0), default=-1)
        if first >= 0:
            self.matched = next(s for s in self._stops if buf.find(s) == first)
            self._held = ""
            return buf[:first], True
        keep = max(partial_suffix(buf, stop) for stop in self._stops)
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """At the end of generation, whatever was held back is real output."""
        held, self._held = self._held, ""
        return held
