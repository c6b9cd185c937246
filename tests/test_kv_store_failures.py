"""The prefix cache's disk tier when a write fails or the disk has no room (#55): the entry is not counted on disk
and its bytes are not kept in RAM (a failed write left 9 entries and 77 MB counted on disk against 4 files and
34 MB, and RAM over its budget by up to the disk's)."""

from __future__ import annotations

from host_runtime.engine import kv_store
from host_runtime.engine.kv_store import KVStore
from host_runtime.engine.prefix_cache import Entry, PrefixCache


def test_a_failed_write_and_one_skipped_for_room_are_handed_back_and_their_bytes_let_go(tmp_path, monkeypatch):
    store = KVStore(tmp_path / "kv", "fp")
    good, failing, no_room = (1, 2, 3), (4, 5, 6), (7, 8, 9)
    for key in (good, failing, no_room):
        store.put_ram(key, bytes(1000))
    real_write = kv_store.atomic_write

    def write(path, data, mode):
        if path == store.path_for(failing):
            raise OSError(28, "No space left on device")
        real_write(path, data, mode=mode)

    monkeypatch.setattr(kv_store, "atomic_write", write)
    store.demote(good)
    store.demote(failing)
    store.flush()
    monkeypatch.setattr(store, "space", lambda: (0, 1 << 40))  # the disk filled up for other reasons meanwhile
    store.demote(no_room)
    store.flush()
    assert store.take_unwritten() == [failing, no_room] and store.take_unwritten() == []
    assert store._pending == {} and store.ram == {}  # nothing held in RAM for them
    assert store.read_disk(good) == bytes(1000) and store.read_disk(failing) is None
    assert sorted(p.name for p in (tmp_path / "kv").iterdir()) == [store.path_for(good).name]


def test_the_policy_forgets_what_the_disk_lost():
    cache = PrefixCache(n_slots=1, chunk=4, ram_budget=0, disk_budget=10_000)
    for key in ((1,), (2,)):
        cache.disk[key] = Entry(key, 1000)
    cache.restore_failed("disk", (2,))
    assert list(cache.disk) == [(1,)] and cache.bytes_in("disk") == 1000
