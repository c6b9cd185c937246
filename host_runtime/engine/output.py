"""One choice's output (pure): the sampled tokens' bytes into text, the stop strings, gpt-oss's channels rewritten
(engine/harmony.py). The engine loop samples and hands each token's piece here; what comes back is the text to
send and whether a stop string ended the choice. vLLM's output processor does this job apart from its scheduler.
"""

from __future__ import annotations

import codecs

from host_runtime.engine.harmony import HarmonyText
from host_runtime.engine.stop_matcher import StopMatcher


class ChoiceOutput:
    def __init__(self, stops: list[str], harmony: bool = False):
        self._stop = StopMatcher(stops)
        # a piece may end inside a character: its bytes wait for the rest ("replace" where they never come)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._harmony = HarmonyText() if harmony else None

    def piece(self, data: bytes) -> tuple[str, bool]:
        """(the text to send now, whether a stop string matched: the choice ends, the stop string unsent)."""
        text, hit_stop = self._stop.feed(self._decoder.decode(data))
        return self._shaped(text), hit_stop

    @property
    def stop_string(self) -> str | None:
        """The stop string that matched, once piece() said one did."""
        return self._stop.matched

    def flush(self) -> str:
        """What is still held (a character's first bytes, a possible stop string's start): the choice ends another
        way (end of generation, its length), so it is text after all."""
        return self._shaped(self._decoder.decode(b"", final=True) + self._stop.flush())

    def finish(self) -> str:
        """The harmony rewriter's held text, at the choice's end ('' without one)."""
        return self._harmony.finish() if self._harmony is not None else ""

    def _shaped(self, text: str) -> str:
        return self._harmony.feed(text) if self._harmony is not None else text
