"""The LAN-facing front (nginx) before the real serving API: TLS, slow clients, per-client limits, settings."""

from __future__ import annotations

import json
import re
import socket
import ssl
import time
from pathlib import Path

import pytest

from host_runtime.front import settings as front_settings
from host_runtime.front.nginx_conf import FrontPaths, render
from host_runtime.front.settings import FrontSettings, SettingsError
from host_runtime.front.tls import (CertificatePair, LocalCA, check_pair, ensure_certificate, fingerprint,
                                    leaf_facts, leaf_paths, refresh_leaf, reissue_reason, self_signed_paths)
from tests.conftest import MODEL_ID
from tests.servers import Proc, everycycle, free_port, http_get, wait_for

# ---- pure: settings and the rendered config ------------------------------------------------------------------


def test_settings_round_trip_through_their_own_parser(tmp_path):
    s = FrontSettings(listen="192.168.1.5", https_port=9443, http="off", metrics="loopback")
    front_settings.save(s, tmp_path / "front.toml")
    assert front_settings.load(tmp_path / "front.toml") == s
    assert front_settings.load(tmp_path / "absent.toml") == FrontSettings()


@pytest.mark.parametrize("doc,field", [
    ({"http": "serve"}, "http"),                       # clear text on the LAN address
    ({"listen": "box.local"}, "listen"),
    ({"https_port": 70000}, "https_port"),
    ({"http_port": 8443}, "http_port"),                # the same as https_port
    ({"metrics": "public"}, "metrics"),
    ({"certificate": "/etc/x.crt"}, "certificate"),    # without its key
    ({"connections_per_client": 0}, "connections_per_client"),
    ({"https_port": "443"}, "https_port"),
    ({"colour": "blue"}, "colour"),
])
def test_bad_settings_name_the_field(doc, field):
    with pytest.raises(SettingsError) as exc:
        front_settings.from_mapping(doc)
    assert exc.value.field == field


def _conf(**kw) -> str:
    pair = CertificatePair(Path("/c.crt"), Path("/c.key"), "local-ca", LocalCA(Path("/ca.crt"), Path("/ca.key")))
    return render(FrontSettings(**kw), FrontPaths(Path("/run/f"), Path("/run/s.sock")), pair)


def test_rendered_config_redirects_http_and_limits_clients():
    conf = _conf()
    assert "listen 0.0.0.0:8443 ssl;" in conf and "ssl_certificate /c.crt;" in conf
    assert "return 308 https://$host:8443$request_uri;" in conf
    assert "location = /health { proxy_pass http://serving; }" in conf
    # The local CA in clear too (a client fetches it before it can check any certificate), never its key.
    assert conf.count("location = /ca.crt { default_type application/x-pem-file; alias /ca.crt; }") == 2
    assert "ca.key" not in conf and "c.key;" in conf
    assert "client_header_timeout 10s;" in conf and "limit_conn per_client_conn 64;" in conf
    assert "server unix:/run/s.sock;" in conf
    # With HTTP off there is one server only; "loopback" metrics are denied to everyone else by nginx.
    off = _conf(http="off", metrics="loopback")
    assert off.count("server {") == 1 and "listen 0.0.0.0:8080" not in off
    assert "location = /metrics { allow 127.0.0.1; allow ::1; deny all;" in off


def test_plain_http_on_the_lan_is_the_owners_explicit_choice():
    """An owner whose clients cannot use TLS could not choose plain HTTP on the LAN at all (#37)."""
    with pytest.raises(SettingsError, match="serve-lan"):
        FrontSettings(listen="0.0.0.0", http="serve")  # 'serve' stays a developer's loopback mode
    conf = _conf(http="serve-lan")
    http_server = conf[conf.index("listen 0.0.0.0:8080"):]
    assert "location / { proxy_pass http://serving; }" in http_server and "return 308" not in http_server
    assert front_settings.from_box({"api": {"http": "serve-lan"}}).http == "serve-lan"
    with pytest.raises(SettingsError) as exc:
        front_settings.from_box({"api": {"http": "serve"}})
    assert exc.value.field == "api.http"


