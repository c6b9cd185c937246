"""Provisioning bundles: validation with named fields, signatures, all-or-nothing apply, network in a namespace."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
import tomli_w

from host_runtime.auth.keystore import KeyVerifier
from provisioning.apply import BundleInvalid, apply
from provisioning.bundle import BundleError, open_bundle
from provisioning.validate import validate
from tests.servers import everycycle
from tests.tiny_gguf import write_tiny_llama

EXAMPLES = Path(__file__).resolve().parents[1] / "provisioning" / "examples"
BASE = {
    "schema_version": 1, "hostname": "box-7",
    "network": {"interfaces": [{"name": "eth0", "mode": "static", "address": "10.20.0.5/24", "gateway": "10.20.0.1",
                                "dns": ["10.20.0.1"]}]},
    "api": {"port": 8443, "generate_keys": ["owner"]},
    "model": {"source": "image"},
    "bmc": {"mode": "ipmi", "address": "10.20.0.9", "user": "admin", "password_file": "files/bmc.pass"},
    "power": {"target_c": 75, "ceiling_c": 87},
}


def make_bundle(root: Path, box: dict | None = None, files: dict[str, bytes] | None = None,
                modes: dict[str, int] | None = None) -> Path:
    box = copy.deepcopy(BASE if box is None else box)
    files = {"files/bmc.pass": b"s3cret\n"} if files is None else files
    root.mkdir(parents=True, exist_ok=True)
    declared = {}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        os.chmod(root / rel, (modes or {}).get(rel, 0o600))
        declared[rel] = hashlib.sha256(data).hexdigest()
    if declared and "files" not in box:
        box["files"] = declared
    (root / "box.toml").write_bytes(tomli_w.dumps(box).encode())
    return root


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() + oct(p.stat().st_mode)
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_shipped_examples_validate():
    for example in EXAMPLES.iterdir():
        assert validate(open_bundle(example)) == [], example.name


def _with(path: str, value):
    box = copy.deepcopy(BASE)
    node = box
    *parents, last = path.split(".")
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    if value is None:
        del node[last]
    else:
        node[last] = value
    return box


FLEET_KEY_TEXT = "ec-" + "f" * 43
FLEET_KEY = {"extra": {"files/fleet.key": FLEET_KEY_TEXT.encode() + b"\n"}}

BAD = [
    ("missing hostname", _with("hostname", None), {}, "hostname"),
    ("hostname with spaces", _with("hostname", "my box"), {}, "hostname"),
    ("port as text", _with("api.port", "8080"), {}, "api.port"),
    ("unknown mode", _with("network.interfaces.0.mode", "carrier-pigeon"), {}, "network.interfaces[0].mode"),
    ("bad address", _with("network.interfaces.0.address", "10.20.0.300/24"), {}, "network.interfaces[0].address"),
    ("gateway outside", _with("network.interfaces.0.gateway", "10.99.0.1"), {}, "network.interfaces[0].gateway"),
    ("dns not an address", _with("network.interfaces.0.dns", ["dns.example"]), {}, "network.interfaces[0].dns[0]"),
    # Each DNS entry becomes a networkd line: a newline in one, on a DHCP link too, added sections of its own.
    ("dns injecting networkd sections on a dhcp link", _with("network.interfaces", [
        {"name": "eth0", "mode": "dhcp", "dns": ["1.1.1.1\n[Route]\nGateway=10.66.0.1"]}]), {},
     "network.interfaces[0].dns[0]"),
    ("colliding addresses", _with("network.interfaces", [
        {"name": "eth0", "mode": "static", "address": "10.20.0.5/24"},
        {"name": "eth1", "mode": "static", "address": "10.20.0.5/24"}]), {}, "network.interfaces[1].address"),
    ("bmc without user", _with("bmc.user", None), {}, "bmc.user"),
    ("ceiling under target", _with("power.ceiling_c", 70), {}, "power.ceiling_c"),
    ("HTTPS and HTTP on one port", _with("api.http_port", 8443), {}, "api.http_port"),
    ("plain HTTP serving on the LAN", _with("api.http", "serve"), {}, "api.http"),
    ("unknown metrics access", _with("api.metrics", "public"), {}, "api.metrics"),
    ("unknown setting", _with("colour", "blue"), {}, "(top level)"),
    ("world-readable secret", None, {"modes": {"files/bmc.pass": 0o644}}, "bmc.password_file"),
    ("hash mismatch", None, {"tamper": "files/bmc.pass"}, "files.files/bmc.pass"),
    ("model not GGUF", _with("model", {"source": "bundle", "path": "files/model.gguf"}),
     {"extra": {"files/model.gguf": b"not a model"}}, "model.path"),
    ("pull without a hash", _with("model", {"source": "pull", "url": "http://10.20.0.2/m.gguf"}), {}, "model.sha256"),
    ("pull without a url", _with("model", {"source": "pull", "sha256": "ab" * 32}), {}, "model.url"),
    ("pull from ftp", _with("model", {"source": "pull", "url": "ftp://10.20.0.2/m.gguf", "sha256": "ab" * 32}), {},
     "model.url"),
    ("hash not hex", _with("model", {"source": "pull", "url": "http://10.20.0.2/m.gguf", "sha256": "xyz"}), {},
     "model.sha256"),
    ("bad model name", _with("model", {"source": "pull", "url": "http://10.20.0.2/m.gguf", "sha256": "ab" * 32,
                                       "name": "../etc"}), {}, "model.name"),
    ("a store model without its name", _with("model", {"source": "store"}), {}, "model.name"),
    ("a url with a store model", _with("model", {"source": "store", "name": "m", "url": "http://10.20.0.2/m.gguf"}),
     {}, "model.url"),
    ("url with the image's model", _with("model", {"source": "image", "url": "http://10.20.0.2/m.gguf"}), {},
     "model.url"),
    ("fleet member without the key", _with("fleet", {"role": "member"}), {}, "fleet.key_file"),
    ("mdns outside a fleet", _with("fleet", {"mdns": True}), {}, "fleet.mdns"),
    ("a requirement of no users", _with("requirement", {"concurrent_users": 0}), {}, "requirement.concurrent_users"),
    ("peers on a member", _with("fleet", {"role": "member", "key_file": "files/fleet.key",
                                          "peers": ["https://10.20.0.6:8443"]}), FLEET_KEY, "fleet.peers"),
    ("the gateway as its own peer", _with("fleet", {"role": "gateway", "key_file": "files/fleet.key",
                                                    "peers": ["https://10.20.0.5:8443"]}), FLEET_KEY, "fleet.peers[0]"),
    ("a peer that is not a URL", _with("fleet", {"role": "gateway", "key_file": "files/fleet.key",
                                                 "peers": ["10.20.0.6"]}), FLEET_KEY, "fleet.peers[0]"),
    ("a virtual address on a member", _with("fleet", {"role": "member", "key_file": "files/fleet.key",
                                                      "virtual_address": "10.20.0.50/24"}), FLEET_KEY,
     "fleet.virtual_address"),
    ("a virtual address without its prefix length",
     _with("fleet", {"role": "gateway", "key_file": "files/fleet.key", "virtual_address": "10.20.0.50"}), FLEET_KEY,
     "fleet.virtual_address"),
    ("a VRRP priority out of range",
     _with("fleet", {"role": "gateway", "key_file": "files/fleet.key", "virtual_address": "10.20.0.50/24",
                     "vrrp_priority": 255}), FLEET_KEY, "fleet.vrrp_priority"),
    ("a VRRP peer that is not an address",
     _with("fleet", {"role": "gateway", "key_file": "files/fleet.key", "virtual_address": "10.20.0.50/24",
                     "vrrp_peers": ["gateway-b"]}), FLEET_KEY, "fleet.vrrp_peers[0]"),
    ("a gateway address that is not one", _with("fleet", {"role": "member", "key_file": "files/fleet.key",
                                                          "gateway_address": ["10.20.0.5", "gw-b"]}), FLEET_KEY,
     "fleet.gateway_address"),
    ("authorized_keys that are not SSH public keys", _with("ssh", {"authorized_keys": "files/keys"}),
     {"extra": {"files/keys": b"-----BEGIN OPENSSH PRIVATE KEY-----\nb3Bl\n"}}, "ssh.authorized_keys"),
    ("a plain-HTTP peer (the fleet key would cross the LAN in clear)",
     _with("fleet", {"role": "gateway", "key_file": "files/fleet.key", "peers": ["http://10.20.0.6:8080"]}),
     FLEET_KEY, "fleet.peers[0]"),
    ("a fleet key of two words", _with("fleet", {"role": "member", "key_file": "files/fleet.key"}),
     {"extra": {"files/fleet.key": b"two words are not one key here\n"}}, "fleet.key_file"),
    ("a readable fleet key", _with("fleet", {"role": "member", "key_file": "files/fleet.key"}),
     {**FLEET_KEY, "modes": {"files/fleet.key": 0o644}}, "fleet.key_file"),
    ("a shard host outside a fleet", _with("fleet", {"shard_listen": "10.20.0.5:50052"}), {}, "fleet.shard_listen"),
    ("a shard host on an address not the box's",
     _with("fleet", {"role": "member", "key_file": "files/fleet.key", "shard_listen": "10.20.0.6:50052"}), FLEET_KEY,
     "fleet.shard_listen"),
    ("a shard host on every address",
     _with("fleet", {"role": "member", "key_file": "files/fleet.key", "shard_listen": "0.0.0.0:50052"}), FLEET_KEY,
     "fleet.shard_listen"),
    ("a shard host lending nothing", _with("fleet", {"role": "member", "key_file": "files/fleet.key",
                                                     "shard_listen": "10.20.0.5:50052", "shard_lend_mib": 0}),
     FLEET_KEY, "fleet.shard_lend_mib"),
    ("shard hosts outside a fleet", _with("fleet", {"shard_hosts": ["10.20.0.7:50052"]}), {}, "fleet.shard_hosts"),
    ("a shard host twice", _with("fleet", {"role": "member", "key_file": "files/fleet.key",
                                           "shard_hosts": ["10.20.0.7:50052", "10.20.0.7:50052"]}), FLEET_KEY,
     "fleet.shard_hosts"),
    ("a shard host that is no address", _with("fleet", {"role": "member", "key_file": "files/fleet.key",
                                                        "shard_hosts": ["box-7:50052"]}), FLEET_KEY,
     "fleet.shard_hosts[0]"),
    ("a peer certificate not in [files]", _with("fleet", {"role": "gateway", "key_file": "files/fleet.key",
                                                          "peers": ["https://10.20.0.6:8443"],
                                                          "peer_certificates": ["files/peer.pem"]}),
     FLEET_KEY, "fleet.peer_certificates[0]"),
    ("a peer certificate that is not one", _with("fleet", {"role": "gateway", "key_file": "files/fleet.key",
                                                           "peers": ["https://10.20.0.6:8443"],
                                                           "peer_certificates": ["files/peer.pem"]}),
     {"extra": {**FLEET_KEY["extra"], "files/peer.pem": b"not a certificate"}}, "fleet.peer_certificates[0]"),
]


@pytest.mark.parametrize("case,box,how,field", BAD, ids=[b[0] for b in BAD])
def test_bad_bundles_are_refused_naming_the_field_and_nothing_changes(tmp_path, case, box, how, field):
    files = {"files/bmc.pass": b"s3cret\n", **how.get("extra", {})}
    bundle_dir = make_bundle(tmp_path / "bundle", box, files, how.get("modes"))
    if "tamper" in how:
        (bundle_dir / how["tamper"]).write_bytes(b"something else\n")
    root = tmp_path / "root"
    make_bundle(tmp_path / "good", _with("hostname", "box-before"))
    apply(open_bundle(tmp_path / "good"), root)  # a provisioned box, to prove nothing moves
    before = tree(root)
    errors = validate(open_bundle(bundle_dir))
    assert field in [e.field for e in errors], [str(e) for e in errors]
    with pytest.raises(BundleInvalid):
        apply(open_bundle(bundle_dir), root)
    assert tree(root) == before
    out = subprocess.run(everycycle("provision", "validate", str(bundle_dir)), capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and f"{field}:" in out.stderr and "Traceback" not in out.stderr


def test_apply_writes_everything_with_the_right_modes_and_removes_secrets(tmp_path):
    bundle_dir = make_bundle(tmp_path / "bundle")
    root = tmp_path / "root"
    result = apply(open_bundle(bundle_dir), root)
    assert result.changed and set(result.generated_keys) == {"owner"}
    assert KeyVerifier(root / "etc/everycycle/api_keys.json").verify(result.generated_keys["owner"]) == "owner"
    assert result.generated_keys["owner"] not in (root / "etc/everycycle/api_keys.json").read_text()
    # box.toml too: it holds the keys' hashes (it was 0644).
    for rel in ("etc/everycycle/api_keys.json", "etc/everycycle/bmc.password", "etc/everycycle/box.toml"):
        assert stat.S_IMODE((root / rel).stat().st_mode) == 0o600, rel
    assert (root / "etc/everycycle/bmc.password").read_bytes() == b"s3cret\n"
    assert (root / "etc/hostname").read_text() == "box-7\n"
    network = (root / "etc/systemd/network/10-everycycle-eth0.network").read_text()
    assert "Address=10.20.0.5/24" in network and "Gateway=10.20.0.1" in network
    assert result.removed_secrets == ["files/bmc.pass"] and not (bundle_dir / "files/bmc.pass").exists()
    record = json.loads((root / "var/lib/everycycle/provisioned.json").read_text())
    assert record["provisioned"] and record["digest"] == result.digest and len(record["history"]) == 1


def test_apply_works_when_var_is_another_file_system(tmp_path):
    """On the box /var is the data partition, /etc the root slot: a rename between them fails (EXDEV), so each
    file is staged beside its target. Here /var is a folder on /dev/shm (tmpfs), /etc on the test's disk."""
    shm = Path("/dev/shm") / f"everycycle-test-{os.getpid()}"
    shm.mkdir()
    try:
        root = tmp_path / "root"
        root.mkdir()
        (root / "var").symlink_to(shm)
        assert os.stat(shm).st_dev != os.stat(root).st_dev
        result = apply(open_bundle(make_bundle(tmp_path / "bundle")), root)
        assert result.changed and (root / "etc/hostname").read_text() == "box-7\n"
        assert json.loads((shm / "lib/everycycle/provisioned.json").read_text())["digest"] == result.digest
        leftovers = [p for p in root.rglob("*") if "everycycle-new" in p.name or "everycycle-old" in p.name]
        assert leftovers == []
    finally:
        shutil.rmtree(shm)


