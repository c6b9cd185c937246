"""Every GGUF someone supplied is read by ggml's C reader in a child process (#56, item 3): the console (root)
judging a store model or a LAN URL's first megabytes, and the API worker admitting a pull. A header crafted to
break the reader breaks the child only: the caller gets a refusal that names the file."""

from __future__ import annotations

import os
import signal

import pytest

from host_runtime.engine.model import default_model_path
from host_runtime.models import gguf_info, verdict
from host_runtime.models.errors import StoreError
from host_runtime.placement.model_table import ModelTable, read_table


def die(*_args, **_kwargs):
    os.kill(os.getpid(), signal.SIGSEGV)  # what a reader broken by a crafted header does


def test_the_consoles_verdict_reads_the_table_in_an_unprivileged_child_and_gets_the_same_table():
    table, size = verdict.read_source_table(str(default_model_path()))
    assert table == read_table(default_model_path()) and size == default_model_path().stat().st_size
    doc = gguf_info.read_isolated(default_model_path(), "table")
    assert ModelTable.from_json(doc) == table
    if os.geteuid() == 0:
        assert doc["reader_uid"] == gguf_info.unprivileged_ids()[0] != 0


def test_a_reader_that_dies_on_a_file_takes_neither_the_console_nor_the_api_worker_with_it(monkeypatch):
    monkeypatch.setattr(gguf_info, "read_table_fd", die)
    monkeypatch.setattr(gguf_info, "facts_from_fd", die)
    with pytest.raises(verdict.VerdictError, match="ggml's reader died on it"):
        verdict.read_source_table(str(default_model_path()))  # the console's models panel and wizard
    with pytest.raises(StoreError, match=r"SmolLM2.*died on it \(signal 11\)"):
        gguf_info.read_info(default_model_path())  # models add, pull, and the API worker's /api/pull


def test_the_childs_answer_is_checked_not_trusted():
    doc = gguf_info.read_isolated(default_model_path(), "table")
    for broken in ({**doc, "n_layer": "30"}, {**doc, "layer_tensors": [[["x", 0, [1], "9"]]]},
                   {k: v for k, v in doc.items() if k != "kv_k_width"}, {**doc, "tied_output": 1}):
        with pytest.raises(Exception, match="not a tensor table"):
            ModelTable.from_json(broken)