def test_on_the_fleet_gateway_v1_goes_to_the_router_after_the_box_accepts_the_key_which_goes_no_further():
    pair = CertificatePair(Path("/c.crt"), Path("/c.key"), True)
    conf = render(FrontSettings(http="off"), FrontPaths(Path("/run/f"), Path("/run/s.sock"), gateway_port=8090), pair)
    assert "upstream fleet_router { server 127.0.0.1:8090;" in conf
    fleet = next(line for line in conf.splitlines() if "proxy_pass http://fleet_router;" in line)
    routes = re.compile(fleet.split("location ~ ", 1)[1].split(" {", 1)[0])
    # Only the inference routes go to the router: not its control plane nor its shared conversation store.
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models", "/v1/models/smol"):
        assert routes.match(path), path
    for path in ("/v1/tokenizers", "/v1/conversations", "/v1/conversations/x/items", "/v1/responses/abc",
                 "/workers", "/v1/workers", "/v1/chat/completionsX", "/v1/everycycle/capabilities"):
        assert not routes.match(path), path
    assert "auth_request /_fleet_auth;" in fleet and "proxy_pass http://fleet_router;" in fleet
    # One trace from the key check to the box that answers: both get the traceparent the gateway's maps choose
    auth = next(line for line in conf.splitlines() if "location = /_fleet_auth" in line)
    assert "proxy_set_header traceparent $fleet_traceparent;" in fleet and "$fleet_traceparent;" in auth
    assert "map $http_traceparent $fleet_traceparent" in conf
    # The client's key goes no further: the gateway API's voucher for it goes in its place (#56, item 6).
    assert "auth_request_set $fleet_vouch $upstream_http_x_everycycle_vouch;" in fleet
    assert "proxy_set_header Authorization $fleet_authorization;" in fleet and 'proxy_set_header X-Api-Key "";' in fleet
    assert 'map $fleet_vouch $fleet_authorization { "" ""; default "Bearer $fleet_vouch"; }' in conf
    assert "proxy_pass http://serving/v1/everycycle/auth;" in conf
    assert "location @unauthorized" in conf and '"code": "invalid_api_key"' in conf
    # The router's plain-text 404 and 5xx go to the box's API, which says which it was; nginx's own limits keep
    # their pages there (a location with its own error_page inherits none of the server's).
    assert "proxy_intercept_errors on;" in fleet and "error_page 404 502 503 504 = @fleet_unroutable;" in fleet
    # nginx's own limits refuse with 599, answered as 429 by @too_many; a box's 429 passes as the box said it, and
    # its 403 too (a key kept from a model): neither becomes the front's page.
    assert "error_page 599 = @too_many;" in fleet and "error_page 413 @too_large;" in fleet
    assert "error_page 429" not in fleet and "error_page 403" not in fleet and "limit_req_status 599;" in conf
    assert "error_page 430 = @fleet_key_limit;" in fleet
    assert "return 429 $upstream_http_x_everycycle_error;" in conf
    assert "rewrite ^ /v1/everycycle/fleet/unroutable break; proxy_pass http://serving;" in conf
    assert "fleet_router" not in _conf()  # a box that is not the gateway serves its own API only
    # The link probe is never spooled to a temp file under /run (RAM) for a client that stops reading.
    assert "location = /v1/everycycle/probe { proxy_max_temp_file_size 0;" in conf
    assert "location = /v1/everycycle/probe { proxy_max_temp_file_size 0;" in _conf()


def _handshake(pair: CertificatePair, trusted: Path, server_hostname: str) -> None:
    """A TLS handshake on loopback: a server with `pair`, a client that trusts `trusted` only (OpenSSL checks the
    chain, the name and the CA's name constraints). Raises ssl.SSLCertVerificationError when it does not trust."""
    import threading

    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(pair.certificate, pair.private_key)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve():
        conn, _ = listener.accept()
        try:
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1)
        except (ssl.SSLError, OSError):
            pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        client_ctx = ssl.create_default_context(cafile=str(trusted))
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            with client_ctx.wrap_socket(raw, server_hostname=server_hostname) as tls:
                tls.sendall(b"x")
    finally:
        thread.join(10)
        listener.close()


def test_clients_are_told_where_to_fetch_what_they_trust():
    from host_runtime.front.trust import trust_anchor

    ca_pair = CertificatePair(Path("/b.crt"), Path("/b.key"), "local-ca", LocalCA(Path("/ca.crt"), Path("/ca.key")))
    legacy = CertificatePair(Path("/s.crt"), Path("/s.key"), "self-signed")
    assert trust_anchor(FrontSettings(), ca_pair, "shed.lan").url == "http://shed.local:8080/ca.crt"
    assert trust_anchor(FrontSettings(lan_name=False), ca_pair, "shed.lan").url == "http://shed:8080/ca.crt"
    assert trust_anchor(FrontSettings(http="off"), legacy, "shed").url == "https://shed.local:8443/everycycle.crt"
    assert trust_anchor(FrontSettings(listen="10.0.0.5"), ca_pair, "shed").url == "http://10.0.0.5:8080/ca.crt"


