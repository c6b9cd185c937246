"""Room in the engine's waiting queue (pure): a key's flood and a batch job leave room for everyone else.

One queue for every key and class let one key's burst take it all: 200 requests from 50 clients with one key got
176 x 503 queue_full, and another key's stream was admitted on its 4th try (#55); a batch key with no concurrency
bound filled it and every interactive request got 503 (#56, item 7). Now a key holds at most its share of the
places (the queue over the keys waiting, plus one for a newcomer), and batch requests leave the last quarter to
the other classes.
"""

from __future__ import annotations

from collections import Counter

from host_runtime.engine.errors import RequestRejected

KEPT_FROM_BATCH = 4  # batch requests may fill the queue but its last 1/4 (at least one place)


def key_share(max_waiting: int, other_keys_waiting: int) -> int:
    """The places one key may hold while `other_keys_waiting` other keys have requests waiting: one share for
    each, and one more left for a key that is not waiting yet."""
    return max(1, max_waiting // (other_keys_waiting + 2))


def refusal(waiting_by_key: Counter, n_waiting: int, max_waiting: int, key: str | None,
            priority: str) -> RequestRejected | None:
    """Why a request of `key` and `priority` may not wait now (None: it may), given the keys of the requests
    waiting (None for requests without a key) and how many wait."""
    if n_waiting >= max_waiting:
        return RequestRejected(503, f"the server is at capacity ({n_waiting} requests waiting); retry shortly",
                               error_type="server_busy", code="queue_full", retry_after=2)
    if priority == "batch" and n_waiting >= max_waiting - max(1, max_waiting // KEPT_FROM_BATCH):
        return RequestRejected(503, f"{n_waiting} requests are waiting; the last places of the queue are kept "
                                    "for interactive and default requests: retry this batch request shortly",
                               error_type="server_busy", code="queue_full", retry_after=5)
    if key is not None:
        others = sum(1 for k, n in waiting_by_key.items() if n and k is not None and k != key)
        share = key_share(max_waiting, others)
        if waiting_by_key.get(key, 0) >= share:
            return RequestRejected(429, f"the key {key!r} has {waiting_by_key[key]} requests waiting, its share of "
                                        f"the queue while {others} other key(s) wait too ({share} of "
                                        f"{max_waiting} places): retry shortly", code="queue_share_exceeded",
                                   retry_after=2)
    return None
