"""The owner's own certificate for the front, imported after set-up (`everycycle front import`), or the box's
local CA taken back (`--local-ca`): checked before anything changes, written atomically (the key 0600, the
front's own), front.toml pointed at it, and the front restarted through supervisord where one runs."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from pathlib import Path

from host_runtime.common.atomic_file import atomic_write
from host_runtime.common.run_layout import supervisor_socket
from host_runtime.common.service_user import FRONT_USER, service_owner
from host_runtime.common.supervisor_rpc import restart_service
from host_runtime.front import settings as front_settings
from host_runtime.front.tls import CertificatePair, TLSError, check_pair


def import_pair(settings_path: Path, state_dir: Path, certificate: Path, private_key: Path) -> str:
    """The pair checked (each readable, the key the certificate's, the certificate current), copied into
    STATE/tls/api.crt and api.key and named by front.toml. TLSError names what is wrong; nothing is changed then."""
    from cryptography import x509

    check_pair(CertificatePair(certificate, private_key, "bundle"))
    cert = x509.load_pem_x509_certificate(certificate.read_bytes())
    now = dt.datetime.now(dt.timezone.utc)
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise TLSError(f"the certificate {certificate} is valid from {cert.not_valid_before_utc:%Y-%m-%d} to "
                       f"{cert.not_valid_after_utc:%Y-%m-%d}, not now")
    settings = front_settings.load(settings_path)
    cert_to, key_to = state_dir / "tls" / "api.crt", state_dir / "tls" / "api.key"
    key_to.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    atomic_write(key_to, private_key.read_bytes(), 0o600, owner=service_owner(FRONT_USER))
    atomic_write(cert_to, certificate.read_bytes(), 0o644)
    front_settings.save(replace(settings, certificate=str(cert_to), private_key=str(key_to)), settings_path)
    return f"the front serves {cert_to} from its next start"


def use_local_ca(settings_path: Path) -> str:
    settings = front_settings.load(settings_path)
    if not settings.certificate:
        return "the front already serves its local CA's certificate"
    front_settings.save(replace(settings, certificate="", private_key=""), settings_path)
    return "the front serves its local CA's certificate from its next start"


def restart_front(run_dir: Path) -> str:
    socket = supervisor_socket(run_dir)
    if not socket.exists():
        return f"no supervisord at {socket}: restart the front yourself"

    try:
        return restart_service(socket, "front")
    except Exception as exc:  # supervisord's faults and the socket's errors, said as they are
        return f"restarting it failed: {exc} (supervisorctl restart front)"