def test_the_local_ca_is_made_once_and_vouches_for_the_fronts_certificate(tmp_path):
    """A self-signed certificate for the addresses of the first start broke clients at the next DHCP lease (#37):
    the front's certificate is the box's own CA's, which clients trust once."""
    settings = FrontSettings(listen="0.0.0.0")
    pair = ensure_certificate(settings, tmp_path)
    assert pair.kind == "local-ca" and pair.trust_anchor == tmp_path / "tls" / "ca.crt"
    for key in (pair.private_key, pair.ca.private_key):
        assert key.stat().st_mode & 0o777 == 0o600
    ca_print, leaf_print = fingerprint(pair.ca.certificate), fingerprint(pair.certificate)
    assert len(ca_print.split(":")) == 32 and ca_print != leaf_print
    short = socket.gethostname().split(".")[0]
    for name in (f"{short}.local", "localhost", "127.0.0.1"):
        _handshake(pair, pair.trust_anchor, name)
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(pair, pair.trust_anchor, "other-box.local")
    assert ensure_certificate(settings, tmp_path) == pair  # a second start keeps both
    assert (fingerprint(pair.ca.certificate), fingerprint(pair.certificate)) == (ca_print, leaf_print)
    # A key that is not the certificate's (a crash between the two writes): issued again, same CA.
    other = leaf_paths(tmp_path / "other")
    ensure_certificate(settings, tmp_path / "other")
    pair.private_key.write_bytes(other.private_key.read_bytes())
    ensure_certificate(settings, tmp_path)
    check_pair(pair)
    assert fingerprint(pair.ca.certificate) == ca_print and fingerprint(pair.certificate) != leaf_print


def test_the_local_ca_cannot_vouch_for_names_beyond_the_box(tmp_path):
    """A client that trusts the box's CA trusts nothing else it could sign: name constraints (the box's name,
    .local, localhost, LAN address ranges), checked by OpenSSL in a real handshake."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    pair = ensure_certificate(FrontSettings(listen="127.0.0.1"), tmp_path)
    ca_key = serialization.load_pem_private_key(pair.ca.private_key.read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate(pair.ca.certificate.read_bytes())

    def forged(name: str, san) -> CertificatePair:
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName([san]), critical=False).sign(ca_key, hashes.SHA256()))
        out = CertificatePair(tmp_path / f"{name}.crt", tmp_path / f"{name}.key", "local-ca")
        out.certificate.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        out.private_key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption()))
        return out

    _handshake(forged("lan", x509.IPAddress(ipaddress.ip_address("127.0.0.1"))), pair.trust_anchor, "127.0.0.1")
    with pytest.raises(ssl.SSLCertVerificationError, match="subtree violation"):
        _handshake(forged("bank", x509.DNSName("bank.example")), pair.trust_anchor, "bank.example")
    with pytest.raises(ssl.SSLCertVerificationError, match="subtree violation"):  # a public address, as an IP a client might reach
        _handshake(forged("public", x509.IPAddress(ipaddress.ip_address("8.8.8.8"))), pair.trust_anchor, "8.8.8.8")
    # The box's own certificate names LAN addresses only (a public one would void the whole chain).
    from host_runtime.front.tls import leaf_addresses

    assert leaf_addresses("0.0.0.0", lambda: {ipaddress.ip_address("192.168.1.9"), ipaddress.ip_address("8.8.8.8")}) \
        == {ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("192.168.1.9")}


def test_a_box_named_like_a_top_level_domain_gets_a_ca_for_its_own_names_alone(tmp_path):
    """#56, item 8: the CA of a box named 'dev' permitted every .dev name, and every box's CA every .local name
    (checked with cryptography's verifier: www.google.dev and nas.local accepted). Now NAME.local, localhost, a
    several-label host name, and the LAN ranges (not link-local), checked by OpenSSL in a real handshake."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from host_runtime.front.tls import ca_dns_names, issue_leaf, make_local_ca

    assert ca_dns_names("dev") == ["dev.local", "localhost"]
    assert ca_dns_names("gpu1.home.arpa") == ["gpu1.home.arpa", "gpu1.local", "localhost"]
    pair = leaf_paths(tmp_path)
    make_local_ca(pair.ca, "dev")
    issue_leaf(pair.ca, pair, {ipaddress.ip_address("127.0.0.1")}, "dev")
    _handshake(pair, pair.trust_anchor, "dev.local")
    ca_key = serialization.load_pem_private_key(pair.ca.private_key.read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate(pair.ca.certificate.read_bytes())

    def forged(san, server_hostname: str) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "x")]))
                .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName([san]), critical=False).sign(ca_key, hashes.SHA256()))
        out = CertificatePair(tmp_path / "f.crt", tmp_path / "f.key", "local-ca")
        out.certificate.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        out.private_key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption()))
        _handshake(out, pair.trust_anchor, server_hostname)

    for name in ("www.google.dev", "dev", "nas.local", "fritz.box"):
        with pytest.raises(ssl.SSLCertVerificationError, match="subtree violation"):
            forged(x509.DNSName(name), name)
    with pytest.raises(ssl.SSLCertVerificationError, match="subtree violation"):
        forged(x509.IPAddress(ipaddress.ip_address("169.254.169.254")), "169.254.169.254")
    forged(x509.DNSName("dev.local"), "dev.local")  # the box's own name still passes
    forged(x509.IPAddress(ipaddress.ip_address("192.168.1.9")), "192.168.1.9")  # and a LAN address (#37)


