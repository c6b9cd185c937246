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


def test_root_writes_no_file_through_a_link_planted_where_it_downloads_or_copies(tmp_path):
    """Root's `models pull` appended through a link on resume and `models add` copied through one: the store's
    directories are the services' own, so a service could point either at any file (hardening #35, item 6)."""
    from host_runtime.models.store import _copy_without_links

    victim = tmp_path / "shadow"
    victim.write_bytes(b"root:secret\n")
    planted = tmp_path / "part"
    planted.symlink_to(victim)
    for append in (False, True):
        with pytest.raises(OSError):
            copy_hashing(io.BytesIO(b"model bytes"), planted, lambda n: None, append=append)
    assert victim.read_bytes() == b"root:secret\n"
    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF model")
    _copy_without_links(source, planted)  # the link is replaced by the copy, its target untouched
    assert not planted.is_symlink() and planted.read_bytes() == b"GGUF model"
    assert victim.read_bytes() == b"root:secret\n"


@pytest.mark.root
def test_root_gives_a_file_its_owner_on_the_open_file(tmp_path):
    """Provisioning chowned the services' secrets by path after writing them, in a directory they own."""
    import os

    from host_runtime.common.atomic_file import atomic_write
    from host_runtime.common.service_user import service_ids

    nobody = service_ids("nobody")
    atomic_write(tmp_path / "api.key", b"KEY", 0o600, owner=nobody)
    st = os.stat(tmp_path / "api.key")
    assert (st.st_uid, st.st_gid) == nobody and st.st_mode & 0o777 == 0o600
    victim = tmp_path / "root-owned"
    victim.write_bytes(b"x")
    (tmp_path / "link").symlink_to(victim)
    atomic_write(tmp_path / "link", b"new", 0o600)  # replaces the link; takes nothing from its target
    assert not (tmp_path / "link").is_symlink() and victim.read_bytes() == b"x"


@pytest.mark.root
def test_root_reads_a_gguf_header_through_an_unprivileged_child(tmp_path):
    """`models pull/add` as root parsed the download with ggml's C reader as root (#35, item 6). Now a forked child
    that has become the services' user (nobody here) reads it, from the file root opened: a file only root can
    open (0600 in a 0700 directory) still reads, the facts are the in-process reader's, and a damaged header is a
    refusal, not a crash."""
    import os

    from host_runtime.models import gguf_info
    from host_runtime.models.errors import StoreError
    from host_runtime.placement import gguf_c
    from tests.tiny_gguf import write_tiny_llama

    private = tmp_path / "root-only"
    private.mkdir(mode=0o700)
    model = write_tiny_llama(private / "tiny.gguf", n_ctx=256)
    os.chmod(model, 0o600)
    doc = gguf_info.read_isolated(model, "facts")
    assert doc["reader_uid"] == gguf_info.unprivileged_ids()[0] != 0
    with gguf_c.GGUFTable(model) as table:
        assert (doc["architecture"], doc["context_length"], doc["data_end"]) == (
            table.value("general.architecture"), table.value("llama.context_length"), table.data_end())
    assert gguf_info.read_info(model)["context_length"] == 256
    damaged = private / "damaged.gguf"
    damaged.write_bytes(model.read_bytes()[:4] + b"\xff" * 60)  # the magic, then a version and counts ggml refuses
    with pytest.raises(StoreError, match="not a readable GGUF file"):
        gguf_info.read_info(damaged)
