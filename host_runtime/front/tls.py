"""The front's certificate: the owner's (from the bundle), or one issued by this box's own small CA.

The local CA is made once and trusted once by the owner's clients; the certificate it issues for the front names
the box's name, NAME.local, localhost and its LAN addresses, and is issued again when those addresses change (a
new DHCP lease) or it nears its end, so a client that trusts the CA keeps connecting. The CA's name constraints
limit it to those names and to private address ranges: a client that trusts it trusts nothing else it could sign.

A box made before the local CA keeps serving the self-signed certificate its clients already trust, until the
owner adopts the CA (`everycycle front ca --adopt`).

The fingerprint (SHA-256 of the certificate's DER) is what the owner compares when a client first fetches the CA
(or a self-signed certificate); the console and `everycycle front ca` show it."""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import socket
from dataclasses import dataclass
from pathlib import Path

from host_runtime.common.errors import InputError
from host_runtime.common.atomic_file import atomic_write
from host_runtime.common.lan import LAN_NETWORKS, lan_address
from host_runtime.discovery.network import collect_network
from host_runtime.front.settings import FrontSettings, short_hostname

CA_DAYS = 3650         # trusted once by every client: replacing it would mean trusting a new one everywhere
LEAF_DAYS = 397        # issued again by the box itself, so it can be short (and stays within what Apple accepts)
RENEW_BEFORE_DAYS = 30
# The CA vouches only for the box's own names (ca_dns_names) and for the LAN's address ranges (common/lan.py).
# Addresses by range, not one by one: a client that connects by address must keep trusting the box after a new
# DHCP lease (#37), and a client keeps the CA it was given (OpenSSL applies that copy's constraints), so a CA
# re-made for each new address would have to be trusted again on every client.

KINDS = ("bundle", "self-signed", "local-ca")


class TLSError(InputError):
    """The certificate or key cannot be used."""


@dataclass(frozen=True)
class LocalCA:
    certificate: Path
    private_key: Path


@dataclass(frozen=True)
class CertificatePair:
    certificate: Path
    private_key: Path
    kind: str  # one of KINDS
    ca: LocalCA | None = None  # the local CA that issued it (kind "local-ca")

    @property
    def trust_anchor(self) -> Path:
        """The certificate a client trusts: the local CA's where it issued this one, else this one."""
        return self.ca.certificate if self.ca else self.certificate


def local_ca_paths(state_dir: Path) -> LocalCA:
    return LocalCA(state_dir / "tls" / "ca.crt", state_dir / "tls" / "ca.key")


def self_signed_paths(state_dir: Path) -> CertificatePair:
    return CertificatePair(state_dir / "tls" / "self-signed.crt", state_dir / "tls" / "self-signed.key", "self-signed")


def leaf_paths(state_dir: Path) -> CertificatePair:
    return CertificatePair(state_dir / "tls" / "box.crt", state_dir / "tls" / "box.key", "local-ca",
                           local_ca_paths(state_dir))


def certificate_pair(settings: FrontSettings, state_dir: Path) -> CertificatePair:
    if settings.certificate:
        return CertificatePair(Path(settings.certificate), Path(settings.private_key), "bundle")
    legacy = self_signed_paths(state_dir)
    if legacy.certificate.exists() and legacy.private_key.exists():
        return legacy
    return leaf_paths(state_dir)


def _write_pair(key, cert, private_key: Path, certificate: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    private_key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    atomic_write(private_key, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption()), 0o600)
    atomic_write(certificate, cert.public_bytes(serialization.Encoding.PEM), 0o644)


