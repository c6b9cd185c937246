"""The shard's errors: a member that cannot be used is the box's UnavailableError (503 for a model's requests)."""

from __future__ import annotations

from host_runtime.common.errors import UnavailableError


class ShardError(UnavailableError):
    """A shard host cannot be reached, refused the fleet's key, speaks another protocol, or its tunnel failed."""
