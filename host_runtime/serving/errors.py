"""The API's errors: every failure the client sees, in the shape its API gives errors (OpenAI's
`{"error": {message, type, param, code}}`, Anthropic's Messages API's, Ollama's)."""

from __future__ import annotations

import json
import logging

import falcon

from host_runtime.auth.fleet_vouch import ERROR_HEADER, VOUCHED_LIMIT_STATUS
from host_runtime.common.errors import EveryCycleError, InputError, UnavailableError
from host_runtime.engine.errors import RequestRejected
from host_runtime.serving.tracing import trace_id_of

log = logging.getLogger(__name__)


class APIError(RequestRejected):
    """A refusal made by the API's own checks; the engine's and the pool's (RequestRejected) are answered alike."""

    def body(self) -> dict:
        return body_of(self)


def body_of(err: RequestRejected) -> dict:
    return {"error": {"message": err.message, "type": err.error_type, "param": err.param, "code": err.code}}


ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                         404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                         503: "overloaded_error"}


def anthropic_body(err: RequestRejected) -> dict:
    """The Messages API's error shape."""
    kind = ANTHROPIC_ERROR_TYPES.get(err.status, "api_error" if err.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": err.message}}


def ollama_body(err: RequestRejected) -> dict:
    """Ollama's error shape: {"error": "message"} (its client raises ResponseError with it and the status)."""
    return {"error": err.message}


ANTHROPIC_PATHS = ("/v1/messages",)  # answered in the Messages API's error shape
OLLAMA_PATHS = ("/api/",)            # answered in Ollama's: {"error": "message"}


def _write(resp: falcon.Response, err: RequestRejected, req=None) -> None:
    resp.status = falcon.code_to_http_status(err.status)
    resp.content_type = falcon.MEDIA_JSON
    if req is not None and req.path.startswith(ANTHROPIC_PATHS):
        resp.text = json.dumps(anthropic_body(err))
    elif req is not None and req.path.startswith(OLLAMA_PATHS):
        resp.text = json.dumps(ollama_body(err))
    else:
        resp.text = json.dumps(body_of(err))
    if err.retry_after is not None:
        resp.set_header("Retry-After", str(err.retry_after))
    if err.status == 429 and req is not None and req.context.get("vouched"):
        # through the fleet's router, which would retry a 429 on every box: auth/fleet_vouch.py
        resp.status = f"{VOUCHED_LIMIT_STATUS} Key Limit"
        resp.set_header(ERROR_HEADER, json.dumps(body_of(err), separators=(",", ":"), ensure_ascii=True))
    if err.status == 401:
        resp.set_header("WWW-Authenticate", "Bearer")


def handle_api_error(req, resp, err: RequestRejected, params) -> None:
    """APIError and the engine's or pool's RequestRejected alike."""
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


# The box's error families, mapped once to HTTP (common/errors.py): an error no handler turned into a RequestRejected
# of its own is still the client's fault, a part not answering, or the box's.
HTTP_STATUS = ((InputError, 400, "invalid_request_error"), (UnavailableError, 503, "server_error"),
               (EveryCycleError, 500, "server_error"))


def handle_box_error(req, resp, err: EveryCycleError, params) -> None:
    """An EveryCycleError no handler answered: its family's status, its message where it is about the request or
    a part that is not answering, the log's word where it is the box's own failure (500)."""
    status, kind = next((s, k) for family, s, k in HTTP_STATUS if isinstance(err, family))
    if status == 500:
        handle_unexpected(req, resp, err, params)
        return
    log.warning("%s %s: %s (%s)", req.method, req.path, err, type(err).__name__)
    _write(resp, APIError(status, str(err), error_type=kind), req)


def handle_unexpected(req, resp, err: Exception, params) -> None:
    """A bug must not leak a traceback to the client, nor take the worker down."""
    trace_id = trace_id_of(req)
    log.exception("unhandled error on %s %s%s", req.method, req.path,
                  f" (trace_id={trace_id})" if trace_id is not None else "")
    _write(resp, APIError(500, "internal server error; the server log has the details", error_type="server_error"),
           req)
