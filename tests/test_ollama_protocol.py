"""Ollama's request bodies checked (pure): what /api/pull takes, and its refusals naming the field."""

from __future__ import annotations

import pytest

from host_runtime.serving.errors import APIError
from host_runtime.serving.ollama_protocol import parse_pull


def test_a_pull_names_where_the_gguf_is():
    assert parse_pull({"model": "http://10.0.0.5:8000/m.gguf"}) == ("http://10.0.0.5:8000/m.gguf", True)
    assert parse_pull({"name": "hf://org/repo/m.gguf", "stream": False, "insecure": True}) == (
        "hf://org/repo/m.gguf", False)  # older clients send `name`; `insecure` is ignored
    # a name without a scheme is the catalog's to resolve (the pull refuses one it lacks: tests/test_ollama_api.py)
    assert parse_pull({"model": "qwen3:8b"}) == ("qwen3:8b", True)
    for body, param, words in (({}, "model", "required"),
                               ({"model": "file:///etc/passwd"}, "model", "not a source this box pulls from"),
                               ({"model": 7}, "model", "must be"),
                               ({"model": "https://x/m.gguf", "stream": "yes"}, "stream", "must be")):
        with pytest.raises(APIError) as err:
            parse_pull(body)
        assert err.value.status == 400 and err.value.param == param and words in err.value.message, body
