"""The gateway's capability polls, which carry the fleet key (hardening, third pass, item 3): a redirect is not
followed, and with peer certificates named only they are trusted."""

from __future__ import annotations

import http.server
import ssl
import threading

from host_runtime.fleet.peers import poll, tls_context


def test_a_poll_does_not_follow_a_redirect_with_the_fleet_key():
    seen: list[tuple[str, str | None]] = []

    class Redirecting(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            if self.path.startswith("/elsewhere"):
                self.send_response(200)
                self.end_headers()
                return
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{self.server.server_port}/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        report = poll(f"http://127.0.0.1:{server.server_port}", "ec-the-fleet-key", 5)
    finally:
        server.shutdown()
    assert report.caps is None and report.error.startswith("HTTP 302") and "not followed" in report.error
    assert [path for path, _ in seen] == ["/v1/everycycle/capabilities"]  # nothing reached /elsewhere


def test_named_peer_certificates_are_the_only_ones_trusted(tmp_path):
    from host_runtime.front.settings import FrontSettings
    from host_runtime.front.tls import ensure_certificate

    pair = ensure_certificate(FrontSettings(listen="127.0.0.1"), tmp_path)
    pinned = tls_context((str(pair.trust_anchor),))
    assert pinned.verify_mode == ssl.CERT_REQUIRED and pinned.check_hostname
    assert pinned.cert_store_stats()["x509"] == 1   # the peer's CA, and not the system's CAs
