"""A stored model's bytes are checked before it is served, and a model that fails to load does not stick (#55):
random bytes over a model's weights were served (200, garbage), a truncated file was a 500, and a failed load's
engine stayed (listed as loaded, 137 MB) and kept answering 500 after the file was mended."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request

import gguf
import pytest

from host_runtime.models.errors import StoreError
from host_runtime.models.store import VERIFIED, Store
from tests.servers import everycycle, running_serve
from tests.tiny_gguf import write_tiny_llama

pytestmark = pytest.mark.system


def ask(base: str, model: str) -> tuple[int, dict]:
    body = json.dumps({"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def add(store, path, name):
    subprocess.run(everycycle("models", "--store", str(store), "add", "--name", name, str(path)), check=True,
                   capture_output=True, timeout=120)


def test_verify_checks_the_size_always_and_the_hash_when_the_file_changed(tmp_path):
    store = tmp_path / "store"
    add(store, write_tiny_llama(tmp_path / "tiny.gguf", n_ctx=256), "tiny")
    s = Store(store)
    manifest = s.get("tiny")
    s.verify(manifest)  # admitted just now: its stamp matches, nothing hashed
    path = s.path_of(manifest)
    good = path.read_bytes()
    damaged = bytearray(good)
    damaged[-100:] = bytes(100)  # the same size: only the hash can tell
    path.write_bytes(bytes(damaged))
    with pytest.raises(StoreError, match="'tiny' is damaged: its file's sha256 no longer matches"):
        s.verify(manifest)
    path.write_bytes(good[:-64])
    with pytest.raises(StoreError, match="has 1?[0-9,]+ bytes where its manifest says"):
        s.verify(manifest)
    path.write_bytes(good)  # mended: the hash matches again, and the stamp is renewed
    s.verify(manifest)
    assert (store / "tiny" / VERIFIED).read_text().split()[0] == str(len(good))


def test_a_damaged_model_is_a_409_naming_it_and_a_failed_load_is_refused_until_its_file_changes(tmp_path):
    store = tmp_path / "store"
    add(store, write_tiny_llama(tmp_path / "tiny.gguf", n_ctx=256), "tiny")
    # a GGUF whose header reads (so the store admits it) and which llama.cpp cannot load: no tensors
    w = gguf.GGUFWriter(str(tmp_path / "hollow.gguf"), "llama")
    w.add_context_length(256)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_ti_data_to_file(), w.close()
    add(store, tmp_path / "hollow.gguf", "hollow")
    tiny = store / "tiny" / "tiny.gguf"
    good = tiny.read_bytes()
    (tmp_path / "run").mkdir()
    with running_serve(["--ctx-size", "256", "--parallel", "1", "--model-store", str(store)], tmp_path / "run",
                       "serve") as (base, proc):
        damaged = bytearray(good)
        damaged[-100:] = bytes(100)
        tiny.write_bytes(bytes(damaged))
        status, body = ask(base, "tiny")
        assert status == 409 and body["error"]["code"] == "model_damaged" and "'tiny'" in body["error"]["message"]
        tiny.write_bytes(good[:-64])
        status, body = ask(base, "tiny")
        assert status == 409 and "bytes where its manifest says" in body["error"]["message"]
        tiny.write_bytes(good)
        assert ask(base, "tiny")[0] == 200
        for _ in range(3):  # the first while it loads, then at once from the pool, its engine gone
            status, body = ask(base, "hollow")
            assert status == 409 and body["error"]["code"] == "model_load_failed", body
        assert "unloading hollow (its load failed)" in proc.log()
        assert proc.log().count("loading hollow on demand") == 1  # not started again while its file is the same


def test_a_split_gguf_is_added_by_its_first_part_checked_part_by_part_planned_whole_and_served(tmp_path):
    """#59: a model split into parts (FILE-00001-of-0000N.gguf, as gguf-split and the Hub's large quantizations
    are) is added by its first part with the others beside it, kept under the names llama.cpp looks for, its
    table read from every part (the planner sees all its layers), each part checked before a load, and served:
    llama.cpp loads the set from the first part's path. A set missing a part is refused naming it."""
    from host_runtime.placement.model_table import read_table

    (tmp_path / "whole").mkdir()
    (tmp_path / "split").mkdir()
    whole = write_tiny_llama(tmp_path / "whole" / "tiny.gguf", n_ctx=256, n_layer=4)
    first = write_tiny_llama(tmp_path / "split" / "tiny.gguf", n_ctx=256, n_layer=4, split_max_tensors=12)
    assert first.name == "tiny-00001-of-00004.gguf"
    a, b = read_table(whole), read_table(first)
    assert (b.n_layer, b.layer_tensors, b.output_tensors) == (a.n_layer, a.layer_tensors, a.output_tensors)
    assert b.file_bytes == sum(f.stat().st_size for f in (tmp_path / "split").iterdir())

    store = tmp_path / "store"
    add(store, first, "tiny-split")
    s = Store(store)
    manifest = s.get("tiny-split")
    assert [f for f, _, _ in manifest.files()] == [f"tiny-split-{k:05d}-of-00004.gguf" for k in range(1, 5)]
    assert manifest.size == b.file_bytes and len(manifest.parts) == 3
    s.verify(manifest)
    third = store / "tiny-split" / "tiny-split-00003-of-00004.gguf"
    good = third.read_bytes()
    third.write_bytes(good[:-8] + bytes(8))  # the same size: only that part's hash can tell
    with pytest.raises(StoreError, match="its part tiny-split-00003-of-00004.gguf's sha256 no longer matches"):
        s.verify(manifest)
    third.write_bytes(good)
    again = s.copy("tiny-split", "again")  # Ollama's /api/copy: every part linked, under the names it had
    assert [f for f, _, _ in again.files()] == [f for f, _, _ in manifest.files()]
    s.verify(again)

    (tmp_path / "run").mkdir()
    with running_serve(["--ctx-size", "256", "--parallel", "1", "--model-store", str(store)], tmp_path / "run",
                       "serve") as (base, proc):
        status, body = ask(base, "tiny-split")
        assert status == 200 and body["usage"]["completion_tokens"] >= 1, body

    (tmp_path / "split" / "tiny-00004-of-00004.gguf").unlink()
    out = subprocess.run(everycycle("models", "--store", str(store), "add", "--name", "lacking", str(first)),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "part 4 (tiny-00004-of-00004.gguf) is not beside it" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and not (store / "lacking").exists()
