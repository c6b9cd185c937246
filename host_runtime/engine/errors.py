"""The engine's typed refusal: carries what the HTTP layer needs for an OpenAI-style error."""

from __future__ import annotations


class RequestRejected(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, error_type: str = "invalid_request_error",
                 retry_after: int | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.error_type = error_type
        self.retry_after = retry_after

    def to_wire(self) -> dict:
        return {"status": self.status, "message": self.message, "param": self.param, "code": self.code,
                "type": self.error_type, "retry_after": self.retry_after}
