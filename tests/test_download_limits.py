"""Downloads bounded before their hash is checked (hardening, third pass, item 9): a server that declares no size,
or more bytes than it declared, cannot fill the disk."""

from __future__ import annotations

import http.server
import io
import threading

import pytest

from host_runtime.common.download import TooLarge, copy_hashing
from host_runtime.models.errors import StoreError
from host_runtime.models.pull import pull
from host_runtime.models.store import Store


def test_a_copy_stops_at_its_limit_with_nothing_past_it_written(tmp_path):
    dest = tmp_path / "out"
    with pytest.raises(TooLarge):
        copy_hashing(io.BytesIO(b"x" * (9 << 20)), dest, lambda n: None, limit=5 << 20)
    assert dest.stat().st_size <= 5 << 20
    assert len(copy_hashing(io.BytesIO(b"x" * 100), dest, lambda n: None, limit=100)) == 64


class _Endless(http.server.BaseHTTPRequestHandler):
    """A body with no Content-Length (ended by closing), longer than any store's room."""
    protocol_version = "HTTP/1.0"

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        try:
            for _ in range(64):
                self.wfile.write(b"\0" * (1 << 20))
        except OSError:
            pass

    def log_message(self, *args):
        pass


def test_a_pull_without_a_declared_size_stops_at_the_stores_room(tmp_path, monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Endless)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    store = Store(tmp_path / "store")
    monkeypatch.setattr(Store, "room", lambda self: 6 << 20)  # as if the disk had 6 MiB to spare
    try:
        with pytest.raises(StoreError, match="went on past 6,291,456 bytes.*nothing was kept"):
            pull(store, f"http://127.0.0.1:{server.server_port}/big.gguf", say=lambda line: None)
    finally:
        server.shutdown()
    assert not any(p.stat().st_size > 6 << 20 for p in (tmp_path / "store").rglob("*") if p.is_file())
