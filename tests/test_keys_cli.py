"""`everycycle keys` and the key file: shown once, stored hashed, 0600, atomic."""

from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest

from host_runtime.auth.keystore import KeyStoreError, KeyVerifier, create_key, load_keys, revoke_key
from host_runtime.common.atomic_file import atomic_write
from tests.servers import everycycle


def run(*args):
    return subprocess.run(everycycle(*args), capture_output=True, text=True, timeout=60)


def test_keys_create_prints_once_and_stores_only_a_hash(tmp_path):
    keys = tmp_path / "keys.json"
    out = run("keys", "create", "--keys", str(keys), "laptop")
    assert out.returncode == 0
    key = out.stdout.strip()
    assert key.startswith("ec-") and len(key) > 40
    assert "only time" in out.stderr
    assert stat.S_IMODE(os.stat(keys).st_mode) == 0o600
    raw = keys.read_text()
    assert key not in raw
    (stored,) = json.loads(raw)["keys"]
    assert stored["name"] == "laptop" and len(stored["sha256"]) == 64
    listing = run("keys", "list", "--keys", str(keys))
    assert listing.stdout.startswith("laptop\t") and key not in listing.stdout


def test_keys_import_stores_the_hash_of_a_key_from_a_private_file_and_refuses_a_readable_one(tmp_path):
    from host_runtime.auth.keystore import KeyVerifier

    made = run("keys", "create", "--keys", str(tmp_path / "a.json"), "fleet").stdout.strip()
    key_file = tmp_path / "fleet.key"
    key_file.write_text(made + "\n")
    key_file.chmod(0o644)
    refused = run("keys", "import", "--keys", str(tmp_path / "b.json"), "--key-file", str(key_file), "fleet")
    assert refused.returncode == 2 and "--key-file" in refused.stderr and "0600" in refused.stderr
    assert not (tmp_path / "b.json").exists()
    key_file.chmod(0o600)
    assert run("keys", "import", "--keys", str(tmp_path / "b.json"), "--key-file", str(key_file), "fleet").returncode == 0
    assert made not in (tmp_path / "b.json").read_text()
    assert KeyVerifier(tmp_path / "b.json").verify(made) == "fleet"


def test_duplicate_name_and_empty_name_are_refused(tmp_path):
    keys = tmp_path / "keys.json"
    create_key(keys, "a")
    dup = run("keys", "create", "--keys", str(keys), "a")
    assert dup.returncode == 2 and "already exists" in dup.stderr and "Traceback" not in dup.stderr
    with pytest.raises(KeyStoreError):
        create_key(keys, "  ")


def test_verifier_accepts_current_keys_and_follows_the_file(tmp_path):
    keys = tmp_path / "keys.json"
    a = create_key(keys, "a")
    verifier = KeyVerifier(keys)
    assert verifier.verify(a) == "a"
    assert verifier.verify(a + "x") is None
    b = create_key(keys, "b")
    assert verifier.verify(b) == "b"  # picked up without a restart
    assert revoke_key(keys, "a")
    assert verifier.verify(a) is None
    assert not revoke_key(keys, "a")


def test_revoke_cli(tmp_path):
    keys = tmp_path / "keys.json"
    create_key(keys, "a")
    assert run("keys", "revoke", "--keys", str(keys), "a").returncode == 0
    missing = run("keys", "revoke", "--keys", str(keys), "a")
    assert missing.returncode == 2 and "no key named" in missing.stderr
    assert run("keys", "revoke", "--keys", str(keys), "--missing-ok", "a").returncode == 0


def test_malformed_key_file_is_a_clear_error(tmp_path):
    keys = tmp_path / "keys.json"
    keys.write_text("{not json")
    with pytest.raises(KeyStoreError, match="malformed"):
        load_keys(keys)
    out = run("keys", "list", "--keys", str(keys))
    assert out.returncode == 2 and "malformed" in out.stderr


def test_serve_refuses_a_readable_key_file(tmp_path):
    keys = tmp_path / "keys.json"
    create_key(keys, "a")
    os.chmod(keys, 0o644)
    out = run("serve", "--keys", str(keys), "--port", "0")
    assert out.returncode == 2 and "--keys" in out.stderr and "0600" in out.stderr


def test_serve_argument_errors_name_the_option():
    out = run("serve", "--port", "99999")
    assert out.returncode == 2 and "--port" in out.stderr
    out = run("serve", "--parallel", "0")
    assert out.returncode == 2 and "--parallel" in out.stderr
    assert run("serve", "--help").returncode == 0


def test_atomic_write_replaces_whole_and_sets_mode_first(tmp_path):
    target = tmp_path / "sub" / "secret"
    atomic_write(target, b"one", mode=0o600)
    atomic_write(target, b"two", mode=0o600)
    assert target.read_bytes() == b"two"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600
    assert [p.name for p in target.parent.iterdir()] == ["secret"]  # no temp files left behind


