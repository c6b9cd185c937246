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
from host_runtime.front.tls import CertificatePair, check_pair, fingerprint, make_self_signed, self_signed_paths
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
    pair = CertificatePair(Path("/c.crt"), Path("/c.key"), True)
    return render(FrontSettings(**kw), FrontPaths(Path("/run/f"), Path("/run/s.sock")), pair)


def test_rendered_config_redirects_http_and_limits_clients():
    conf = _conf()
    assert "listen 0.0.0.0:8443 ssl;" in conf and "ssl_certificate /c.crt;" in conf
    assert "return 308 https://$host:8443$request_uri;" in conf
    assert "location = /health { proxy_pass http://serving; }" in conf
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
    assert 'proxy_set_header Authorization "";' in fleet and 'proxy_set_header X-Api-Key "";' in fleet
    assert "proxy_pass http://serving/v1/everycycle/auth;" in conf
    assert "location @unauthorized" in conf and '"code": "invalid_api_key"' in conf
    # The router's plain-text 404 and 5xx go to the box's API, which says which it was; nginx's own limits keep
    # their pages there (a location with its own error_page inherits none of the server's).
    assert "proxy_intercept_errors on;" in fleet and "error_page 404 502 503 504 = @fleet_unroutable;" in fleet
    assert "error_page 429 @too_many;" in fleet and "error_page 413 @too_large;" in fleet
    assert "rewrite ^ /v1/everycycle/fleet/unroutable break; proxy_pass http://serving;" in conf
    assert "fleet_router" not in _conf()  # a box that is not the gateway serves its own API only
    # The link probe is never spooled to a temp file under /run (RAM) for a client that stops reading.
    assert "location = /v1/everycycle/probe { proxy_max_temp_file_size 0;" in conf
    assert "location = /v1/everycycle/probe { proxy_max_temp_file_size 0;" in _conf()


def test_self_signed_certificate_is_made_once_with_a_private_key(tmp_path):
    pair = self_signed_paths(tmp_path)
    make_self_signed(pair, "box1")
    check_pair(pair)
    assert pair.private_key.stat().st_mode & 0o777 == 0o600
    assert len(fingerprint(pair.certificate).split(":")) == 32
    other = self_signed_paths(tmp_path / "other")
    make_self_signed(other, "box2")
    with pytest.raises(Exception, match="does not belong"):
        check_pair(CertificatePair(pair.certificate, other.private_key, False))


def test_a_self_signed_certificate_names_the_addresses_a_fleet_gateway_reaches_the_box_at(tmp_path):
    import ipaddress
    import socket

    import psutil
    from cryptography import x509

    def names(listen: str) -> set:
        pair = self_signed_paths(tmp_path / listen)
        make_self_signed(pair, "box1", listen)
        cert = x509.load_pem_x509_certificate(pair.certificate.read_bytes())
        return set(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
                   .get_values_for_type(x509.IPAddress))

    assert names("192.0.2.7") == {ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("192.0.2.7")}
    every = {ipaddress.ip_address(a.address) for addrs in psutil.net_if_addrs().values() for a in addrs
             if a.family == socket.AF_INET}
    assert every and every <= names("0.0.0.0")


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
    cert = state / "tls" / "self-signed.crt"
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
    assert 429 in statuses and statuses[0] == 200
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
    # The fingerprint the console and `everycycle status` show is the certificate nginx serves.
    with socket.create_connection(("127.0.0.1", front["port"])) as raw:
        with front["context"].wrap_socket(raw, server_hostname="localhost") as tls:
            der = tls.getpeercert(binary_form=True)
    import hashlib

    served = hashlib.sha256(der).hexdigest().upper()
    assert fingerprint(front["cert"]).replace(":", "") == served
    import subprocess

    shown = subprocess.run(everycycle("front", "fingerprint", "--state-dir", str(front["state"])),
                           capture_output=True, text=True, check=True).stdout
    assert fingerprint(front["cert"]) in shown
    # The certificate itself, for clients to trust: over HTTPS and in clear (the fingerprint is what proves it).
    for url, context in ((front["base"], front["context"]), (f"http://127.0.0.1:{front['http_port']}", None)):
        status, body = http_get(url + "/everycycle.crt", context=context)
        assert status == 200 and body == front["cert"].read_bytes()


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
