"""The agent's own error types: every library failure is mapped to one of these."""

from __future__ import annotations
from host_runtime.common.errors import UnavailableError


class BmcError(UnavailableError):
    state = "error"


class BmcUnreachable(BmcError):
    state = "unreachable"


class BmcUnknownHost(BmcError):
    state = "unknown_host"


class BmcAuthFailed(BmcError):
    state = "auth_failed"


class BmcTimeout(BmcError):
    state = "timeout"


class BmcCommandFailed(BmcError):
    """The BMC answered with a completion code other than success."""

    state = "command_failed"

    def __init__(self, command: str, code: int, meaning: str):
        super().__init__(f"{command}: completion code {code:#04x} ({meaning})")
        self.code = code
        self.meaning = meaning