def test_a_key_carries_a_priority_class_that_a_request_may_lower_but_never_raise(tmp_path):
    from types import SimpleNamespace

    from host_runtime.serving.app import priority_for
    from host_runtime.serving.errors import APIError

    keys = tmp_path / "keys.json"
    chat = run("keys", "create", "--keys", str(keys), "--priority", "interactive", "alice").stdout.strip()
    nightly = create_key(keys, "nightly", "batch")
    assert run("keys", "create", "--keys", str(keys), "--priority", "urgent", "x").returncode == 2
    verifier = KeyVerifier(keys)
    assert verifier.verify(chat) == "alice" and verifier.priority_of("alice") == "interactive"
    assert verifier.verify(nightly) == "nightly" and verifier.priority_of("nightly") == "batch"
    assert run("keys", "set-priority", "--keys", str(keys), "alice", "default").returncode == 0
    assert verifier.verify(chat) == "alice" and verifier.priority_of("alice") == "default"  # re-read on change
    assert "alice\tec-" in run("keys", "list", "--keys", str(keys)).stdout
    assert run("keys", "set-priority", "--keys", str(keys), "bob", "batch").returncode == 2
    assert run("keys", "set-limit", "--keys", str(keys), "--max-concurrent", "2", "nightly").returncode == 0
    assert verifier.verify(nightly) == "nightly" and verifier.max_concurrent_of("nightly") == 2
    assert verifier.max_concurrent_of("alice") == 0 and "nightly\tec-" in run("keys", "list", "--keys", str(keys)).stdout
    assert run("keys", "set-limit", "--keys", str(keys), "--max-concurrent", "-1", "nightly").returncode == 2

    def req(priority):
        return SimpleNamespace(context={"key_priority": priority} if priority else {})
    assert priority_for(req("interactive"), {}) == "interactive"
    assert priority_for(req("interactive"), {"priority": "batch"}) == "batch"       # lowered by the job itself
    assert priority_for(req("batch"), {"priority": "interactive"}) == "batch"       # never raised
    assert priority_for(req(None), {}) == "default"                                  # no keys: everyone equal
    with pytest.raises(APIError) as err:
        priority_for(req(None), {"priority": "urgent"})
    assert err.value.status == 400 and err.value.param == "priority"


def test_a_key_limited_to_addresses(tmp_path):
    """`--from`: a key valid from some addresses only (the fleet key on a member: its gateway's)."""
    keys = tmp_path / "keys.json"
    assert run("keys", "create", "--keys", str(keys), "ci", "--from", "10.0.0.0/24,fd00::7").returncode == 0
    (stored,) = load_keys(keys)
    assert stored.allowed_from == ("10.0.0.0/24", "fd00::7")
    assert stored.allows_address("10.0.0.9") and stored.allows_address("::ffff:10.0.0.9")
    assert not stored.allows_address("10.0.1.9") and not stored.allows_address(None)
    assert "from 10.0.0.0/24,fd00::7" in run("keys", "list", "--keys", str(keys)).stdout
    bad = run("keys", "set-limit", "--keys", str(keys), "ci", "--from", "10.0.0.300")
    assert bad.returncode == 2 and "--from" in bad.stderr and "10.0.0.300" in bad.stderr
    assert run("keys", "set-limit", "--keys", str(keys), "ci", "--from", "").returncode == 0
    assert load_keys(keys)[0].allowed_from == ()


def _create_at_once(keys, barrier, name, out):
    barrier.wait()
    out.put((name, create_key(keys, name)))


def _revoke_at_once(keys, barrier, name, out):
    barrier.wait()
    out.put((name, revoke_key(keys, name)))


def test_twelve_keys_created_at_once_are_all_kept_and_a_racing_revoke_stays_revoked(tmp_path):
    """Each writer reads, changes and writes back the whole file: without one writer at a time, 12 `keys create`
    at once all printed a key and 3 were kept (the other 9 holders got 401), and a revoke racing them could bring
    the revoked key back."""
    import multiprocessing

    keys = tmp_path / "keys.json"
    create_key(keys, "old")
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(13), ctx.Queue()
    procs = [ctx.Process(target=_create_at_once, args=(keys, barrier, f"client-{i}", out)) for i in range(12)]
    procs.append(ctx.Process(target=_revoke_at_once, args=(keys, barrier, "old", out)))
    for p in procs:
        p.start()
    results = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert results.pop("old") is True
    stored = {k.name for k in load_keys(keys)}
    assert stored == {f"client-{i}" for i in range(12)}
    verifier = KeyVerifier(keys)
    assert all(verifier.verify(key) == name for name, key in results.items())
