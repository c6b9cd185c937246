"""The catalog (#59): the shipped entries are data a test checks (every field present and in its shape, names
unique), a short name resolves to its pull source (its default quantization, or the one a tag asks for), and the
owner's own catalog adds entries and wins on a shared name; a malformed one is refused naming the entry and field."""

from __future__ import annotations

import json
import os
import subprocess
import tomllib

import pytest

from host_runtime.models import catalog
from host_runtime.models.catalog_shipped import SHIPPED
from host_runtime.models.errors import SourceRefused
from tests.servers import everycycle

FIELDS = {"name", "tag", "repo", "context", "can", "license", "why"}


def test_every_shipped_entry_has_its_fields_and_a_name_of_its_own(monkeypatch):
    monkeypatch.delenv("EVERYCYCLE_CATALOG", raising=False)
    monkeypatch.delenv("EVERYCYCLE_STATE_DIR", raising=False)
    raw = tomllib.loads(SHIPPED)["model"]
    assert all(FIELDS <= set(entry) and ("quants" in entry) != ("file" in entry) for entry in raw), raw
    entries = catalog.entries()
    names = [e.full_name for e in entries]
    assert len(names) == len(set(names)) == len(raw) >= 8
    assert {a for e in entries for a in e.can} >= {"tools", "reasoning", "vision", "embeddings", "rerank", "fim",
                                                    "speech"}
    assert all(e.source().startswith("hf://") for e in entries)


def test_a_short_name_resolves_to_its_repository_and_quantization(monkeypatch):
    monkeypatch.delenv("EVERYCYCLE_CATALOG", raising=False)
    monkeypatch.delenv("EVERYCYCLE_STATE_DIR", raising=False)
    entry, source = catalog.resolve("qwen3:8b")
    assert (source, entry.store_name) == ("hf://Qwen/Qwen3-8B-GGUF:Q4_K_M", "qwen3-8b")
    assert catalog.resolve("qwen3:8b-q8_0")[1] == "hf://Qwen/Qwen3-8B-GGUF:Q8_0"  # Ollama's way to ask a quant
    assert catalog.resolve("whisper:base")[1] == "hf://ggerganov/whisper.cpp/ggml-base.bin"
    assert catalog.resolve("hf://Qwen/Qwen3-8B-GGUF:Q4_K_M") is None and catalog.resolve("nothing-like-it") is None
    for asked, words in (("qwen3:70b", "the catalog has qwen3 as qwen3:8b, qwen3:4b"),
                         ("qwen3:8b-q2_k", "comes in Q4_K_M, Q5_K_M, Q6_K, Q8_0, not q2_k")):
        with pytest.raises(SourceRefused, match=words):
            catalog.resolve(asked)
    assert [catalog.store_name(n) for n in ("tiny:latest", "tiny", "qwen3:8b")] == ["tiny", "tiny", "qwen3-8b"]


def test_the_owners_catalog_adds_and_wins_and_a_bad_one_is_refused_naming_the_field(tmp_path, monkeypatch):
    own = tmp_path / "catalog.toml"
    own.write_text('[[model]]\nname = "qwen3"\ntag = "8b"\nrepo = "me/my-qwen"\nquants = ["Q6_K"]\nsize_gb = 6.7\ncontext = 4096\n'
                   'can = ["tools"]\nlicense = "mine"\nwhy = "the owner\'s own requantization"\n')
    monkeypatch.setenv("EVERYCYCLE_CATALOG", str(own))
    assert catalog.resolve("qwen3:8b")[1] == "hf://me/my-qwen:Q6_K"
    assert len([e for e in catalog.entries() if e.full_name == "qwen3:8b"]) == 1
    for text, words in (('[[model]]\nname = "x"\ntag = "1"\n', "model.0.repo: Field required"),
                        (own.read_text().replace('["tools"]', '["teleport"]'), "model.0.can.0"),
                        (own.read_text() + own.read_text(), "names given twice: qwen3:8b"),
                        (own.read_text().replace('quants = ["Q6_K"]', 'quants = ["Q6_K"]\nfile = "a.gguf"'),
                         "quants .* or file, not both"),
                        ("not = toml = at all", "not TOML")):
        own.write_text(text)
        with pytest.raises(SourceRefused, match=words):
            catalog.entries()


def test_models_catalog_lists_each_entry_with_its_pull_name():
    env = {k: v for k, v in os.environ.items() if k not in ("EVERYCYCLE_CATALOG", "EVERYCYCLE_STATE_DIR")}
    out = subprocess.run(everycycle("models", "catalog", "--json"), capture_output=True, text=True, timeout=60,
                         env=env)
    assert out.returncode == 0, out.stderr
    shown = {e["name"]: e for e in json.loads(out.stdout)}
    assert shown["gemma3:4b"]["pull"] == "hf://ggml-org/gemma-3-4b-it-GGUF:Q4_K_M"
    assert shown["gemma3:4b"]["store_name"] == "gemma3-4b" and "vision" in shown["gemma3:4b"]["can"]


def test_a_store_name_made_from_a_catalog_name_reads_back_as_that_name(monkeypatch, tmp_path):
    """Ollama's clients list a catalog pull by the name they pulled it by (#59): qwen3-8b is qwen3:8b, a chosen
    quantization keeps its suffix, any other name is none of the catalog's; a broken owner's catalog lists by the
    store's name rather than failing the listing."""
    from host_runtime.models.catalog import catalog_name

    monkeypatch.delenv("EVERYCYCLE_CATALOG", raising=False)
    monkeypatch.delenv("EVERYCYCLE_STATE_DIR", raising=False)
    assert catalog_name("qwen3-8b") == "qwen3:8b"
    assert catalog_name("qwen3-8b-q8_0") == "qwen3:8b-q8_0"
    assert catalog_name("qwen3-8b-q2_k") is None and catalog_name("my-model") is None
    broken = tmp_path / "catalog.toml"
    broken.write_text("[[model]]\nname = 1\n")
    monkeypatch.setenv("EVERYCYCLE_CATALOG", str(broken))
    assert catalog_name("qwen3-8b") is None
