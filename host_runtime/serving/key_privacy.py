"""What one API key may learn of the others (#56, item 12), pure.

/metrics is readable by any key by default (front.toml's metrics = "key"), and it named every key with its
request and token counts. A key now sees its own per-key series and no other key's, unless it is the owner's
(granted --may-pull) or the reader is the box itself (the console over the API's socket) or the owner opened
/metrics to a scraper (metrics = "open" or "loopback"): the per-key series are theirs to read.

The prefix cache was scoped by the key's name, so a new key given a revoked key's name found its cached prompts;
a scope is now the name and a digest of the key itself, which a new key of the same name does not share."""

from __future__ import annotations

import functools
import hashlib
import re

_KEY_LABEL = re.compile(r'[{,]key="((?:[^"\\]|\\.)*)"')


def metrics_for_key(text: str, own: str | None) -> str:
    """Prometheus text with every sample of another key's series left out (`own` None: every per-key one)."""
    kept = []
    for line in text.splitlines(keepends=True):
        if not line.startswith("#"):
            found = _KEY_LABEL.search(line)
            if found is not None and found.group(1) != own:
                continue
        kept.append(line)
    return "".join(kept)


@functools.lru_cache(maxsize=1024)  # asked on every generation request; a box has few keys
def cache_scope_of(name: str, key_sha256: str) -> str:
    """A key's prefix-cache scope: its name (readable in the engine's log) and a digest of the key's own hash, so
    that a key made later under the same name starts with an empty scope."""
    return f"{name}#{hashlib.sha256(('prefix-scope:' + key_sha256).encode()).hexdigest()[:12]}"
