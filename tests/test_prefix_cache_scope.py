"""The prefix cache scoped by API key, against the real server (hardening, third pass, item 8)."""

from __future__ import annotations

import uuid

import openai
import pytest

from host_runtime.auth.keystore import create_key
from tests.conftest import MODEL_ID

pytestmark = pytest.mark.system


def test_one_key_does_not_learn_whether_another_sent_a_prompt(server, api_key):
    """cached_tokens (and the time to first token) told a client whether someone else had recently sent the same
    system prompt. By default a key reuses only what its own requests left in the cache."""
    keys_file, key_a = api_key
    key_b = create_key(keys_file, f"other-{uuid.uuid4().hex[:8]}")
    system = f"Session {uuid.uuid4()}. " + "You are a careful assistant who answers briefly and plainly. " * 40

    def cached(key: str) -> int:
        client = openai.OpenAI(base_url=server + "/v1", api_key=key, max_retries=0, timeout=120)
        r = client.chat.completions.create(model=MODEL_ID, max_tokens=2, temperature=0,
                                           messages=[{"role": "system", "content": system},
                                                     {"role": "user", "content": "Hi"}])
        return r.usage.prompt_tokens_details.cached_tokens

    cached(key_a)
    assert cached(key_a) > 0     # the prompt is cacheable: the same key hits
    assert cached(key_b) == 0    # another key: a miss, as if nobody had sent it
    assert cached(key_a) > 0     # and the first key's entry was there all along