def test_the_fronts_certificate_is_issued_again_when_the_addresses_change(tmp_path):
    import datetime as dt
    import ipaddress

    first, second = ipaddress.ip_address("10.0.0.5"), ipaddress.ip_address("10.0.0.77")
    loopback = ipaddress.ip_address("127.0.0.1")
    now = dt.datetime(2026, 12, 4, tzinfo=dt.timezone.utc)
    later = now + dt.timedelta(days=300)
    assert reissue_reason({loopback, first}, {loopback, first}, later, now) is None
    assert reissue_reason({loopback, first}, {loopback, second}, later, now) == \
        "the box's addresses changed: now 10.0.0.77; no longer 10.0.0.5"
    assert reissue_reason({loopback}, {loopback}, now + dt.timedelta(days=3), now) == "it ends on 2026-12-07"
    settings = FrontSettings(listen="0.0.0.0")
    pair = ensure_certificate(settings, tmp_path)
    ca_print = fingerprint(pair.ca.certificate)
    assert refresh_leaf(settings, pair, lambda: {first}) is not None
    assert leaf_facts(pair.certificate)[0] == {loopback, first}
    assert refresh_leaf(settings, pair, lambda: {first}) is None  # unchanged: left alone
    assert "now 10.0.0.77" in refresh_leaf(settings, pair, lambda: {second})
    assert leaf_facts(pair.certificate)[0] == {loopback, second}
    assert fingerprint(pair.ca.certificate) == ca_print  # what clients trust never changes
    _handshake(pair, pair.trust_anchor, "10.0.0.77")  # names it; the handshake itself is on loopback
    # The runner's keeper reads the files once: its checks every few seconds compare addresses only.
    from host_runtime.front.tls import LeafKeeper

    keeper = LeafKeeper(settings, pair, lambda: {second})
    assert keeper.refresh() is None
    pair.certificate.write_bytes(b"not read again")
    assert keeper.refresh() is None
    keeper.current = lambda: {first}
    assert "now 10.0.0.5" in keeper.refresh() and leaf_facts(pair.certificate)[0] == {loopback, first}


def test_a_gateways_certificate_names_the_fleets_virtual_address_whether_or_not_it_holds_it(tmp_path):
    """The standby's certificate is right the moment the address moves to it: no reissue when it arrives."""
    import ipaddress

    own, vip = ipaddress.ip_address("10.0.0.2"), ipaddress.ip_address("10.0.0.50")
    settings = FrontSettings(listen="0.0.0.0", virtual_address="10.0.0.50")
    pair = ensure_certificate(settings, tmp_path)
    refresh_leaf(settings, pair, lambda: {own})
    assert vip in leaf_facts(pair.certificate)[0]
    assert refresh_leaf(settings, pair, lambda: {own, vip}) is None   # the address arrived: nothing to do
    _handshake(pair, pair.trust_anchor, "10.0.0.50")
    with pytest.raises(SettingsError, match="listens on every address"):
        FrontSettings(listen="10.0.0.2", virtual_address="10.0.0.50")
    with pytest.raises(SettingsError, match="not an IPv4 address"):
        FrontSettings(virtual_address="10.0.0.50/24")


