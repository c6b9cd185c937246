"""Downloads bounded before their hash is checked (hardening, third pass, item 9): a server that declares no size,
or more bytes than it declared, cannot fill the disk."""

from __future__ import annotations

import io

import pytest

from host_runtime.common.download import TooLarge, copy_hashing
from host_runtime.models.errors import StoreError
from host_runtime.models.pull import pull
from host_runtime.models.store import Store
from tests.servers import serve_unsized


def test_a_copy_stops_at_its_limit_with_nothing_past_it_written(tmp_path):
    dest = tmp_path / "out"
    with pytest.raises(TooLarge):
        copy_hashing(io.BytesIO(b"x" * (9 << 20)), dest, lambda n: None, limit=5 << 20)
    assert dest.stat().st_size <= 5 << 20
    assert len(copy_hashing(io.BytesIO(b"x" * 100), dest, lambda n: None, limit=100)) == 64


def test_a_pull_without_a_declared_size_stops_at_the_stores_room(tmp_path, monkeypatch):
    server = serve_unsized(tmp_path, ".gguf")
    store = Store(tmp_path / "store")
    monkeypatch.setattr(Store, "room", lambda self: 6 << 20)  # as if the disk had 6 MiB to spare
    try:
        with pytest.raises(StoreError, match="went on past 6,291,456 bytes.*nothing was kept"):
            pull(store, f"http://127.0.0.1:{server.server_port}/big.gguf", say=lambda line: None)
    finally:
        server.shutdown()
    assert not any(p.stat().st_size > 6 << 20 for p in (tmp_path / "store").rglob("*") if p.is_file())
