"""The box's one HTTP client (host_runtime/common/http_client.py) against real servers on loopback and on a Unix
socket: what each caller relies on (any status is an answer, no answer is one OSError with the cause's words,
bodies read as they arrive, nothing followed unless asked)."""

from __future__ import annotations

import http.server
import socket
import socketserver
import threading
import time

import pytest

from host_runtime.common import http_client
from host_runtime.common.http_client import HTTPClient, HTTPFailure

BODY = bytes(range(256)) * 64  # 16 KiB, every byte value


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.path == "/moved":
            self.send_response(302)
            self.send_header("Location", "/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        status = 404 if self.path == "/missing" else 200
        self.send_response(status)
        self.send_header("Content-Length", str(len(BODY)))
        self.send_header("X-Seen-Encoding", self.headers.get("Accept-Encoding", ""))
        self.end_headers()
        self.wfile.write(BODY)

    def do_POST(self):
        data = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", self.headers.get("Content-Type", ""))
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def address_string(self):  # a Unix socket's peer has no host
        return "peer"

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def base():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_any_status_is_an_answer_and_only_success_passes_raise_for_status(base):
    answer = http_client.get(base + "/")
    assert answer.status == 200 and answer.body == BODY and answer.ok
    missing = http_client.get(base + "/missing")
    assert missing.status == 404 and not missing.ok
    with pytest.raises(HTTPFailure, match="HTTP 404") as caught:
        missing.raise_for_status()
    assert caught.value.status == 404 and caught.value.body == BODY[:300]


def test_a_redirect_is_an_answer_unless_following_is_asked(base):
    assert http_client.get(base + "/moved").status == 302
    assert http_client.get(base + "/moved", follow_redirects=True).body == BODY
    with http_client.open_stream(base + "/moved") as stream:  # downloads follow (a mirror may send elsewhere)
        assert stream.status == 200


def test_no_answer_is_one_oserror_naming_the_url_and_the_cause():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(HTTPFailure) as refused:
        http_client.get(f"http://127.0.0.1:{port}/x", timeout=5)
    assert isinstance(refused.value, OSError) and refused.value.status is None
    assert str(refused.value).startswith(f"http://127.0.0.1:{port}/x: ") and "refused" in refused.value.why
    with socket.socket() as silent:  # accepts, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        started = time.monotonic()
        with pytest.raises(HTTPFailure, match="timed out"):
            http_client.get(f"http://127.0.0.1:{silent.getsockname()[1]}/", timeout=0.3)
        assert time.monotonic() - started < 5
    with pytest.raises(HTTPFailure, match="notaurl: "):
        http_client.get("notaurl")


def test_a_stream_reads_as_a_file_does_and_asks_for_the_bytes_as_sent(base):
    with http_client.open_stream(base + "/") as stream:
        assert stream.status == 200 and stream.headers["X-Seen-Encoding"] == "identity"
        parts = [stream.read(1000), stream.read(5000), stream.read(-1), stream.read(10)]
    assert [len(p) for p in parts] == [1000, 5000, len(BODY) - 6000, 0] and b"".join(parts) == BODY


def test_json_bodies_and_a_pooled_client_keep_their_connection(base):
    with HTTPClient() as client:
        first = client.request("POST", base + "/echo", json={"a": [1, 2]})
        second = client.request("POST", base + "/echo", json={"b": None})
    assert first.json() == {"a": [1, 2]} and second.json() == {"b": None}
    assert first.headers["Content-Type"] == "application/json"


def test_a_unix_socket_is_asked_by_path_and_a_missing_one_named(tmp_path):
    class UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

    path = tmp_path / "http.sock"
    server = UnixServer(str(path), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        answer = http_client.unix_get(str(path), "/missing", timeout=5)
        assert answer.status == 404 and answer.body == BODY
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(OSError, match=f"{tmp_path / 'gone.sock'} /ready: .*No such file"):
        http_client.unix_get(str(tmp_path / "gone.sock"), "/ready", timeout=5)