def test_reapplying_changes_nothing_and_a_new_bundle_is_logged(tmp_path):
    root = tmp_path / "root"
    make_bundle(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "a-copy")
    apply(open_bundle(tmp_path / "a"), root)
    before = tree(root)
    again = apply(open_bundle(tmp_path / "a-copy"), root)
    assert not again.changed and tree(root) == before
    make_bundle(tmp_path / "b", _with("hostname", "box-8"))
    assert apply(open_bundle(tmp_path / "b"), root).changed
    assert (root / "etc/hostname").read_text() == "box-8\n"
    assert [h["hostname"] for h in json.loads((root / "var/lib/everycycle/provisioned.json").read_text())["history"]] \
        == ["box-7", "box-8"]


def test_a_failure_mid_apply_restores_the_previous_state(tmp_path):
    root = tmp_path / "root"
    make_bundle(tmp_path / "a")
    apply(open_bundle(tmp_path / "a"), root)
    # A file where the network directory must be: the commit fails after the hostname has moved.
    shutil.rmtree(root / "etc/systemd/network")
    (root / "etc/systemd/network").write_text("not a directory")
    before = tree(root)
    box = _with("network.interfaces", [{"name": "eth0", "mode": "dhcp"}, {"name": "eth1", "mode": "dhcp"}])
    make_bundle(tmp_path / "b", _with("hostname", "box-9") | {"network": box["network"]})
    with pytest.raises(OSError):
        apply(open_bundle(tmp_path / "b"), root)
    assert tree(root) == before
    assert (root / "etc/hostname").read_text() == "box-7\n"


