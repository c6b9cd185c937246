"""How a client comes to trust this box (UI-free: `everycycle front ca`, the console's connect screen): where to
fetch the certificate to trust (the local CA's, or the self-signed one a box made before it had a CA), the
fingerprint to check it against, and the one line each kind of client needs."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from host_runtime.front.nginx_conf import CA_CERTIFICATE_PATH, CERTIFICATE_PATH
from host_runtime.front.settings import FrontSettings, short_hostname
from host_runtime.front.tls import CertificatePair


@dataclass(frozen=True)
class TrustAnchor:
    kind: str  # the pair's: "local-ca", "self-signed" or "bundle"
    url: str   # where a client fetches it (public: every handshake sends the chain anyway)


def trust_anchor(settings: FrontSettings, pair: CertificatePair, hostname: str | None = None) -> TrustAnchor:
    """Plain HTTP where the front answers in clear (before a client trusts anything, TLS proves nothing; the
    fingerprint does), else HTTPS fetched without checking; by NAME.local where the box announces it."""
    short = short_hostname(hostname)
    if not ipaddress.ip_address(settings.listen).is_unspecified:  # the one address it answers on
        name = settings.listen if ":" not in settings.listen else f"[{settings.listen}]"
    else:  # NAME.local where announced, else the name the LAN's DHCP server usually registers
        name = f"{short}.local" if settings.lan_name else short
    path = CA_CERTIFICATE_PATH if pair.ca else CERTIFICATE_PATH
    if settings.http != "off":
        return TrustAnchor(pair.kind, f"http://{name}:{settings.http_port}{path}")
    return TrustAnchor(pair.kind, f"https://{name}:{settings.https_port}{path}")


def trust_lines(anchor: TrustAnchor, fingerprint: str | None) -> list[str]:
    if anchor.kind == "bundle":
        return [f"This box serves its owner's certificate (SHA-256 {fingerprint}): clients trust it as its "
                "issuer is trusted."]
    local_ca = anchor.kind == "local-ca"
    file = "everycycle-ca.crt" if local_ca else "everycycle.crt"
    what = ("this box's local CA (it vouches for NAME.local, localhost and addresses in the private ranges a LAN "
            "uses, and stays the same when the box's address changes: connect by NAME.local or by address)"
            if local_ca else "this box's self-signed certificate")
    return [
        f"Trust {what} once, on each client machine:",
        f"  curl -fsSk -o {file} {anchor.url}",
        f"  openssl x509 -noout -fingerprint -sha256 -in {file}",
        f"  must print SHA256 Fingerprint={fingerprint}",
        f"  Node tools (opencode, Claude Code, Continue):  export NODE_EXTRA_CA_CERTS=$PWD/{file}",
        f"  Python tools (openai, anthropic, LangChain, aider):  export SSL_CERT_FILE=$PWD/{file}  (this box's only)",
        f"  curl:  curl --cacert {file} ...",
        f"  Open WebUI in Docker:  -v $PWD/{file}:/box.crt:ro -e SSL_CERT_FILE=/box.crt "
        "-e REQUESTS_CA_BUNDLE=/box.crt",
        f"  the whole machine (Debian, Ubuntu):  sudo cp {file} /usr/local/share/ca-certificates/ && "
        "sudo update-ca-certificates",
    ]
