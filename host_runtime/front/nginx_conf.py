"""nginx's configuration for the front (pure): settings and paths in, the config text out.

Why nginx: gunicorn's gthread workers give every accepted socket a thread before the request is read, so a few
dozen idle connections stop the API (gunicorn's deployment guide puts a buffering proxy in front for this).
nginx holds idle and slow connections for a few hundred bytes each, closes them on timeouts, caps what one
client address may hold or ask, buffers whole request bodies, and only then hands a request to gunicorn."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from host_runtime.auth.fleet_vouch import ERROR_HEADER, VOUCHED_LIMIT_STATUS
from host_runtime.front.settings import FrontSettings, gateway_addresses, serves_plain_http
from host_runtime.front.tls import CertificatePair


@dataclass(frozen=True)
class FrontPaths:
    run_dir: Path          # nginx's pid and temp files
    upstream_socket: Path  # gunicorn's Unix socket
    # Started as root, nginx would hand its workers to 'nobody', who may not reach the API's socket: name the
    # user whose services own it (on the box the front runs unprivileged and this stays None).
    worker_user: str | None = None
    # On the fleet's gateway: the router's loopback port. /v1/ goes there once the box's own API has accepted the
    # client's key (auth_request); the client's key goes no further: the gateway's voucher for it goes in its place.
    gateway_port: int | None = None


def _error(status: int, message: str, error_type: str, code: str) -> str:
    body = json.dumps({"error": {"message": message, "type": error_type, "param": None, "code": code}})
    return "'" + body.replace("\\", "\\\\").replace("'", "\\'") + "'"


ERROR_PAGES = {
    "too_many": (429, "too many requests or connections from this client; retry shortly", "rate_limit_error",
                 "rate_limited"),
    "too_large": (413, "the request body is over this box's limit", "invalid_request_error", "request_too_large"),
    "forbidden": (403, "this path is served to this machine only", "invalid_request_error", "forbidden"),
    "upstream_down": (503, "the serving API is not running (it may be starting); retry shortly", "server_error",
                      "api_unavailable"),
    "timeout": (408, "the request was not received in time", "invalid_request_error", "request_timeout"),
    "unauthorized": (401, "no valid API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                     "invalid_request_error", "invalid_api_key"),
}

# nginx's own per-client limits refuse with this status, which @too_many answers as a 429: on the gateway's /v1/
# (proxy_intercept_errors on) a box's own 429 (a key past its token limit, with its Retry-After and code) must
# reach the client as the box said it, not as the front's "too many requests from this client".
OWN_LIMIT_STATUS = 599
# Which status goes to which page: nginx's own refusals first. In a location that sets its own error_page, nginx
# inherits none of the server's, so the gateway's /v1/ starts from the same ones, less 403 (no deny rule there; a
# box's 403, a key kept from a model, passes).
LIMIT_PAGES = ((f"429 {OWN_LIMIT_STATUS}", "= @too_many"), (413, "@too_large"), (403, "@forbidden"), (408, "@timeout"))
SERVER_ERROR_PAGES = (*LIMIT_PAGES, ("502 503 504", "@upstream_down"))
# The router's own answers are plain text, and one 503 whether no box serves the model or every box that does is
# busy: the box's API tells the client which (serving/fleet_unroutable.py), with the status it chooses ("=").
GATEWAY_ERROR_PAGES = ((OWN_LIMIT_STATUS, "= @too_many"), (413, "@too_large"), (408, "@timeout"),
                       (401, "@unauthorized"), ("404 502 503 504", "= @fleet_unroutable"),
                       (VOUCHED_LIMIT_STATUS, "= @fleet_key_limit"))


def _error_pages(pages) -> list[str]:
    return [f"error_page {status} {target};" for status, target in pages]


def _per_client_key(s: FrontSettings) -> list[str]:
    """On a fleet's member the gateway's address counts as no client (nginx does not limit an empty key)."""
    if not s.fleet_gateway:
        return []
    listed = " ".join(f"{a} 1;" for a in gateway_addresses(s))
    return [f"    geo $fleet_gateway {{ default 0; {listed} }}",
            "    map $fleet_gateway $per_client { 1 \"\"; default $binary_remote_addr; }"]


# The routes the fleet's router serves for clients (regex location; nginx tries it after the prefix locations).
FLEET_ROUTES = "^/v1/(chat/completions|completions|embeddings|models)(/|$)"
# The routes whose bodies may carry images (#58): up to max_media_body_bytes, the API keeping all but the images'
# base64 to max_body_bytes. A gateway's chat completions go to the router's location, which takes the same limit.
MEDIA_ROUTES = "^/(v1/(chat/completions|responses|messages)|api/(chat|generate))$"
GATEWAY_MEDIA_ROUTES = "^/(v1/(responses|messages)|api/(chat|generate))$"


# Every proxied request's headers. A location that sets any proxy_set_header of its own inherits none of these,
# so such locations repeat them: the key check needs the client's address (a key may be valid from some only),
# and keepalive to an upstream needs Connection "".
PROXY_HEADERS = ("proxy_set_header Connection \"\"; proxy_set_header Host $host; "
                 "proxy_set_header X-Forwarded-For $remote_addr; proxy_set_header X-Forwarded-Proto $scheme;")


# On the gateway every request the router passes on carries a W3C traceparent: the client's where it sent a valid
# one, else one made from nginx's $request_id (16 random bytes: a trace id), so that the gateway's key check and the
# box that answers are one trace (serving/tracing.py; sglang-router passes the header through as it is). A trace the
# gateway starts is sampled: the boxes' own sample ratio decides only for requests that reach them directly.
TRACE_MAPS = (
    '    map $request_id $fleet_parent_id { "~(?<half>[0-9a-f]{16})$" $half; }',
    '    map $http_traceparent $fleet_traceparent { "~^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$" $http_traceparent; '
    'default 00-$request_id-$fleet_parent_id-01; }',
)
TRACE_HEADER = "proxy_set_header traceparent $fleet_traceparent;"
# The voucher as the request's bearer, or no Authorization at all where the API gave none (an empty value is not
# sent): the router then adds the fleet key, and a box's front refuses a request with two.
VOUCH_MAP = '    map $fleet_vouch $fleet_authorization { "" ""; default "Bearer $fleet_vouch"; }'


def _gateway_locations(s: FrontSettings) -> list[str]:
    return [
        "        location = /_fleet_auth { internal; proxy_pass http://serving/v1/everycycle/auth; "
        f"proxy_method GET; proxy_pass_request_body off; {PROXY_HEADERS} {TRACE_HEADER} "
        "proxy_set_header Content-Length \"\"; }",
        # proxy_intercept_errors: the router's (and a box's) 4xx/5xx with a page below become that page: an
        # OpenAI-style error body instead of the router's plain text. The request's body goes to
        # @fleet_unroutable as the client sent it (nginx has it buffered), so the API there sees the model named.
        # Only the inference routes reach the router: its control plane (/workers, /v1/tokenizers) and its shared
        # in-memory state (/v1/conversations, /v1/responses/{id}) are no client's; the rest of /v1/ is this
        # box's own API (location /), which answers what it does not serve with its own 404.
        f"        location ~ {FLEET_ROUTES} {{ client_max_body_size {s.max_media_body_bytes}; "
        "auth_request /_fleet_auth; proxy_intercept_errors on; "
        f"{' '.join(_error_pages(GATEWAY_ERROR_PAGES))} proxy_pass http://fleet_router; "
        # The client's key goes no further: in its place the voucher the API gave (auth/fleet_vouch.py), which the
        # router passes to a box registered without the fleet key, so the key's limits hold there.
        "auth_request_set $fleet_vouch $upstream_http_x_everycycle_vouch; "
        f"{PROXY_HEADERS} {TRACE_HEADER} proxy_set_header Authorization $fleet_authorization; "
        "proxy_set_header X-Api-Key \"\"; "
        "proxy_buffering off; }",
        "        location /v1/everycycle/ { proxy_pass http://serving; }  # this box's own map and key check",
        "        location @fleet_unroutable { rewrite ^ /v1/everycycle/fleet/unroutable break; proxy_pass http://serving; }",
        # A box's refusal of a vouched key for its limits, made 430 so that the router does not retry it on every
        # box (auth/fleet_vouch.py): the 429 it meant, its body and Retry-After as the box gave them.
        "        location @fleet_key_limit { default_type application/json; "
        "add_header Retry-After $upstream_http_retry_after always; "
        f"return 429 $upstream_http_{ERROR_HEADER.lower().replace('-', '_')}; }}",
        # sglang-router has no Anthropic route for HTTP workers: Messages are this box's own models.
        "        location /v1/messages { proxy_pass http://serving; }",
    ]


def _server_body(s: FrontSettings, *, metrics_location: bool = True, gateway: bool = False,
                 serving: bool = True) -> list[str]:
    """serving: False for the plain-HTTP server that only redirects (its probe and health lines are kept)."""
    lines = [
        f"        limit_conn per_client_conn {s.connections_per_client};",
        f"        limit_req zone=per_client_req burst={s.request_burst_per_client} nodelay;",
        *("        " + line for line in _error_pages(SERVER_ERROR_PAGES)),
        "        location / { proxy_pass http://serving; }",
        # The link probe's bytes are never spooled to a temp file (under /run: RAM) for a client that stops
        # reading: nginx holds what its memory buffers take and the API's thread waits, within send_timeout.
        "        location = /v1/everycycle/probe { proxy_max_temp_file_size 0; proxy_pass http://serving; }",
    ]
    if serving:
        lines.append(f"        location ~ {GATEWAY_MEDIA_ROUTES if gateway else MEDIA_ROUTES} "
                     f"{{ client_max_body_size {s.max_media_body_bytes}; proxy_pass http://serving; }}")
    if gateway:
        lines += _gateway_locations(s)
    if metrics_location and s.metrics == "loopback":
        lines.append("        location = /metrics { allow 127.0.0.1; allow ::1; deny all; proxy_pass http://serving; }")
    for name, (status, message, error_type, code) in ERROR_PAGES.items():
        retry = " add_header Retry-After 2 always;" if status in (429, 503) else ""
        lines.append(f"        location @{name} {{ default_type application/json;{retry} "
                     f"return {status} {_error(status, message, error_type, code)}; }}")
    return lines


CERTIFICATE_PATH = "/everycycle.crt"  # the front's certificate, served for clients to trust (console/connect.py)
CA_CERTIFICATE_PATH = "/ca.crt"        # the local CA's, which clients trust once (front/trust.py)


def render(s: FrontSettings, paths: FrontPaths, pair: CertificatePair) -> str:
    run = paths.run_dir
    listen = f"[{s.listen}]" if ":" in s.listen else s.listen
    key = "$per_client" if s.fleet_gateway else "$binary_remote_addr"
    out = [
        "# Written by `everycycle front` from its settings at every start: edits here are overwritten.",
        "daemon off;",
        *([f"user {paths.worker_user};"] if paths.worker_user else []),
        "worker_processes 2;",
        "worker_rlimit_nofile 16384;",
        f"pid {run}/nginx.pid;",
        # warn: the limits' own lines (limit_conn/limit_req log at warn); client timeouts log at info, not here.
        "error_log stderr warn;",
        "events { worker_connections 8192; }",
        "http {",
        "    access_log off;  # gunicorn's access log has every request that reached the API",
        "    server_tokens off;",
        "    default_type application/octet-stream;",
    ]
    out += [f"    {kind}_temp_path {run}/{kind}-temp;" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")]
    out += [
        f"    client_header_timeout {s.header_timeout_s}s;",
        f"    client_body_timeout {s.body_timeout_s}s;",
        "    send_timeout 120s;",
        "    keepalive_timeout 30s;",
        "    keepalive_requests 1000;",
        "    reset_timedout_connection on;",
        f"    client_max_body_size {s.max_body_bytes};",
        f"    client_body_buffer_size {min(s.max_body_bytes, 1 << 20)};",
        "    large_client_header_buffers 4 16k;",
        *_per_client_key(s),
        f"    limit_conn_zone {key} zone=per_client_conn:4m;",
        f"    limit_req_zone {key} zone=per_client_req:4m rate={s.requests_per_second_per_client}r/s;",
        f"    limit_conn_status {OWN_LIMIT_STATUS};",
        f"    limit_req_status {OWN_LIMIT_STATUS};",
        "    limit_conn_log_level warn;",
        "    limit_req_log_level warn;",
        f"    upstream serving {{ server unix:{paths.upstream_socket}; }}",
        *([f"    upstream fleet_router {{ server 127.0.0.1:{paths.gateway_port}; keepalive 32; }}", *TRACE_MAPS,
            VOUCH_MAP]
          if paths.gateway_port else []),
        "    proxy_http_version 1.1;",
        f"    {PROXY_HEADERS}",
        "    proxy_request_buffering on;  # gunicorn gets a request only once all of it has arrived",
        "    proxy_buffering on;          # SSE answers opt out with X-Accel-Buffering: no",
        "    proxy_connect_timeout 5s;",
        "    proxy_send_timeout 60s;",
        "    proxy_read_timeout 900s;     # a long generation without streaming",
        "    server {",
        f"        listen {listen}:{s.https_port} ssl;",
        f"        ssl_certificate {pair.certificate};",
        f"        ssl_certificate_key {pair.private_key};",
        "        ssl_protocols TLSv1.2 TLSv1.3;",
        "        ssl_session_cache shared:tls:2m;",
    ]
    # The certificate itself, for clients to trust (the console's connect screen says how, and which fingerprint
    # to compare: fetched in clear or with -k, the fingerprint is what proves it). Public: every handshake sends it.
    certificate = (f"        location = {CERTIFICATE_PATH} {{ default_type application/x-pem-file; "
                   f"alias {pair.certificate}; }}")
    if pair.ca:  # the CA too, in clear where HTTP is on: a client fetches it before it can check any certificate
        certificate += (f"\n        location = {CA_CERTIFICATE_PATH} {{ default_type application/x-pem-file; "
                        f"alias {pair.ca.certificate}; }}")
    out += _server_body(s, gateway=paths.gateway_port is not None) + [certificate]
    out.append("    }")
    if s.http != "off":
        out += ["    server {", f"        listen {listen}:{s.http_port};"]
        if serves_plain_http(s):
            out += _server_body(s, gateway=paths.gateway_port is not None)
        else:
            # Only the liveness probe answers in clear; everything else moves to HTTPS before a key is sent.
            out += [line for line in _server_body(s, metrics_location=False, serving=False)
                     if "location / " not in line]
            out += ["        location = /health { proxy_pass http://serving; }",
                    f"        location / {{ return 308 https://$host:{s.https_port}$request_uri; }}"]
        out.append(certificate)
        out.append("    }")
    out.append("}")
    return "\n".join(out) + "\n"