def make_local_ca(ca: LocalCA, hostname: str | None = None) -> None:
    """An EC P-256 CA for this box alone: name-constrained to its host name, .local, localhost and LAN address
    ranges. Key 0600, written atomically."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    hostname = hostname or socket.gethostname()
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"EveryCycle box {short_hostname(hostname)} local CA"),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "EveryCycle box")])
    now = dt.datetime.now(dt.timezone.utc)
    dns = ca_dns_names(hostname)
    constraints = x509.NameConstraints(
        permitted_subtrees=[*(x509.DNSName(d) for d in dns), *(x509.IPAddress(n) for n in LAN_NETWORKS)],
        excluded_subtrees=None)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(constraints, critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    _write_pair(key, cert, ca.private_key, ca.certificate)


def ca_dns_names(hostname: str) -> list[str]:
    """The names the box's CA may vouch for (a DNS constraint covers the name and every name under it):
    NAME.local, localhost, and the host name itself where it has several labels (box.home.arpa). Never a
    one-label name, nor all of .local: a box named 'dev' or 'box' made its CA valid for every .dev site or
    fritz.box, and '.local' for every printer and NAS on the LAN (#56, item 8). Clients reach the box as
    NAME.local or by address."""
    names = {f"{short_hostname(hostname)}.local", "localhost"}
    if "." in hostname.strip(".") and not hostname.endswith(".local"):
        names.add(hostname.strip(".").lower())
    return sorted(names)


def leaf_addresses(listen: str, current=None, also: tuple[str, ...] = ()) -> set:
    """The addresses the front's certificate names: loopback and the one it listens on, or, listening on every
    address, those the box has now (a fleet's gateway checks a member's certificate against the address it
    reaches it at), and `also` (a fleet's virtual address, named whether or not the box holds it now, so that the
    standby's certificate is right the moment the address moves); only those a local CA may vouch for."""
    ips = {ipaddress.ip_address("127.0.0.1"), *(ipaddress.ip_address(a) for a in also)}
    if not ipaddress.ip_address(listen).is_unspecified:
        ips.add(ipaddress.ip_address(listen))
    else:
        ips |= (current or addresses_now)()
    return {ip for ip in ips if lan_address(ip)}


def issue_leaf(ca: LocalCA, pair: CertificatePair, addresses: set, hostname: str | None = None) -> None:
    """The front's certificate, signed by the local CA, for the box's names and `addresses`. Key 0600; the key
    is written before the certificate, so a reader that finds them mismatched (a crash between) issues again."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    hostname = hostname or socket.gethostname()
    try:
        ca_cert = x509.load_pem_x509_certificate(ca.certificate.read_bytes())
        ca_key = serialization.load_pem_private_key(ca.private_key.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise TLSError(f"the local CA ({ca.certificate}) cannot be read: {exc}") from None
    permitted = _permitted_dns(ca_cert)
    local = f"{short_hostname(hostname)}.local"
    dns = [d for d in dict.fromkeys((local, hostname, "localhost")) if _dns_permitted(d, permitted)]
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    alt = x509.SubjectAlternativeName([*(x509.DNSName(d) for d in dns),
                                       *(x509.IPAddress(ip) for ip in sorted(addresses, key=str))])
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, local)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=LEAF_DAYS)).add_extension(alt, critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    _write_pair(key, cert, pair.private_key, pair.certificate)


def _permitted_dns(ca_cert) -> list[str]:
    from cryptography import x509

    try:
        constraints = ca_cert.extensions.get_extension_for_class(x509.NameConstraints).value
    except x509.ExtensionNotFound:
        return []
    return [s.value for s in constraints.permitted_subtrees or [] if isinstance(s, x509.DNSName)]


def _dns_permitted(name: str, permitted: list[str]) -> bool:
    return any(name == p or name.endswith("." + p) for p in permitted)


def leaf_facts(certificate: Path) -> tuple[set, dt.datetime]:
    """The addresses a certificate names and when it ends."""
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(certificate.read_bytes())
    alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return set(alt.get_values_for_type(x509.IPAddress)), cert.not_valid_after_utc


def reissue_reason(named: set, wanted: set, not_after: dt.datetime, now: dt.datetime) -> str | None:
    """Why the front's certificate must be issued again, or None: the box's addresses changed, or it ends soon."""
    if named != wanted:
        gone, new = sorted(map(str, named - wanted)), sorted(map(str, wanted - named))
        return "the box's addresses changed" + (f": now {', '.join(new)}" if new else "") + (
            f"; no longer {', '.join(gone)}" if gone else "")
    if not_after - now < dt.timedelta(days=RENEW_BEFORE_DAYS):
        return f"it ends on {not_after:%Y-%m-%d}"
    return None


def addresses_now() -> set:
    """The box's addresses as discovery reads them (pyroute2); none when netlink cannot be read."""
    links = collect_network()
    if isinstance(links, dict):  # unavailable: the certificate names the box's name and loopback only
        return set()
    return {ipaddress.ip_address(a["address"]) for link in links for a in link["addresses"] if a["scope"] != "link"}


def ensure_certificate(settings: FrontSettings, state_dir: Path) -> CertificatePair:
    """The pair nginx serves, checked to load and to match. With no certificate of the owner's, the local CA is
    made when there is none, and its certificate for the front issued as LeafKeeper says."""
    pair = certificate_pair(settings, state_dir)
    if pair.ca:
        if not (pair.ca.certificate.exists() and pair.ca.private_key.exists()):
            make_local_ca(pair.ca)
        check_pair(CertificatePair(pair.ca.certificate, pair.ca.private_key, "local-ca"))
        LeafKeeper(settings, pair).refresh()
    else:
        check_pair(pair)
    return pair


class LeafKeeper:
    """The local CA's certificate for the front, kept current: its files read and checked once, then only the
    box's addresses at each check (the front's runner asks every few seconds), the files again after an issue."""

    def __init__(self, settings: FrontSettings, pair: CertificatePair, current=None):
        self.settings, self.pair, self.current = settings, pair, current
        self._facts: tuple[set, dt.datetime] | None = None  # what the certificate on disk names, and its end

    def refresh(self) -> str | None:
        """Issue the certificate again where there is none, it does not match its key, it names other addresses
        than the box has, or it ends soon; returns why it did (None: the certificate stands)."""
        wanted = leaf_addresses(self.settings.listen, self.current,
                                (self.settings.virtual_address,) if self.settings.virtual_address else ())
        if self._facts is None:
            try:
                check_pair(self.pair)
                self._facts = leaf_facts(self.pair.certificate)
            except (TLSError, ValueError) as exc:
                reason = f"the one there cannot be used ({exc})"
        if self._facts is not None:
            named, not_after = self._facts
            reason = reissue_reason(named, wanted, not_after, dt.datetime.now(dt.timezone.utc))
        if reason:
            self._facts = None
            issue_leaf(self.pair.ca, self.pair, wanted)
            self._facts = leaf_facts(self.pair.certificate)
        return reason


def refresh_leaf(settings: FrontSettings, pair: CertificatePair, current=None) -> str | None:
    """One check of LeafKeeper's, files read afresh."""
    return LeafKeeper(settings, pair, current).refresh()


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
