"""Ollama's request bodies checked (pure): what /api/pull takes, and its refusals naming the field."""

from __future__ import annotations

import pytest

from host_runtime.serving.errors import APIError
from host_runtime.serving.ollama_protocol import parse_pull


def test_a_pull_names_where_the_gguf_is():
    assert parse_pull({"model": "http://10.0.0.5:8000/m.gguf"}) == ("http://10.0.0.5:8000/m.gguf", True)
    assert parse_pull({"name": "hf://org/repo/m.gguf", "stream": False, "insecure": True}) == (
        "hf://org/repo/m.gguf", False)  # older clients send `name`; `insecure` is ignored
    for body, param, words in (({}, "model", "required"),
                               ({"model": "llama3.2:8b"}, "model", "no Ollama registry"),
                               ({"model": "file:///etc/passwd"}, "model", "no Ollama registry"),
                               ({"model": 7}, "model", "must be"),
                               ({"model": "https://x/m.gguf", "stream": "yes"}, "stream", "must be")):
        with pytest.raises(APIError) as err:
            parse_pull(body)
        assert err.value.status == 400 and err.value.param == param and words in err.value.message, body
