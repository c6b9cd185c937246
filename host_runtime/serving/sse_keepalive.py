"""A streamed answer that says it is alive while the engine is quiet: an SSE comment whenever no event came for
KEEPALIVE_S (#55: an engine stalled 22 s sent its streams no byte, and a client or proxy with a shorter read
timeout dropped them). Comments are SSE's own no-op lines: every client ignores them.

The wait is the engine stream's own (engine/ipc.py LineStream, its select() bounded by KEEPALIVE_S): each SSE
handler opens its generation with ServingLogic.open_stream (quiet_s=KEEPALIVE_S) and answers the stream's QUIET
with KEEPALIVE_COMMENT. A thread that read the events and handed each to the response (the way this was done
first) woke every HTTP worker once more per token: without it the workers' CPU a token was 0.84x (0.80-0.87x) at 8 clients and 0.89x at 1, the
tok/s 1.01x (0.95-1.02x) and 1.01x (0.95-1.06x): within the noise (six alternations each, 2-core EPYC)."""

from __future__ import annotations

import os

# Well under the read timeouts clients and proxies use (nginx's default 60 s, many SDKs' 30+); the tests shorten it.
KEEPALIVE_S = float(os.environ.get("EVERYCYCLE_TEST_KEEPALIVE_S") or 15.0)
KEEPALIVE_COMMENT = b": keep-alive\n\n"
