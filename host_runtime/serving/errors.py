"""OpenAI-style errors: every failure the client sees is `{"error": {message, type, param, code}}`."""

from __future__ import annotations

import json
import logging

import falcon

log = logging.getLogger(__name__)


class APIError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 error_type: str | None = None, retry_after: int | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.error_type = error_type or _default_type(status)
        self.retry_after = retry_after

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param, "code": self.code}}

    @classmethod
    def from_engine(cls, wire: dict) -> "APIError":
        return cls(int(wire.get("status", 500)), str(wire.get("message", "engine error")), param=wire.get("param"),
                   code=wire.get("code"), error_type=wire.get("type"), retry_after=wire.get("retry_after"))


def _default_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 404:
        return "not_found_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


ANTHROPIC_PATHS = ("/v1/messages",)  # answered in the Messages API's error shape


def _write(resp: falcon.Response, err: APIError, req=None) -> None:
    resp.status = falcon.code_to_http_status(err.status)
    resp.content_type = falcon.MEDIA_JSON
    if req is not None and req.path.startswith(ANTHROPIC_PATHS):
        from host_runtime.serving.anthropic_protocol import error_body

        resp.text = json.dumps(error_body(err))
    else:
        resp.text = json.dumps(err.body())
    if err.retry_after is not None:
        resp.set_header("Retry-After", str(err.retry_after))
    if err.status == 401:
        resp.set_header("WWW-Authenticate", "Bearer")


def handle_api_error(req, resp, err: APIError, params) -> None:
    _write(resp, err, req)


def handle_falcon_error(req, resp, err: falcon.HTTPError, params) -> None:
    """Falcon's own errors (no route, wrong method, bad header) in OpenAI form."""
    status = int(err.status_code)
    message = err.description or err.title or "request failed"
    if status == 404:
        message = f"no route for {req.method} {req.path}"
    elif status == 405:
        message = f"method {req.method} is not allowed on {req.path}"
    _write(resp, APIError(status, message), req)


def handle_unexpected(req, resp, err: Exception, params) -> None:
    """A bug must not leak a traceback to the client, nor take the worker down."""
    log.exception("unhandled error on %s %s", req.method, req.path)
    _write(resp, APIError(500, "internal server error; the server log has the details", error_type="server_error"),
           req)
