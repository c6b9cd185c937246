"""What one key may learn of the others (#56, item 12): /metrics named every key with its counts to any key, and
a new key given a revoked key's name inherited its cached prompts (the prefix cache's scope was the name)."""

from __future__ import annotations

from types import SimpleNamespace

from host_runtime.auth.keystore import StoredKey
from host_runtime.serving.app import AppConfig, cache_scope
from host_runtime.serving.key_privacy import metrics_for_key

TEXT = """# HELP everycycle_key_requests_total Requests by API key.
# TYPE everycycle_key_requests_total counter
everycycle_key_requests_total{model="a",key="alice"} 4.0
everycycle_key_requests_total{model="a",key="nightly"} 40.0
everycycle_key_generated_tokens_total{model="a",key="alice"} 90.0
everycycle_tokens_generated_total{model="a"} 130.0
"""


def test_a_key_reads_its_own_per_key_series_and_no_other_keys():
    mine = metrics_for_key(TEXT, "alice")
    assert 'key="alice"' in mine and "nightly" not in mine
    assert "everycycle_tokens_generated_total" in mine and "# HELP everycycle_key_requests_total" in mine
    assert 'key="' not in metrics_for_key(TEXT, None)
    assert metrics_for_key(TEXT, "nightly").count('key="nightly"') == 1


def key(name: str, digest: str) -> StoredKey:
    return StoredKey(name, digest, "", 0.0)


def test_a_new_key_under_a_revoked_keys_name_gets_a_cache_scope_of_its_own():
    def scope(stored: StoredKey | None, shared: bool = False):
        req = SimpleNamespace(context={"key_name": stored.name if stored else None, "key_policy": stored})
        return cache_scope(req, AppConfig(engine_socket="/x", prefix_cache_shared=shared))

    old, new = key("laptop", "a" * 64), key("laptop", "b" * 64)
    assert scope(old) != scope(new) and scope(old).startswith("laptop#") and scope(old) == scope(key("laptop", "a" * 64))
    assert scope(old, shared=True) is None and scope(None) is None
