"""The update component's one error type: what went wrong, in a sentence an owner can act on."""

from __future__ import annotations

from host_runtime.common.errors import EveryCycleError


class UpdateError(EveryCycleError):
    """An update that cannot go ahead; nothing of the running slot was touched."""