def test_a_box_made_before_the_local_ca_keeps_its_self_signed_certificate_until_the_owner_adopts_the_ca(tmp_path):
    """Clients of a box updated from a release without the CA trust its self-signed certificate: kept (never
    replaced behind the owner's back) until `everycycle front ca --adopt`."""
    import subprocess

    legacy = self_signed_paths(tmp_path)
    donor = ensure_certificate(FrontSettings(), tmp_path / "donor")  # any pair of the right shape
    legacy.certificate.parent.mkdir(parents=True)
    legacy.certificate.write_bytes(donor.certificate.read_bytes())
    legacy.private_key.write_bytes(donor.private_key.read_bytes())
    assert ensure_certificate(FrontSettings(), tmp_path) == legacy
    assert not (tmp_path / "tls" / "ca.crt").exists()
    shown = subprocess.run(everycycle("front", "ca", "--state-dir", str(tmp_path)), capture_output=True, text=True)
    assert shown.returncode == 0 and "--adopt" in shown.stdout and fingerprint(legacy.certificate) in shown.stdout
    adopted = subprocess.run(everycycle("front", "ca", "--adopt", "--state-dir", str(tmp_path)),
                             capture_output=True, text=True)
    assert adopted.returncode == 0, adopted.stderr
    pair = ensure_certificate(FrontSettings(), tmp_path)
    assert pair.kind == "local-ca" and (tmp_path / "tls" / "self-signed.crt.retired").exists()
    shown = subprocess.run(everycycle("front", "ca", "--state-dir", str(tmp_path)), capture_output=True, text=True)
    assert shown.returncode == 0 and f"SHA-256  {fingerprint(pair.ca.certificate)}" in shown.stdout
    assert "/ca.crt" in shown.stdout and "NODE_EXTRA_CA_CERTS=$PWD/everycycle-ca.crt" in shown.stdout
    again = subprocess.run(everycycle("front", "ca", "--adopt", "--state-dir", str(tmp_path)),
                           capture_output=True, text=True)
    assert again.returncode == 1 and "nothing to adopt" in again.stderr



