"""The one error type a refusal travels as, from the engine (or the pool) through the workers to the client: it
carries what the HTTP layer needs for an OpenAI-style error (serving.errors.APIError is the same type, raised by
the API's own checks)."""

from __future__ import annotations
from host_runtime.common.errors import EveryCycleError


def default_error_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 404:
        return "not_found_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


class RequestRejected(EveryCycleError):
    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, error_type: str | None = None,
                 retry_after: int | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.error_type = error_type or default_error_type(status)
        self.retry_after = retry_after

    def to_wire(self) -> dict:
        return {"status": self.status, "message": self.message, "param": self.param, "code": self.code,
                "type": self.error_type, "retry_after": self.retry_after}

    @classmethod
    def from_wire(cls, doc: dict) -> "RequestRejected":
        return cls(int(doc.get("status", 500)), str(doc.get("message", "engine error")), param=doc.get("param"),
                   code=doc.get("code"), error_type=doc.get("type"), retry_after=doc.get("retry_after"))
