"""The front's certificate: the bundle's, or a self-signed one made once on this box.

The fingerprint (SHA-256 of the certificate's DER) is what the owner compares when a client first meets a
self-signed certificate; the console and `everycycle status` show it."""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import socket
from dataclasses import dataclass
from pathlib import Path

from host_runtime.common.atomic_file import atomic_write
from host_runtime.front.settings import FrontSettings

SELF_SIGNED_DAYS = 3650  # a LAN appliance's own certificate: renewing it would break every pinned client


class TLSError(Exception):
    """The certificate or key cannot be used."""


@dataclass(frozen=True)
class CertificatePair:
    certificate: Path
    private_key: Path
    self_signed: bool


def self_signed_paths(state_dir: Path) -> CertificatePair:
    return CertificatePair(state_dir / "tls" / "self-signed.crt", state_dir / "tls" / "self-signed.key", True)


def certificate_pair(settings: FrontSettings, state_dir: Path) -> CertificatePair:
    if settings.certificate:
        return CertificatePair(Path(settings.certificate), Path(settings.private_key), False)
    return self_signed_paths(state_dir)


def make_self_signed(pair: CertificatePair, hostname: str | None = None, address: str | None = None) -> None:
    """An EC P-256 key and a certificate for the box's name, 'localhost' and the address the front listens on;
    when that is every address, the addresses the box has now (a fleet's gateway checks a member's certificate
    against the address it reaches it at). Key 0600, written atomically."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    hostname = hostname or socket.gethostname()
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "EveryCycle box")])
    now = dt.datetime.now(dt.timezone.utc)
    ips = {ipaddress.ip_address("127.0.0.1")}
    if address and not ipaddress.ip_address(address).is_unspecified:
        ips.add(ipaddress.ip_address(address))
    elif address:
        ips |= addresses_now()
    # NAME.local too: the name the box announces on the LAN (front/lan_name.py), which outlives a DHCP lease.
    local = f"{hostname.split('.')[0]}.local"
    alt = x509.SubjectAlternativeName([x509.DNSName(hostname), x509.DNSName(local), x509.DNSName("localhost"),
                                       *(x509.IPAddress(ip) for ip in sorted(ips, key=str))])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=SELF_SIGNED_DAYS)).add_extension(alt, critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    pair.private_key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    atomic_write(pair.private_key, key.private_bytes(serialization.Encoding.PEM,
                                                     serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption()), 0o600)
    atomic_write(pair.certificate, cert.public_bytes(serialization.Encoding.PEM), 0o644)


def addresses_now() -> set:
    """The box's addresses as discovery reads them (pyroute2); none when netlink cannot be read."""
    from host_runtime.discovery.network import collect_network

    links = collect_network()
    if isinstance(links, dict):  # unavailable: the certificate names the box's name and loopback only
        return set()
    return {ipaddress.ip_address(a["address"]) for link in links for a in link["addresses"] if a["scope"] != "link"}


def ensure_certificate(settings: FrontSettings, state_dir: Path) -> CertificatePair:
    """The pair nginx serves: checked to load and to match; a self-signed one is made when there is none."""
    pair = certificate_pair(settings, state_dir)
    if pair.self_signed and not (pair.certificate.exists() and pair.private_key.exists()):
        make_self_signed(pair, address=settings.listen)
    check_pair(pair)
    return pair


def check_pair(pair: CertificatePair) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        cert = x509.load_pem_x509_certificate(pair.certificate.read_bytes())
    except (OSError, ValueError) as exc:
        raise TLSError(f"the certificate {pair.certificate} cannot be read: {exc}") from None
    try:
        key = serialization.load_pem_private_key(pair.private_key.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise TLSError(f"the private key {pair.private_key} cannot be read: {exc}") from None
    pub = serialization.PublicFormat.SubjectPublicKeyInfo
    if (cert.public_key().public_bytes(serialization.Encoding.DER, pub)
            != key.public_key().public_bytes(serialization.Encoding.DER, pub)):
        raise TLSError(f"the private key {pair.private_key} does not belong to the certificate {pair.certificate}")


def fingerprint(certificate: Path) -> str:
    """SHA-256 of the certificate (DER), as browsers and `openssl x509 -fingerprint -sha256` show it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    der = x509.load_pem_x509_certificate(certificate.read_bytes()).public_bytes(serialization.Encoding.DER)
    digest = hashlib.sha256(der).hexdigest().upper()
    return ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))