def test_an_owners_certificate_is_imported_checked_first_and_the_local_ca_can_be_taken_back(tmp_path):
    """#37: an owner's own certificate and key could be given only in the bundle: now imported later too."""
    import datetime as dt
    import os
    import subprocess

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    state, settings_path = tmp_path / "state", tmp_path / "state" / "front.toml"
    state.mkdir()
    front_settings.save(FrontSettings(), settings_path)
    owner = ensure_certificate(FrontSettings(), tmp_path / "owner")   # any valid pair: the owner's, say
    other = ensure_certificate(FrontSettings(), tmp_path / "other")
    env = {**os.environ, "EVERYCYCLE_RUN_DIR": str(tmp_path / "run")}  # no supervisord there

    def front_import(*extra):
        return subprocess.run(everycycle("front", "import", "--settings", str(settings_path), "--state-dir",
                                         str(state), *extra), capture_output=True, text=True, env=env)

    before = settings_path.read_bytes()
    wrong = front_import("--certificate", str(owner.certificate), "--private-key", str(other.private_key))
    assert wrong.returncode == 1 and "does not belong to the certificate" in wrong.stderr
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "old")])
    past = dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc)
    expired = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
               .serial_number(1).not_valid_before(past).not_valid_after(past + dt.timedelta(days=30))
               .sign(key, hashes.SHA256()))
    (tmp_path / "old.crt").write_bytes(expired.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "old.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    old = front_import("--certificate", str(tmp_path / "old.crt"), "--private-key", str(tmp_path / "old.key"))
    assert old.returncode == 1 and "not now" in old.stderr
    assert front_import("--local-ca", "--certificate", "x").returncode == 2  # one or the other
    assert settings_path.read_bytes() == before and not (state / "tls" / "api.key").exists()  # nothing changed
    done = front_import("--certificate", str(owner.certificate), "--private-key", str(owner.private_key))
    assert done.returncode == 0 and "no supervisord" in done.stdout, done.stderr
    pair = ensure_certificate(front_settings.load(settings_path), state)
    assert pair.kind == "bundle" and pair.certificate == state / "tls" / "api.crt"
    assert pair.private_key.read_bytes() == owner.private_key.read_bytes()
    assert pair.private_key.stat().st_mode & 0o777 == 0o600
    back = front_import("--local-ca")
    assert back.returncode == 0 and _pair_kind(settings_path, state) == "local-ca"


def _pair_kind(settings_path, state) -> str:
    from host_runtime.front.tls import certificate_pair

    return certificate_pair(front_settings.load(settings_path), state).kind

# ---- the real front before the real API ------------------------------------------------------------------------


FLEET_GATEWAY = "127.0.0.4"  # as if this box were a fleet's member and the gateway came from there


@pytest.fixture(scope="module")
def front(tmp_path_factory, api_key):
    """serve on a Unix socket (2 workers x 4 threads: 16 idle sockets stop it on its own) and the front."""
    tmp = tmp_path_factory.mktemp("front")
    state, run = tmp / "state", tmp / "run"
    state.mkdir()
    port, http_port = free_port(), free_port()
    settings = FrontSettings(listen="127.0.0.1", https_port=port, http_port=http_port, header_timeout_s=5,
                             requests_per_second_per_client=20, request_burst_per_client=40,
                             connections_per_client=16, fleet_gateway=FLEET_GATEWAY)
    front_settings.save(settings, state / "front.toml")
    sock = run / "serving" / "http.sock"
    serve = Proc(everycycle("serve", "--unix-socket", str(sock), "--front-settings", str(state / "front.toml"),
                            "--keys", api_key[0], "--http-threads", "4", "--threads", "2", "--ctx-size", "1024",
                            "--parallel", "2", "--run-dir", str(run / "serving")), tmp / "serve.log")
    nginx = Proc(everycycle("front", "run", "--settings", str(state / "front.toml"), "--state-dir", str(state),
                            "--run-dir", str(run / "front"), "--upstream-socket", str(sock)), tmp / "front.log")
    cert = state / "tls" / "ca.crt"  # the box's local CA, which clients trust
    base = f"https://127.0.0.1:{port}"
    try:
        wait_for(cert.exists, 30, "the front's certificate", nginx)
        context = ssl.create_default_context(cafile=str(cert))
        wait_for(lambda: _ok(base + "/ready", context), 120, "the API through the front", serve)
        yield {"base": base, "context": context, "port": port, "http_port": http_port, "serve": serve,
               "nginx": nginx, "key": api_key[1], "cert": cert, "state": state}
    finally:
        nginx.stop()
        serve.stop()


def _ok(url, context, key=None) -> bool:
    try:
        return http_get(url, context=context, key=key)[0] == 200
    except OSError:
        return False


def _chat(front) -> float:
    body = json.dumps({"model": MODEL_ID, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                       "temperature": 0}).encode()
    import urllib.request

    req = urllib.request.Request(front["base"] + "/v1/chat/completions", data=body, method="POST", headers={
        "Authorization": f"Bearer {front['key']}", "Content-Type": "application/json"})
    started = time.monotonic()
    with urllib.request.urlopen(req, timeout=30, context=front["context"]) as r:
        assert r.status == 200 and json.loads(r.read())["choices"][0]["message"]["content"] is not None
    return time.monotonic() - started


def _connect_from(source: str, port: int) -> socket.socket:
    s = socket.socket()
    s.bind((source, 0))
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    return s


@pytest.mark.system
def test_idle_and_slow_header_connections_from_one_client_do_not_stop_another(front):
    usual = [_chat(front) for _ in range(5)]
    # Only what the attack adds is judged (the front's first probes, before gunicorn listened, logged refusals).
    serve_log_before, front_log_before = len(front["serve"].log()), len(front["nginx"].log())
    attacker = "127.0.0.2"
    idle = [_connect_from(attacker, front["port"]) for _ in range(300)]
    slow = []
    for _ in range(50):
        tls = ssl.create_default_context(cafile=str(front["cert"])).wrap_socket(
            _connect_from(attacker, front["port"]), server_hostname="localhost")
        tls.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        slow.append(tls)
    try:
        during = []
        for _ in range(5):
            for s in slow:  # keep trickling header bytes, as a slowloris does
                try:
                    s.sendall(b"X-a: b\r\n")
                except OSError:
                    pass
            during.append(_chat(front))
        # Without the front, 16 idle connections stop this 2 x 4-thread gunicorn (measured: /health unanswered
        # for 10 s); with it, the other client's requests take their usual time (a generous bound: a stopped
        # API misses it by tens of seconds).
        assert max(during) < max(usual) + 2.0, (usual, during)
        # nginx closes what never finished its headers once client_header_timeout (5 s here) passes.
        time.sleep(front_settings.load(front["state"] / "front.toml").header_timeout_s + 2)
        closed = 0
        for s in idle:
            s.settimeout(0.5)
            try:
                closed += s.recv(1) == b""
            except (ConnectionResetError, TimeoutError, OSError):
                closed += 1
        assert closed == len(idle)
    finally:
        for s in idle + slow:
            s.close()
    serve_log = front["serve"].log()[serve_log_before:]
    assert "Traceback" not in serve_log and "ERROR" not in serve_log
    # The front's log holds the limits' own lines at most (no errors, no upstream failures).
    for line in front["nginx"].log()[front_log_before:].splitlines():
        assert "[error]" not in line and "[crit]" not in line and "[alert]" not in line, line


@pytest.mark.system
def test_request_rate_past_the_burst_gets_openai_style_429_for_that_client_only(front):
    url = front["base"] + "/health"
    context = front["context"]
    statuses = []
    bodies = []
    conn_source = "127.0.0.3"
    import http.client

    conn = http.client.HTTPSConnection("127.0.0.1", front["port"], context=context, timeout=10,
                                       source_address=(conn_source, 0))
    for _ in range(80):
        conn.request("GET", "/health")
        r = conn.getresponse()
        statuses.append(r.status)
        bodies.append(r.read())
    conn.close()
    assert 429 in statuses and statuses[0] == 200, sorted(set(statuses))
    refused = json.loads(bodies[statuses.index(429)])
    assert refused["error"]["type"] == "rate_limit_error" and refused["error"]["code"] == "rate_limited"
    # Another address is not limited by that client's use.
    assert http_get(url, context=context)[0] == 200
    # The fleet's gateway carries every client of the fleet through one address: not held to per-client limits.
    conn = http.client.HTTPSConnection("127.0.0.1", front["port"], context=context, timeout=10,
                                       source_address=(FLEET_GATEWAY, 0))
    gateway_statuses = []
    for _ in range(80):
        conn.request("GET", "/health")
        r = conn.getresponse()
        r.read()
        gateway_statuses.append(r.status)
    conn.close()
    assert gateway_statuses == [200] * 80
    assert "limiting requests" in front["nginx"].log()


@pytest.mark.system
def test_https_only_on_the_lan_and_metrics_need_a_key(front):
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", front["http_port"], timeout=5)
    conn.request("POST", "/v1/chat/completions", body=b"{}", headers={"Authorization": "Bearer secret"})
    r = conn.getresponse()
    assert r.status == 308 and r.getheader("Location").startswith(f"https://127.0.0.1:{front['port']}/")
    conn.close()
    assert http_get(f"http://127.0.0.1:{front['http_port']}/health")[0] == 200
    assert http_get(front["base"] + "/metrics", context=front["context"])[0] == 401
    assert http_get(front["base"] + "/metrics", context=front["context"], key=front["key"])[0] == 200
    # `everycycle front fingerprint` shows the certificate nginx serves; the console shows the CA that issued it.
    with socket.create_connection(("127.0.0.1", front["port"])) as raw:
        with front["context"].wrap_socket(raw, server_hostname="localhost") as tls:
            der = tls.getpeercert(binary_form=True)
    import hashlib

    served = hashlib.sha256(der).hexdigest().upper()
    assert fingerprint(front["state"] / "tls" / "box.crt").replace(":", "") == served
    from cryptography import x509

    issuer = x509.load_pem_x509_certificate(front["cert"].read_bytes()).subject
    assert x509.load_der_x509_certificate(der).issuer == issuer
    import subprocess

    shown = subprocess.run(everycycle("front", "fingerprint", "--state-dir", str(front["state"])),
                           capture_output=True, text=True, check=True).stdout
    assert fingerprint(front["state"] / "tls" / "box.crt") in shown
    ca = subprocess.run(everycycle("front", "ca", "--state-dir", str(front["state"])),
                        capture_output=True, text=True, check=True).stdout
    assert f"SHA-256  {fingerprint(front['cert'])}" in ca
    # The CA, for clients to trust, and the served certificate: over HTTPS and in clear (the fingerprint is what
    # proves them).
    for url, context in ((front["base"], front["context"]), (f"http://127.0.0.1:{front['http_port']}", None)):
        for path, file in (("/ca.crt", front["cert"]), ("/everycycle.crt", front["state"] / "tls" / "box.crt")):
            status, body = http_get(url + path, context=context)
            assert status == 200 and body == file.read_bytes()


@pytest.mark.system
def test_oversized_bodies_are_refused_by_the_front_as_openai_errors(front):
    import urllib.error
    import urllib.request

    req = urllib.request.Request(front["base"] + "/v1/completions", data=b"x" * (2 << 20), method="POST",
                                 headers={"Authorization": f"Bearer {front['key']}"})
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=30, context=front["context"])
    assert exc.value.code == 413
    assert json.loads(exc.value.read())["error"]["code"] == "request_too_large"
    front_words = json.loads(_refusal(front, "/v1/completions", b"x" * (2 << 20)))["error"]["message"]
    # A route whose body may carry images (#58) takes up to 32 MiB at the front; the API keeps what is not an
    # image's base64 to 1 MiB: 2 MiB of text reaches the API, which refuses it in its own words
    text = json.dumps({"model": MODEL_ID, "max_tokens": 4,
                       "messages": [{"role": "user", "content": "x" * (2 << 20)}]}).encode()
    for route in ("/v1/chat/completions", "/v1/messages", "/api/chat"):  # each in its API's error shape
        error = json.loads(_refusal(front, route, text))["error"]
        words = error if isinstance(error, str) else error["message"]
        assert "besides its images" in words and words != front_words, route


