"""ggml's own GGUF reader (through ctypes) gives the planner and the store what the `gguf` package gives, in
milliseconds instead of seconds (bench/gguf_read.py measures that)."""

from __future__ import annotations

import gguf
import pytest

from host_runtime.engine.model import default_model_path
from host_runtime.models.gguf_info import read_info
from host_runtime.placement import gguf_c
from host_runtime.placement.model_table import ModelTableError, _read_table_gguf_package, read_table
from tests.tiny_gguf import write_tiny_llama


def test_the_table_is_the_gguf_packages_for_the_default_model_and_a_tiny_one(tmp_path):
    tiny = write_tiny_llama(tmp_path / "tiny.gguf", n_ctx=256, chat_template="{{ x }}",
                            pooling_type=gguf.PoolingType.LAST)
    for path in (default_model_path(), tiny):
        assert read_table(path) == _read_table_gguf_package(path)
    with gguf_c.GGUFTable(tiny) as table:
        assert table.value("general.architecture") == "llama"
        assert table.value("llama.pooling_type") == int(gguf.PoolingType.LAST)
        assert table.value("tokenizer.chat_template") == "{{ x }}"
        assert table.value("tokenizer.ggml.add_bos_token") is True
        assert table.value("tokenizer.ggml.tokens")[:3] == ["<unk>", "<s>", "</s>"]
        assert table.value("no.such.key") is None
        assert table.data_end() == tiny.stat().st_size
    assert read_info(tiny)["pooling"] == "last" and read_info(tiny)["chat_template"] is True


def test_what_is_not_a_gguf_is_refused(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 64)
    with pytest.raises(ModelTableError, match="not a readable GGUF"):
        read_table(bad)


def test_the_reader_loads_the_libggml_base_llama_cpp_python_loads(tmp_path, monkeypatch):
    """LLAMA_CPP_LIB_PATH (a CUDA build) is where llama-cpp-python loads from; a second libggml-base from the
    wheel beside it is not what the engine's llama.cpp uses. A folder without one: the `gguf` package reads."""
    import llama_cpp.llama_cpp as bindings

    try:
        monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(tmp_path))
        gguf_c._lib.cache_clear()
        assert not gguf_c.available()
        assert read_table(default_model_path()) == _read_table_gguf_package(default_model_path())
        monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(bindings._base_path))
        gguf_c._lib.cache_clear()
        assert gguf_c.available()
    finally:
        gguf_c._lib.cache_clear()