def _keypair(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "pub.pem").write_bytes(pub)
    return pub


def test_signed_bundles(tmp_path):
    pub = _keypair(tmp_path)
    bundle_dir = make_bundle(tmp_path / "bundle")
    unsigned = validate(open_bundle(bundle_dir), pub)
    assert [e.field for e in unsigned] == ["bundle.sig"] and "not signed" in unsigned[0].message
    assert subprocess.run(everycycle("provision", "sign", str(bundle_dir), "--key", str(tmp_path / "key.pem")),
                          capture_output=True, timeout=60).returncode == 0
    assert validate(open_bundle(bundle_dir), pub) == []
    text = (bundle_dir / "box.toml").read_text().replace("box-7", "box-6")  # altered after signing
    (bundle_dir / "box.toml").write_text(text)
    tampered = validate(open_bundle(bundle_dir), pub)
    assert [e.field for e in tampered] == ["bundle.sig"] and "altered" in tampered[0].message
    out = subprocess.run(everycycle("provision", "apply", str(bundle_dir), "--root", str(tmp_path / "root"),
                                    "--require-signature", str(tmp_path / "pub.pem")), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1 and "bundle.sig" in out.stderr and not (tmp_path / "root").exists()


def test_tar_bundles_and_unsafe_archives(tmp_path):
    bundle_dir = make_bundle(tmp_path / "bundle")
    good = tmp_path / "bundle.tar"
    with tarfile.open(good, "w") as tar:
        tar.add(bundle_dir, arcname="bundle")
    assert validate(open_bundle(good)) == []
    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as tar:
        tar.add(bundle_dir / "box.toml", arcname="../../etc/box.toml")
    with pytest.raises(BundleError, match="unsafe archive member"):
        open_bundle(evil)


def test_a_model_shipped_in_the_bundle(tmp_path):
    model = write_tiny_llama(tmp_path / "tiny.gguf")
    box = _with("model", {"source": "bundle", "path": "files/tiny.gguf", "context_length": 512})
    bundle_dir = make_bundle(tmp_path / "bundle", box, {"files/bmc.pass": b"pw\n", "files/tiny.gguf": model.read_bytes()})
    assert validate(open_bundle(bundle_dir)) == []
    root = tmp_path / "root"
    bundle = open_bundle(bundle_dir)
    apply(bundle, root)
    assert (root / "var/lib/everycycle/models/tiny.gguf").read_bytes() == model.read_bytes()
    # Streamed (hardening #35, item 9): first boot held a bundled model in RAM, plus a copy in /tmp to parse it.
    assert "files/tiny.gguf" not in bundle._files
    assert sorted(p.name for p in (root / "var/lib/everycycle/models").iterdir()) == ["tiny.gguf"]  # no copy left
    # A model that is not the one declared: refused, and its copy goes too.
    (bundle_dir / "files/tiny.gguf").write_bytes(model.read_bytes()[:-1] + b"x")
    other = tmp_path / "other"
    with pytest.raises(BundleInvalid, match="sha256"):
        apply(open_bundle(bundle_dir), other)
    assert list((other / "var/lib/everycycle/models").iterdir()) == []
    from host_runtime.common.settings_file import load
    from host_runtime.serving.settings import ServingSettings

    serving = load(ServingSettings, root / "etc/everycycle/serving.toml")
    assert serving.model == "/var/lib/everycycle/models/tiny.gguf" and serving.context_length == 512


def _pull_bundle(tmp_path, url: str, sha256: str) -> Path:
    box = _with("model", {"source": "pull", "url": url, "sha256": sha256, "name": "tiny-pulled"})
    return make_bundle(tmp_path / "bundle", box)


def test_a_model_the_bundle_names_by_source_is_pulled_at_first_boot(tmp_path):
    """apply writes the pull into serving.toml (read back by the server's own parser); the server's first-boot
    pull (the code it runs in its master) fetches it into the store of the sandbox root, and its record says so;
    a second boot finds it there and fetches nothing."""
    from host_runtime.common.settings_file import load
    from host_runtime.models.provisioned import ProvisionedPull, pulled_path, read_status
    from host_runtime.models.store import Store
    from host_runtime.serving.settings import ServingSettings
    from tests.file_server import serve_files

    files = tmp_path / "files"
    files.mkdir()
    model = write_tiny_llama(files / "tiny.gguf", n_ctx=256)
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    server = serve_files(files, fail_first=1)  # the first try meets a restarting server: tried again
    try:
        root = tmp_path / "root"
        bundle = _pull_bundle(tmp_path, f"{server.base}/tiny.gguf", sha)
        assert validate(open_bundle(bundle)) == []
        apply(open_bundle(bundle), root)
        settings = load(ServingSettings, root / "etc/everycycle/serving.toml")
        assert (settings.model, settings.pull_url, settings.pull_sha256, settings.pulled_name) == (
            "", f"{server.base}/tiny.gguf", sha, "tiny-pulled")
        store = Store(root / "var/lib/everycycle/models")
        loaded = []
        job = ProvisionedPull(store, settings.pulled_name, settings.pull_url, settings.pull_sha256,
                              on_pulled=loaded.append)
        import host_runtime.models.provisioned as provisioned

        provisioned.RETRY_FIRST_S = 0.05
        try:
            status = job.run()
        finally:
            provisioned.RETRY_FIRST_S = 5.0
        assert status.state == "pulled" and status.attempts == 2 and loaded == ["tiny-pulled"]
        record = read_status(store)
        assert record.state == "pulled" and record.done_bytes == record.total_bytes == model.stat().st_size
        assert record.source == settings.pull_url and record.finished_at
        assert pulled_path(store, "tiny-pulled", sha).read_bytes() == model.read_bytes()
        assert store.get("tiny-pulled").source == settings.pull_url
        requests = len(server.ranges)
        again = ProvisionedPull(store, "tiny-pulled", settings.pull_url, sha, on_pulled=loaded.append).run()
        assert again.state == "pulled" and len(server.ranges) == requests and loaded == ["tiny-pulled"] * 2
    finally:
        server.shutdown()


def test_a_pull_the_source_refuses_is_not_retried_and_adds_nothing(tmp_path):
    from host_runtime.models.provisioned import ProvisionedPull, read_status
    from host_runtime.models.store import Store
    from tests.file_server import serve_files

    files = tmp_path / "files"
    files.mkdir()
    write_tiny_llama(files / "tiny.gguf", n_ctx=256)
    server = serve_files(files)
    try:
        store = Store(tmp_path / "store")
        for url, why in ((f"{server.base}/tiny.gguf", "sha256"), (f"{server.base}/missing.gguf", "404")):
            loaded = []
            status = ProvisionedPull(store, "tiny", url, "ab" * 32, on_pulled=loaded.append).run()
            assert status.state == "failed" and why in status.error and status.attempts == 1 and not loaded
            assert read_status(store).state == "failed" and store.list() == []
    finally:
        server.shutdown()


def test_a_pull_waiting_to_be_tried_again_ends_at_stop_without_another_try(tmp_path):
    """A passing failure (nothing listens) is tried again after a wait; stop() during the wait ends the pull there,
    with the failure recorded and no further attempt."""
    import socket
    import threading
    import time

    from host_runtime.models.provisioned import ProvisionedPull, read_status
    from host_runtime.models.store import Store

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{unused.getsockname()[1]}/tiny.gguf"
    store = Store(tmp_path / "store")
    job = ProvisionedPull(store, "tiny", url, "ab" * 32)
    finished = []
    worker = threading.Thread(target=lambda: finished.append(job.run()))
    worker.start()
    deadline = time.monotonic() + 30
    while job.status.state != "retrying" and time.monotonic() < deadline:  # the first try failed; it waits 5 s
        time.sleep(0.01)
    job.stop()
    worker.join(10)
    assert not worker.is_alive() and finished
    assert finished[0].state == "retrying" and finished[0].attempts == 1 and "refused" in finished[0].error
    assert read_status(store).attempts == 1 and store.list() == []


def test_static_network_applied_in_a_namespace_with_a_veth_pair(tmp_path, netns):
    subprocess.run(["ip", "netns", "exec", netns, "ip", "link", "add", "pv0", "type", "veth", "peer", "name", "pv1"],
                   check=True)
    box = _with("network.interfaces", [{"name": "pv0", "mode": "static", "address": "10.77.0.2/24",
                                        "gateway": "10.77.0.1"}])
    bundle_dir = make_bundle(tmp_path / "bundle", box)
    root = tmp_path / "root"
    # Its own UTS namespace too: the live apply sets the hostname, which must not leak to this machine.
    cmd = ["ip", "netns", "exec", netns, "unshare", "--uts", "sh", "-c", '"$@" && hostname', "sh",
           *everycycle("provision", "apply", str(bundle_dir), "--root", str(root), "--live-network")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == box["hostname"]
    addrs = json.loads(subprocess.run(["ip", "netns", "exec", netns, "ip", "-j", "addr", "show", "pv0"],
                                      capture_output=True, text=True, check=True).stdout)
    assert {"local": "10.77.0.2", "prefixlen": 24} in [{k: a[k] for k in ("local", "prefixlen")}
                                                       for a in addrs[0]["addr_info"]]
    routes = json.loads(subprocess.run(["ip", "netns", "exec", netns, "ip", "-j", "route"], capture_output=True,
                                       text=True, check=True).stdout)
    assert any(r["dst"] == "default" and r.get("gateway") == "10.77.0.1" for r in routes)
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "nothing changed" in again.stdout


def test_a_refused_live_network_change_is_a_clear_error_and_changes_nothing(tmp_path, netns):
    # What the image's first boot met in a container without CAP_NET_ADMIN: the kernel says no.
    subprocess.run(["ip", "netns", "exec", netns, "ip", "link", "add", "pv0", "type", "veth", "peer", "name", "pv1"],
                   check=True)
    box = _with("network.interfaces", [{"name": "pv0", "mode": "static", "address": "10.77.0.2/24"}])
    bundle_dir = make_bundle(tmp_path / "bundle", box)
    root = tmp_path / "root"
    cmd = ["ip", "netns", "exec", netns, "unshare", "--uts", "setpriv", "--inh-caps=-net_admin",
           "--bounding-set=-net_admin",
           *everycycle("provision", "apply", str(bundle_dir), "--root", str(root), "--live-network")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert "network.interfaces[0]" in out.stderr and "could not configure pv0" in out.stderr
    assert not (root / "var/lib/everycycle/provisioned.json").exists()
    assert not (root / "etc/everycycle/api_keys.json").exists()


def test_live_network_waits_for_a_late_interface_and_names_a_missing_one(tmp_path, netns):
    # At first boot the NIC can appear after the first-boot unit started.
    box = _with("network.interfaces", [{"name": "late0", "mode": "static", "address": "10.78.0.2/24"}])
    bundle_dir = make_bundle(tmp_path / "bundle", box)
    apply_cmd = ["ip", "netns", "exec", netns, "unshare", "--uts",
                 *everycycle("provision", "apply", str(bundle_dir), "--live-network")]
    missing = subprocess.run([*apply_cmd, "--root", str(tmp_path / "r1"), "--wait-for-links", "0.5"],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "there is no interface 'late0'" in missing.stderr
    assert "Traceback" not in missing.stderr and not (tmp_path / "r1/etc/everycycle").exists()
    late = subprocess.Popen([*apply_cmd, "--root", str(tmp_path / "r2"), "--wait-for-links", "20"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)
    assert late.poll() is None  # still waiting for late0
    subprocess.run(["ip", "netns", "exec", netns, "ip", "link", "add", "late0", "type", "veth", "peer", "name", "late1"],
                   check=True)
    out, err = late.communicate(timeout=60)
    assert late.returncode == 0, err
    addrs = subprocess.run(["ip", "netns", "exec", netns, "ip", "-j", "addr", "show", "late0"], capture_output=True,
                           text=True, check=True).stdout
    assert "10.78.0.2" in addrs


def test_the_front_reads_back_what_provisioning_wrote(tmp_path):
    """box.toml's [api] reaches the front (and the API's /metrics rule) as front.toml, through the front's parser."""
    from host_runtime.front import settings as front_settings

    box = _with("api", {"port": 9443, "http_port": 9080, "http": "off", "metrics": "loopback",
                        "generate_keys": ["owner"]})
    apply(open_bundle(make_bundle(tmp_path / "bundle", box)), tmp_path / "root")
    front = front_settings.load(tmp_path / "root/etc/everycycle/front.toml")
    assert front == front_settings.FrontSettings(https_port=9443, http_port=9080, http="off", metrics="loopback")


def test_first_boot_hands_generated_keys_to_the_console_not_to_its_output(tmp_path):
    """First boot's output reaches the journal and the serial console: the key must not be in it."""
    from host_runtime.auth.keystore import hash_key
    from host_runtime.auth.new_keys import read_new_keys

    bundle_dir = make_bundle(tmp_path / "bundle")
    handoff = tmp_path / "run" / "new-keys.json"
    out = subprocess.run(everycycle("provision", "apply", str(bundle_dir), "--root", str(tmp_path / "root"),
                                    "--new-keys-file", str(handoff)), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    keys = read_new_keys(handoff)
    assert list(keys) == ["owner"] and keys["owner"].startswith("ec-")
    assert keys["owner"] not in out.stdout + out.stderr and "shown once on the console" in out.stdout
    assert handoff.stat().st_mode & 0o777 == 0o600
    stored = json.loads((tmp_path / "root/etc/everycycle/api_keys.json").read_text())["keys"]
    assert hash_key(keys["owner"]) in [k["sha256"] for k in stored]


def test_the_secrets_services_read_are_handed_to_their_user(tmp_path):
    """Serving, the front, the BMC agent and the fleet's gateway run unprivileged: the 0600 files they read must be theirs, and stay
    theirs when root's tools (keys create, the wizard) rewrite them atomically (the next test)."""
    from provisioning.apply import SERVICE_READ_FILES, plan_files

    box = _with("api", {"port": 8443, "generate_keys": ["owner"], "tls_certificate": "files/api.crt",
                        "tls_key": "files/api.key"})
    box["bmc"] = {"mode": "ipmi", "address": "10.0.0.9", "user": "admin", "password_file": "files/bmc.pass"}
    box["fleet"] = {"role": "gateway", "key_file": "files/fleet.key", "peers": ["https://10.0.0.3:8443"],
                    "shard_listen": "10.20.0.5:50052", "shard_hosts": ["10.20.0.7:50052"]}
    bundle = open_bundle(make_bundle(tmp_path / "bundle", box, {"files/api.crt": b"c", "files/api.key": b"k",
                                                                "files/bmc.pass": b"p",
                                                                "files/fleet.key": FLEET_KEY_TEXT.encode()},
                                     {"files/api.key": 0o600}))
    secrets = {rel for rel, (_, mode) in plan_files(bundle, {"owner": "ec-x"}).items() if mode == 0o600}
    # Every secret is either the services' or root's own (the admin's SSH keys).
    assert secrets - set(SERVICE_READ_FILES) <= {"root/.ssh/authorized_keys", "etc/everycycle/box.toml"}
    assert set(SERVICE_READ_FILES) <= secrets | {"etc/everycycle/tls/api.key"}


@pytest.mark.root
def test_files_handed_to_the_services_stay_theirs_when_root_rewrites_them(tmp_path):
    from host_runtime.common.atomic_file import atomic_write
    from host_runtime.common.service_user import give_to_services, service_ids

    nobody = service_ids("nobody")
    f = tmp_path / "api_keys.json"
    f.write_text("{}")
    give_to_services(f, "nobody")
    assert (f.stat().st_uid, f.stat().st_gid) == nobody
    atomic_write(f, b'{"keys": []}', 0o600)
    assert (f.stat().st_uid, f.stat().st_gid) == nobody and f.stat().st_mode & 0o777 == 0o600


def test_the_signature_is_checked_before_anything_else_is_read(tmp_path, monkeypatch):
    """Today's order was: hashes, the GGUF parsed, and the signature last."""
    import provisioning.validate as v

    pub = _keypair(tmp_path)
    bundle_dir = make_bundle(tmp_path / "bundle", _with("model", {"source": "bundle", "path": "files/model.gguf"}),
                             {"files/bmc.pass": b"s3cret\n", "files/model.gguf": b"not a model"})
    parsed = []
    monkeypatch.setattr(v, "_parse_gguf", lambda data: parsed.append(data) or (None, "bad"))
    errors = validate(open_bundle(bundle_dir), pub)
    assert [e.field for e in errors] == ["bundle.sig"] and parsed == []


def test_a_baked_in_key_refuses_unsigned_bundles_at_first_boot(tmp_path):
    pub_path = tmp_path / "trust" / "bundle-signing.pub"
    pub_path.parent.mkdir()
    pub_path.write_bytes(_keypair(tmp_path))
    bundle_dir = make_bundle(tmp_path / "bundle")
    argv = everycycle("provision", "apply", str(bundle_dir), "--root", str(tmp_path / "root"),
                      "--trusted-key", str(pub_path))
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "bundle.sig" in out.stderr and not (tmp_path / "root").exists()
    assert subprocess.run(everycycle("provision", "sign", str(bundle_dir), "--key", str(tmp_path / "key.pem")),
                          capture_output=True, timeout=60).returncode == 0
    assert subprocess.run(argv, capture_output=True, text=True, timeout=60).returncode == 0
    # An image without a baked key (no such file) applies unsigned bundles, as before.
    other = make_bundle(tmp_path / "other")
    assert subprocess.run(everycycle("provision", "apply", str(other), "--root", str(tmp_path / "root2"),
                                     "--trusted-key", str(tmp_path / "absent.pub")),
                          capture_output=True, timeout=60).returncode == 0


def test_symlinks_oversized_files_and_the_unpacked_archive(tmp_path):
    from provisioning.apply import _remove_secrets
    from provisioning.bundle import MAX_FILE_BYTES

    outside = tmp_path / "precious"
    outside.write_bytes(b"the box's own file\n")
    bundle_dir = make_bundle(tmp_path / "bundle")
    (bundle_dir / "files/bmc.pass").unlink()
    (bundle_dir / "files/bmc.pass").symlink_to(outside)
    errors = validate(open_bundle(bundle_dir))
    assert "files/bmc.pass" in [e.field for e in errors] and "outside the bundle" in str(errors)
    inside = make_bundle(tmp_path / "inside")  # a link to a file inside the bundle is refused too
    (inside / "files/bmc.pass").unlink()
    (inside / "files/bmc.pass").symlink_to(inside / "box.toml")
    errors = validate(open_bundle(inside))
    assert "files.files/bmc.pass" in [e.field for e in errors] and "symlinks are refused" in str(errors)
    # Wiping secrets never writes through a link: the link goes, its target is untouched.
    _remove_secrets(open_bundle(bundle_dir))
    assert outside.read_bytes() == b"the box's own file\n" and not (bundle_dir / "files/bmc.pass").is_symlink()

    big = make_bundle(tmp_path / "big", files={"files/bmc.pass": b"x" * (MAX_FILE_BYTES + 1)})
    assert any("limit" in e.message for e in validate(open_bundle(big)))

    good = tmp_path / "bundle.tar"
    with tarfile.open(good, "w") as tar:
        tar.add(make_bundle(tmp_path / "good"), arcname="bundle")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    out = subprocess.run(everycycle("provision", "validate", str(good)), capture_output=True, text=True,
                         timeout=60, env={**os.environ, "TMPDIR": str(scratch)})
    assert out.returncode == 0, out.stderr
    assert list(scratch.iterdir()) == []  # the unpacked copy (secrets included) is gone


def test_reapplying_a_bundle_keeps_the_keys_made_on_the_box(tmp_path):
    from host_runtime.auth.keystore import KeyVerifier, create_key

    root = tmp_path / "root"
    apply(open_bundle(make_bundle(tmp_path / "first")), root)
    laptop = create_key(root / "etc/everycycle/api_keys.json", "laptop")  # made on the box, after provisioning
    result = apply(open_bundle(make_bundle(tmp_path / "second", _with("hostname", "box-8"))), root)
    verifier = KeyVerifier(root / "etc/everycycle/api_keys.json")
    assert verifier.verify(laptop) == "laptop"
    assert verifier.verify(result.generated_keys["owner"]) == "owner"  # the bundle's own key is the new one


def test_every_service_reads_back_what_provisioning_wrote_through_its_own_parser(tmp_path):
    """power.ceiling_c and safe_fraction never reached the governor, nothing set it to enforce, and bmc.*/model.*
    went into services.env unquoted. Now each service's settings file is read by the service's own code."""
    import argparse

    from agent_bmc.cli import _settings as bmc_settings_as_the_agent_reads_them
    from agent_bmc.cli import add_arguments as bmc_arguments
    from host_runtime.cli import build_parser
    from host_runtime.common.settings_file import load
    from host_runtime.governor.settings import GovernorSettings

    box = _with("power", {"target_c": 70, "ceiling_c": 83, "safe_fraction": 0.4, "mode": "enforce"})
    box["bmc"]["address"], box["bmc"]["user"] = "10.20.0.9", "admin"
    box["model"]["quantization"] = "Q4_1"
    root = tmp_path / "root"
    apply(open_bundle(make_bundle(tmp_path / "bundle", box)), root)
    etc = root / "etc/everycycle"
    assert not (etc / "services.env").exists()
    assert load(GovernorSettings, etc / "governor.toml") == GovernorSettings(
        backend="auto", mode="enforce", target_c=70.0, ceiling_c=83.0, safe_fraction=0.4)
    # Enforcing needs root (NVML's power-limit write); observing runs as the services' user.
    assert (etc / "governor.env").read_text() == "EVERYCYCLE_GOVERNOR_USER=root\n"
    apply(open_bundle(make_bundle(tmp_path / "observe", _with("hostname", "box-8"))), root)
    assert (etc / "governor.env").read_text() == "EVERYCYCLE_GOVERNOR_USER=everycycle\n"
    parser = argparse.ArgumentParser()
    bmc_arguments(parser)
    agent = bmc_settings_as_the_agent_reads_them(parser, parser.parse_args(["--settings", str(etc / "bmc.toml")]))
    assert agent == {"backend": "ipmi", "host": "10.20.0.9", "port": 623, "user": "admin",
                     "password_file": "/etc/everycycle/bmc.password", "listen": "127.0.0.1:9290", "period": 5.0}
    # The serve command's own parser takes the file (and explicit options still win).
    args = build_parser().parse_args(["serve", "--settings", str(etc / "serving.toml")])
    assert args.settings == str(etc / "serving.toml")


@pytest.mark.parametrize("field,value,named", [
    ("bmc.user", 'x"\nEVERYCYCLE_BIN=/tmp/evil', "bmc.user"),   # a quote and a newline set any variable, before
    ("bmc.address", "10.0.0.1 --user root", "bmc.address"),
    ("power.safe_fraction", 1.5, "power.safe_fraction"),
    ("power.mode", "turbo", "power.mode"),
    ("model.quantization", "Q8_0", "model.quantization"),       # the image's model is Q4_1: it was ignored
    ("model.context_length", 0, "model.context_length"),
])
def test_settings_a_service_cannot_use_are_refused_naming_the_field(tmp_path, field, value, named):
    box = _with(field, value)
    errors = validate(open_bundle(make_bundle(tmp_path / "bundle", box)))
    assert named in [e.field for e in errors], [str(e) for e in errors]


def test_every_box_toml_field_has_an_owner():
    """A new box.toml field must say where it goes: a service's settings file, or the system's own files."""
    schema = json.loads((Path(__file__).parents[1] / "provisioning/box_schema.json").read_text())
    owners = {
        "schema_version": "checked", "hostname": "/etc/hostname", "network": "systemd-networkd",
        "api.port": "front.toml", "api.http_port": "front.toml", "api.http": "front.toml", "api.metrics": "front.toml",
        "api.lan_name": "front.toml",
        "api.prefix_cache": "serving.toml",
        "api.tls_certificate": "front.toml", "api.tls_key": "front.toml", "api.keys": "api_keys.json",
        "api.generate_keys": "api_keys.json", "api.policies": "api_keys.json", "ssh.authorized_keys": "/root/.ssh",
        "model.source": "serving.toml",
        "model.path": "serving.toml", "model.context_length": "serving.toml", "model.quantization": "validated",
        "model.url": "serving.toml", "model.sha256": "serving.toml", "model.name": "serving.toml",
        "bmc.mode": "bmc.toml", "bmc.address": "bmc.toml", "bmc.user": "bmc.toml", "bmc.password_file": "bmc.toml",
        "power.target_c": "governor.toml", "power.ceiling_c": "governor.toml",
        "power.safe_fraction": "governor.toml", "power.mode": "governor.toml", "files": "checked",
        "fleet.role": "fleet.toml", "fleet.key_file": "fleet.key + api_keys.json", "fleet.peers": "fleet.toml",
        "fleet.peer_certificates": "fleet.toml + fleet-peers/", "fleet.policy": "fleet.toml",
        "fleet.gateway_address": "front.toml", "fleet.mdns": "fleet.toml", "fleet.route_by_speed": "fleet.toml",
        "fleet.virtual_address": "fleet.toml + front.toml",
        **{f"fleet.{k}": "fleet.toml" for k in ("vrrp_priority", "vrrp_router_id", "vrrp_peers", "vrrp_interface")},
        "fleet.shard_listen": "fleet.toml + shard-wire.key", "fleet.shard_lend_mib": "fleet.toml",
        "fleet.shard_hosts": "serving.toml + shard-holder.keys",
        "tracing.endpoint": "serving.toml", "tracing.sample_ratio": "serving.toml",
        **{f"serving.{k}": "serving.toml" for k in ("context_length", "parallel", "kv_budget_mib", "speculation",
                                                     "keep_alive", "models_memory_mib", "aliases", "cache_type_k",
                                                     "cache_type_v", "pull_hosts")},
        # read from box.toml itself by `everycycle measure` (no service runs on it)
        **{f"requirement.{k}": "box.toml" for k in ("ttft_p50_s", "time_per_token_s", "concurrent_users",
                                                     "prompt_tokens", "answer_tokens")},
    }
    fields = set()
    for top, node in schema["properties"].items():
        if top in ("api", "ssh", "model", "serving", "bmc", "power", "fleet", "requirement", "tracing"):
            fields |= {f"{top}.{k}" for k in node["properties"]}
        else:
            fields.add(top)
    assert fields == set(owners)


def test_a_shared_prefix_cache_reaches_serving_toml_and_per_key_is_the_default(tmp_path):
    from host_runtime.common.settings_file import load as load_settings
    from host_runtime.serving.settings import ServingSettings

    for value, shared in ((None, False), ("per-key", False), ("shared", True)):
        box = copy.deepcopy(BASE)
        if value:
            box["api"]["prefix_cache"] = value
        root = tmp_path / f"root-{value}"
        apply(open_bundle(make_bundle(tmp_path / f"bundle-{value}", box)), root)
        assert load_settings(ServingSettings, root / "etc/everycycle/serving.toml").prefix_cache_shared is shared
    errors = validate(open_bundle(make_bundle(tmp_path / "bad", _with("api.prefix_cache", "everyone"))))
    assert "api.prefix_cache" in [e.field for e in errors]


def test_tracing_reaches_serving_toml_and_a_bad_endpoint_is_refused_naming_the_field(tmp_path):
    from host_runtime.common.settings_file import load as load_settings
    from host_runtime.serving.settings import ServingSettings

    root = tmp_path / "root"
    apply(open_bundle(make_bundle(tmp_path / "bundle", _with("tracing", {"endpoint": "http://10.0.0.5:4318",
                                                                         "sample_ratio": 0.25}))), root)
    settings = load_settings(ServingSettings, root / "etc/everycycle/serving.toml")
    assert (settings.trace_endpoint, settings.trace_sample_ratio) == ("http://10.0.0.5:4318", 0.25)
    assert load_settings(ServingSettings, None).trace_endpoint == ""  # no [tracing]: off
    for field, value in (("endpoint", "10.0.0.5:4318"), ("endpoint", "http://:4318"), ("endpoint", "http://h:x"),
                         ("sample_ratio", 0), ("sample_ratio", 1.5)):
        errors = validate(open_bundle(make_bundle(tmp_path / f"bad-{field}-{value}", _with("tracing", {field: value}))))
        assert f"tracing.{field}" in [e.field for e in errors], (field, value, [str(e) for e in errors])


def test_a_fleet_gateway_and_a_member_read_back_what_provisioning_wrote(tmp_path):
    """box.toml's [fleet] reaches the gateway (fleet.toml, through its own loader, and the router's command line),
    the API (the fleet key accepted like any key; the gateway's loopback listener) and a member's front."""
    from host_runtime.common.settings_file import load as load_settings
    from host_runtime.fleet import router_process
    from host_runtime.fleet.settings import FleetSettings, load, read_key
    from host_runtime.front import settings as front_settings
    from host_runtime.serving.settings import ServingSettings

    cert = _peer_ca(tmp_path / "peer")  # the member's own local CA, carried to the gateway
    files = {"files/bmc.pass": b"s3cret\n", "files/fleet.key": FLEET_KEY_TEXT.encode() + b"\n", "files/box-8.pem": cert}
    gateway = _with("fleet", {"role": "gateway", "key_file": "files/fleet.key", "peers": ["https://10.20.0.6:8443"],
                              "peer_certificates": ["files/box-8.pem"], "policy": "round_robin"})
    bundle = make_bundle(tmp_path / "gateway", gateway, files)
    root = tmp_path / "root"
    result = apply(open_bundle(bundle), root)
    etc = root / "etc/everycycle"
    fleet = load(etc / "fleet.toml")
    assert fleet == FleetSettings(role="gateway", peers=("http://127.0.0.1:8081", "https://10.20.0.6:8443"),
                                  policy="round_robin", peer_certificates=("/etc/everycycle/fleet-peers/peer-0.pem",),
                                  vouch_for_clients=True)  # its key file holds the voucher's seed
    assert (root / fleet.peer_certificates[0].lstrip("/")).read_bytes() == cert
    argv = router_process.argv(fleet)
    assert argv[argv.index("--ca-cert-paths") + 1] == fleet.peer_certificates[0]
    assert argv[argv.index("--policy") + 1] == "round_robin"
    key_file = root / fleet.key_file.lstrip("/")
    assert read_key(key_file) == FLEET_KEY_TEXT and stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert not (bundle / "files/fleet.key").exists() and "files/fleet.key" in result.removed_secrets
    assert KeyVerifier(etc / "api_keys.json").verify(FLEET_KEY_TEXT) == "fleet"
    serving = load_settings(ServingSettings, etc / "serving.toml")
    assert serving.fleet_listen == "127.0.0.1:8081" and serving.fleet_router == f"127.0.0.1:{fleet.router_port}"
    assert front_settings.load(etc / "front.toml").fleet_gateway == ""
    # One of two gateways: the shared address reaches keepalived's settings and the front's certificate.
    pair = _with("fleet", {"role": "gateway", "key_file": "files/fleet.key", "peers": ["https://10.20.0.6:8443"],
                           "virtual_address": "10.20.0.50/24", "vrrp_priority": 150, "vrrp_peers": ["10.20.0.7"]})
    paired = tmp_path / "paired"
    apply(open_bundle(make_bundle(tmp_path / "pair", pair, {"files/bmc.pass": b"s3cret\n",
                                                            "files/fleet.key": FLEET_KEY_TEXT.encode() + b"\n"})),
          paired)
    fleet = load(paired / "etc/everycycle/fleet.toml")
    assert (fleet.virtual_address, fleet.vrrp_priority, fleet.vrrp_peers) == ("10.20.0.50/24", 150, ("10.20.0.7",))
    assert front_settings.load(paired / "etc/everycycle/front.toml").virtual_address == "10.20.0.50"
    # keepalived needs root; a box without a virtual address runs the program as the fleet's user.
    assert (paired / "etc/everycycle/fleet-address.env").read_text() == "EVERYCYCLE_FLEET_ADDRESS_USER=root\n"
    assert (root / "etc/everycycle/fleet-address.env").read_text() == \
        "EVERYCYCLE_FLEET_ADDRESS_USER=everycycle-fleet\n"

    member = _with("fleet", {"role": "member", "key_file": "files/fleet.key", "gateway_address": "10.20.0.5",
                             "mdns": True})
    member["hostname"] = "box-8"
    files = {"files/bmc.pass": b"s3cret\n", "files/fleet.key": FLEET_KEY_TEXT.encode() + b"\n"}
    other = tmp_path / "other"
    apply(open_bundle(make_bundle(tmp_path / "member", member, files)), other)
    etc = other / "etc/everycycle"
    assert load(etc / "fleet.toml").role == "member" and load(etc / "fleet.toml").mdns   # it announces itself
    assert front_settings.load(etc / "front.toml").fleet_gateway == "10.20.0.5"
    assert load_settings(ServingSettings, etc / "serving.toml").fleet_listen == ""
    assert KeyVerifier(etc / "api_keys.json").verify(FLEET_KEY_TEXT) == "fleet"
    # Leaving the fleet: the fleet key no longer opens this box (a key made on the box stays).
    from host_runtime.auth.keystore import create_key

    laptop = create_key(etc / "api_keys.json", "laptop")
    apply(open_bundle(make_bundle(tmp_path / "alone", _with("hostname", "box-8"))), other)
    verifier = KeyVerifier(etc / "api_keys.json")
    assert verifier.verify(FLEET_KEY_TEXT) is None and verifier.verify(laptop) == "laptop"
    assert load(etc / "fleet.toml").role == "none"


def test_a_shard_host_and_its_holder_read_back_their_wire_keys_and_nothing_outlives_leaving(tmp_path):
    """box.toml's [fleet] shard_listen reaches the shard-host program (fleet.toml, its own wire key) and
    shard_hosts the holder's serving (serving.toml, a key per member): each key opens only its own wires, neither
    file is the fleet key, and a box that stops lending or holding keeps neither."""
    from host_runtime.common.settings_file import load as load_settings
    from host_runtime.fleet.settings import BOX_KEY_FILE, load
    from host_runtime.serving.settings import ServingSettings
    from host_runtime.shard.wire_key import holder_secrets, own_secret, secrets_text

    files = {"files/bmc.pass": b"s3cret\n", "files/fleet.key": FLEET_KEY_TEXT.encode() + b"\n"}
    box = _with("fleet", {"role": "member", "key_file": "files/fleet.key", "gateway_address": "10.20.0.1",
                          "shard_listen": "10.20.0.5:50052", "shard_lend_mib": 9000,
                          "shard_hosts": ["10.20.0.7:50052", "10.20.0.8:50052"]})
    root = tmp_path / "root"
    apply(open_bundle(make_bundle(tmp_path / "both", box, files)), root)
    etc = root / "etc/everycycle"
    fleet = load(etc / "fleet.toml")
    assert (fleet.shard_listen, fleet.shard_lend_mib) == ("10.20.0.5:50052", 9000)
    wire = root / fleet.shard_wire_key_file.lstrip("/")
    assert stat.S_IMODE(wire.stat().st_mode) == 0o600
    assert own_secret(wire.read_text(), "10.20.0.5:50052") == secrets_text(FLEET_KEY_TEXT, ["10.20.0.5:50052"])
    serving = load_settings(ServingSettings, etc / "serving.toml")
    assert serving.shard_hosts == ("10.20.0.7:50052", "10.20.0.8:50052")
    holder = root / serving.shard_key_file.lstrip("/")
    assert stat.S_IMODE(holder.stat().st_mode) == 0o600
    assert holder_secrets(holder.read_text(), list(serving.shard_hosts)) == \
        secrets_text(FLEET_KEY_TEXT, list(serving.shard_hosts))
    with pytest.raises(ValueError, match="10.20.0.9:50052"):  # a member it was not given a key for
        holder_secrets(holder.read_text(), ["10.20.0.9:50052"])
    # Neither holds the fleet key (a member keeps only its hash), nor a key of another member's wire.
    assert not (root / BOX_KEY_FILE.lstrip("/")).exists()
    assert FLEET_KEY_TEXT not in wire.read_text() + holder.read_text()
    assert "10.20.0.7" not in wire.read_text() and "10.20.0.5" not in holder.read_text()
    apply(open_bundle(make_bundle(tmp_path / "plain", _with("fleet", {"role": "member", "key_file": "files/fleet.key",
                                                                      "gateway_address": "10.20.0.1"}), files)), root)
    assert not wire.exists() and not holder.exists()
    assert load(etc / "fleet.toml").shard_listen == "" and not load_settings(ServingSettings, etc / "serving.toml").shard_hosts


def test_a_member_keeps_only_the_fleet_keys_hash_valid_from_its_gateway_and_nothing_outlives_leaving(tmp_path):
    """Members kept the fleet key in clear although they need only its hash, valid from any address; a box that
    left its fleet kept the key file and peer certificates (hardening #35, item 3)."""
    import falcon.testing

    from host_runtime.fleet.settings import BOX_KEY_FILE, BOX_PEER_CERT_DIR
    from host_runtime.engine.errors import RequestRejected
    from host_runtime.serving.app import AuthMiddleware, handle_api_error

    root = tmp_path / "root"
    etc = root / "etc/everycycle"
    key_file = root / BOX_KEY_FILE.lstrip("/")
    files = {"files/bmc.pass": b"s3cret\n", "files/fleet.key": FLEET_KEY_TEXT.encode() + b"\n",
             "files/box-8.pem": _peer_ca(tmp_path / "peer")}
    gateway = _with("fleet", {"role": "gateway", "key_file": "files/fleet.key", "peers": ["https://10.20.0.6:8443"],
                              "peer_certificates": ["files/box-8.pem"]})
    apply(open_bundle(make_bundle(tmp_path / "gateway", gateway, files)), root)
    assert key_file.exists() and list((root / BOX_PEER_CERT_DIR.lstrip("/")).glob("*.pem"))

    # The same box re-provisioned as a member: the key's hash, valid from the gateway only; no key, no peers.
    member = _with("fleet", {"role": "member", "key_file": "files/fleet.key", "gateway_address": "10.20.0.5"})
    apply(open_bundle(make_bundle(tmp_path / "member", member, {"files/bmc.pass": b"s3cret\n",
                                                                "files/fleet.key": FLEET_KEY_TEXT.encode()})), root)
    assert not key_file.exists() and FLEET_KEY_TEXT not in "".join(
        p.read_text(errors="replace") for p in etc.rglob("*") if p.is_file())
    assert not list((root / BOX_PEER_CERT_DIR.lstrip("/")).glob("*.pem"))
    verifier = KeyVerifier(etc / "api_keys.json")
    assert verifier.verify(FLEET_KEY_TEXT) == "fleet"
    assert verifier.policy_of("fleet").allowed_from == ("10.20.0.5",)

    app = falcon.App(middleware=[AuthMiddleware(verifier)])
    app.add_error_handler(RequestRejected, handle_api_error)
    app.add_route("/v1/models", type("Models", (), {"on_get": lambda self, req, resp: setattr(resp, "media", {})})())
    client = falcon.testing.TestClient(app)
    auth = {"Authorization": f"Bearer {FLEET_KEY_TEXT}"}
    assert client.simulate_get("/v1/models", headers=auth, remote_addr="10.20.0.5").status_code == 200
    refused = client.simulate_get("/v1/models", headers=auth, remote_addr="10.20.0.9")
    assert refused.status_code == 403 and refused.json["error"]["code"] == "address_not_allowed"
    # A client's own X-Forwarded-For over TCP is not believed.
    assert client.simulate_get("/v1/models", headers={**auth, "X-Forwarded-For": "10.20.0.5"},
                               remote_addr="10.20.0.9").status_code == 403


def test_key_policies_in_box_toml_reach_the_keys(tmp_path):
    """A team's limits were `everycycle keys` commands only: box.toml's [api.policies] sets them by key name (#38)."""
    from host_runtime.auth.keystore import load_keys

    box = _with("api", {"port": 8443, "generate_keys": ["alice", "nightly"],
                        "policies": {"nightly": {"priority": "batch", "tokens_per_day": 2_000_000, "max_concurrent": 2,
                                                 "models": ["tiny"], "allowed_from": ["10.20.0.0/24"]}}})
    root = tmp_path / "root"
    result = apply(open_bundle(make_bundle(tmp_path / "bundle", box)), root)
    keys = {k.name: k for k in load_keys(root / "etc/everycycle/api_keys.json")}
    nightly = keys["nightly"]
    assert (nightly.priority, nightly.tokens_per_day, nightly.max_concurrent, nightly.models, nightly.allowed_from) == \
        ("batch", 2_000_000, 2, ("tiny",), ("10.20.0.0/24",))
    assert keys["alice"].priority == "default" and keys["alice"].tokens_per_day == 0
    assert KeyVerifier(root / "etc/everycycle/api_keys.json").verify(result.generated_keys["nightly"]) == "nightly"
    for policies, field in (({"bob": {"priority": "batch"}}, "api.policies.bob"),
                            ({"alice": {"allowed_from": ["10.0.0.300"]}}, "api.policies.alice.allowed_from"),
                            ({"alice": {"priority": "urgent"}}, "api.policies.alice.priority"),
                            ({"alice": {"tokens_per_day": -1}}, "api.policies.alice.tokens_per_day")):
        bad = _with("api", {"port": 8443, "generate_keys": ["alice"], "policies": policies})
        errors = validate(open_bundle(make_bundle(tmp_path / f"bad-{field}", bad)))
        assert field in [e.field for e in errors], (field, errors)


def _peer_ca(state_dir: Path) -> bytes:
    """A member's local CA certificate, as an owner carries it to the gateway's bundle."""
    from host_runtime.front.settings import FrontSettings
    from host_runtime.front.tls import ensure_certificate

    return ensure_certificate(FrontSettings(listen="10.20.0.6"), state_dir).trust_anchor.read_bytes()


def test_a_store_model_is_served_from_the_store_and_one_not_there_is_refused_by_name(tmp_path):
    """The wizard copies a USB stick's GGUF into the store, then names it (model.source = 'store', #37)."""
    from host_runtime.common import settings_file
    from host_runtime.engine.model import default_model_path
    from host_runtime.models import pull as pulling
    from host_runtime.models.store import Store
    from host_runtime.serving.settings import ServingSettings

    root = tmp_path / "root"
    bundle = make_bundle(tmp_path / "b", _with("model", {"source": "store", "name": "smol"}))
    with pytest.raises(BundleInvalid) as refused:
        apply(open_bundle(bundle), root)
    assert [e.field for e in refused.value.errors] == ["model.name"]
    assert "no model 'smol' in this box's store" in str(refused.value)
    assert not (root / "etc/everycycle/serving.toml").exists()  # nothing half-applied
    stored = root / "var/lib/everycycle/models/smol/smol.gguf"
    stored.parent.mkdir(parents=True)
    stored.write_bytes(default_model_path().read_bytes())
    with pytest.raises(BundleInvalid):  # a file there is not a model until the store admits it (its manifest)
        apply(open_bundle(bundle), root)
    stored.unlink()
    pulling.add(Store(root / "var/lib/everycycle/models"), default_model_path(), "smol", say=lambda line: None)
    apply(open_bundle(bundle), root)
    served = settings_file.load(ServingSettings, root / "etc/everycycle/serving.toml")
    assert served.model == "/var/lib/everycycle/models/smol/smol.gguf"


def test_a_member_of_a_fleet_with_two_gateways_takes_the_fleet_key_from_both_and_limits_neither(tmp_path):
    from host_runtime.front import settings as front_settings
    from host_runtime.front.nginx_conf import _per_client_key

    member = _with("fleet", {"role": "member", "key_file": "files/fleet.key",
                             "gateway_address": ["10.20.0.5", "10.20.0.15"]})
    root = tmp_path / "root"
    apply(open_bundle(make_bundle(tmp_path / "member", member, {"files/bmc.pass": b"s3cret\n",
                                                                "files/fleet.key": FLEET_KEY_TEXT.encode()})), root)
    etc = root / "etc/everycycle"
    assert KeyVerifier(etc / "api_keys.json").policy_of("fleet").allowed_from == ("10.20.0.5", "10.20.0.15")
    front = front_settings.load(etc / "front.toml")
    assert front.fleet_gateway == "10.20.0.5,10.20.0.15"
    assert "geo $fleet_gateway { default 0; 10.20.0.5 1; 10.20.0.15 1; }" in "\n".join(_per_client_key(front))


def test_a_bundle_may_name_its_model_from_the_catalog_and_first_boot_pulls_it_without_a_digest(tmp_path):
    """#59: box.toml's [model] url a catalog name (the wizard's catalog choice): no sha256 is asked (the Hub's listing
    gives the pull one, checked after the download); the server's first-boot pull resolves the name to its
    repository's quantization on a loopback Hub and stores it as NAME-TAG; a second boot finds it there by name."""
    import os
    import subprocess
    import sys

    from tests.file_server import serve_files

    files = tmp_path / "files"
    files.mkdir()
    write_tiny_llama(files / "tinyllama-Q8_0.gguf", n_ctx=256)
    catalog = tmp_path / "catalog.toml"
    catalog.write_text('[[model]]\nname = "tinyllama"\ntag = "1b"\nrepo = "someone/tiny"\nquants = ["Q8_0"]\n'
                       'size_gb = 0.01\ncontext = 256\ncan = ["tools"]\nlicense = "test"\nwhy = "the tests\' own"\n')
    server = serve_files(files)
    script = """
import sys
from pathlib import Path
from host_runtime.models.provisioned import ProvisionedPull
from host_runtime.models.store import Store
from host_runtime.serving.settings import ServingSettings
settings = ServingSettings(pull_url="tinyllama:1b")
store = Store(Path(sys.argv[1]))
for _ in range(2):
    status = ProvisionedPull(store, settings.pulled_name, settings.pull_url, settings.pull_sha256).run()
    print(status.state, settings.pulled_name, store.get(settings.pulled_name).source)
"""
    env = {**os.environ, "EVERYCYCLE_CATALOG": str(catalog), "HF_ENDPOINT": server.base, "HF_HUB_OFFLINE": "0",
           "HF_HUB_DISABLE_TELEMETRY": "1"}
    try:
        done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "store")], capture_output=True,
                              text=True, timeout=120, env=env)
        fetched = [p for p in server.paths if p.endswith("tinyllama-Q8_0.gguf")]
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["pulled tinyllama-1b hf://someone/tiny/tinyllama-Q8_0.gguf"] * 2
    assert len(fetched) == 1  # the second boot found it by name and fetched nothing