def _refusal(front, route: str, body: bytes) -> bytes:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(front["base"] + route, data=body, method="POST", headers={
        "Authorization": f"Bearer {front['key']}", "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=30, context=front["context"])
    assert exc.value.code == 413, route
    return exc.value.read()


# ---- the front's certificate follows the box's address (a namespace the test makes) -----------------------------


@pytest.mark.root
@pytest.mark.system
def test_a_client_that_trusts_the_box_ca_still_connects_after_the_box_address_changes(tmp_path):
    """A new DHCP lease broke clients that connect by IP (#37): the box moves to another address, and a client
    that trusts only its local CA (fetched in clear, checked against the fingerprint) connects there within the
    front's check interval plus a reload, the CA unchanged."""
    import hashlib

    from host_runtime.front.run import ADDRESS_CHECK_S
    from tests.fleet_hosts import Net, _ip

    net = Net(1)
    state, run = tmp_path / "state", tmp_path / "run"
    state.mkdir()
    front_settings.save(FrontSettings(listen="0.0.0.0", https_port=8443, http_port=8080), state / "front.toml")
    front = Proc(net.run_in(0, everycycle("front", "run", "--settings", str(state / "front.toml"),
                                          "--state-dir", str(state), "--run-dir", str(run),
                                          "--upstream-socket", str(tmp_path / "no-api.sock"))), tmp_path / "front.log")
    leaf = state / "tls" / "box.crt"

    def trusted_at(address: str, context) -> bool:
        try:  # the certificate itself, served by nginx (no API behind this front)
            return http_get(f"https://{address}:8443/everycycle.crt", context=context)[0] == 200
        except OSError:
            return False

    try:
        first = net.address(0)
        ca_pem = wait_for(lambda: _fetch_ca(first), 30, "the CA over plain HTTP", front)
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization

        der = x509.load_pem_x509_certificate(ca_pem).public_bytes(serialization.Encoding.DER)
        shown = hashlib.sha256(der).hexdigest().upper()
        assert ":".join(shown[i:i + 2] for i in range(0, 64, 2)) == fingerprint(state / "tls" / "ca.crt")
        (tmp_path / "everycycle-ca.crt").write_bytes(ca_pem)
        context = ssl.create_default_context(cafile=str(tmp_path / "everycycle-ca.crt"))
        assert wait_for(lambda: trusted_at(first, context), 30, "HTTPS at the first address", front)
        before = fingerprint(leaf)
        moved = f"{net.prefix}.77"
        _ip("addr", "del", f"{first}/24", "dev", "eth0", ns=net.names[0])
        _ip("addr", "add", f"{moved}/24", "dev", "eth0", ns=net.names[0])
        started = time.monotonic()
        wait_for(lambda: trusted_at(moved, context), ADDRESS_CHECK_S + 10, "HTTPS at the new address", front)
        took = time.monotonic() - started
        assert took < ADDRESS_CHECK_S + 10
        assert fingerprint(leaf) != before and fingerprint(state / "tls" / "ca.crt") == \
            ":".join(shown[i:i + 2] for i in range(0, 64, 2))
        assert "certificate issued again (the box's addresses changed: now " + moved in front.log()
        print(f"trusted at the new address {took:.1f} s after the move (check interval {ADDRESS_CHECK_S} s)")
        # A stop reaches nginx through the front (its parent now): QUIT, nginx's graceful stop, and both exit.
        import os
        import signal

        nginx_pid = int((run / "nginx.pid").read_text())
        front.popen.send_signal(signal.SIGQUIT)
        assert front.popen.wait(20) == 0
        wait_for(lambda: not os.path.exists(f"/proc/{nginx_pid}"), 10, "nginx to exit")
    finally:
        front.stop()
        net.remove()


def _fetch_ca(address: str) -> bytes | None:
    try:
        status, body = http_get(f"http://{address}:8080/ca.crt")
    except OSError:
        return None
    return body if status == 200 else None
