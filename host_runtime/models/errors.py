"""The model store's typed errors: what the CLI prints (naming the field or the model) instead of a traceback."""

from __future__ import annotations

from host_runtime.common.errors import EveryCycleError, InputError


class StoreError(EveryCycleError):
    """A store operation refused or failed; the message says why and what to do."""


class SourceRefused(StoreError, InputError):
    """What the source gave is not the model asked for (wrong sha256, not a GGUF, no such file): trying again
    changes nothing until the source or the request changes."""
