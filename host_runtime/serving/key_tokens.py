"""A key's token limits for the answers the API gives without a generation (#56, item 11): embeddings, rerank,
/tokenize and /detokenize are checked before the engine is asked and counted after; count_tokens is checked only
(Claude Code asks it before each turn, and the turn itself counts). Generations are checked and counted by their
engine (engine/engine.py) into the same box-wide ledger (engine/key_ledger_file.py)."""

from __future__ import annotations

import time

from host_runtime.engine.key_ledger_file import SharedKeyLedger
from host_runtime.serving.errors import APIError


class KeyTokens:
    def __init__(self, ledger: SharedKeyLedger):
        self.ledger = ledger

    @staticmethod
    def _limited(context) -> tuple[str, int, int] | None:
        policy, name = context.get("key_policy"), context.get("key_name")
        if policy is None or not name or not (policy.tokens_per_minute or policy.tokens_per_day):
            return None
        return name, policy.tokens_per_minute, policy.tokens_per_day

    def check(self, context, elsewhere: tuple[int, int] = (0, 0)) -> None:
        """APIError 429 (Retry-After) where the request's key is past one of its token limits (`elsewhere`: its
        minute's and day's use on the fleet's other boxes, for a key the gateway vouched for)."""
        limited = self._limited(context)
        if limited is None:
            return
        name, per_minute, per_day = limited
        refusal = self.ledger.refusal(name, per_minute, per_day, time.time(), elsewhere)
        if refusal is not None:
            raise APIError(429, refusal.message(name), code="token_limit_exceeded", retry_after=refusal.retry_after)

    def count(self, context, tokens: int) -> None:
        limited = self._limited(context)
        if limited is not None and tokens > 0:
            self.ledger.add(limited[0], int(tokens), time.time())
            # in the file before the answer goes: the client's next request may reach another of the API's workers
            self.ledger.flush()
