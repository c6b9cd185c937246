"""Starting the front (I/O): the certificate, nginx's config from the settings, a config test, then nginx itself
in the foreground, watched: where the local CA issued the certificate, it is issued again when the box's
addresses change (a new DHCP lease) or it nears its end, and nginx reloads it (SIGHUP) without dropping a
connection. Stop signals reach nginx as sent (QUIT: its graceful stop); the front exits with it."""

from __future__ import annotations

import os
import pwd
import ipaddress
import logging
import shutil
import signal
import subprocess
from pathlib import Path

from host_runtime.common.errors import EveryCycleError
from host_runtime.common.atomic_file import atomic_write
from host_runtime.front.nginx_conf import FrontPaths, render
from host_runtime.front.settings import FrontSettings
from host_runtime.common.lan import lan_address
from host_runtime.front.tls import CertificatePair, LeafKeeper, TLSError, ensure_certificate

log = logging.getLogger("everycycle.front")

ADDRESS_CHECK_S = 5.0  # a netlink dump: cheap, and a client that moved with the box waits at most this long


class FrontError(EveryCycleError):
    """The front cannot start; says why."""


def nginx_binary() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if found is None:
        raise FrontError("nginx is not installed (Debian package 'nginx'; `make install` installs it)")
    return found


def prepare(settings: FrontSettings, state_dir: Path, run_dir: Path,
            upstream_socket: Path, gateway_port: int | None = None) -> tuple[Path, CertificatePair]:
    """Write the config (and make the certificate if needed); check it with `nginx -t`. Returns its path and the
    certificate pair it serves."""
    pair = ensure_certificate(settings, state_dir)
    if pair.ca and not ipaddress.ip_address(settings.listen).is_unspecified and not lan_address(settings.listen):
        log.warning("front: the local CA vouches for LAN addresses only, not %s: clients there will not trust "
                    "this certificate; give the box a certificate of your own (everycycle front import)",
                    settings.listen)
    run_dir.mkdir(parents=True, exist_ok=True)
    conf = run_dir / "nginx.conf"
    worker_user = pwd.getpwuid(os.geteuid()).pw_name if os.geteuid() == 0 else None
    atomic_write(conf, render(settings, FrontPaths(run_dir, upstream_socket, worker_user, gateway_port), pair).encode(), 0o644)
    test = subprocess.run([nginx_binary(), "-t", "-q", "-e", "stderr", "-p", str(run_dir), "-c", str(conf)],
                          capture_output=True, text=True)
    if test.returncode != 0:
        raise FrontError(f"nginx refused the generated config {conf}: {test.stderr.strip()}")
    return conf, pair


def run_nginx(conf: Path, run_dir: Path, settings: FrontSettings, pair: CertificatePair,
              check_s: float = ADDRESS_CHECK_S) -> int:
    """nginx in the foreground until it exits (its exit status is returned); its certificate kept current."""
    binary = nginx_binary()
    nginx = subprocess.Popen([binary, "-e", "stderr", "-p", str(run_dir), "-c", str(conf)])

    def forward(signum, _frame):
        if nginx.poll() is None:
            nginx.send_signal(signum)

    for signum in (signal.SIGQUIT, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    keeper = LeafKeeper(settings, pair) if pair.ca else None
    while True:
        try:
            return nginx.wait(timeout=check_s)
        except subprocess.TimeoutExpired:
            pass
        if keeper is None:
            continue  # the owner's certificate, or the self-signed one clients already trust: left as it is
        try:
            reason = keeper.refresh()
        except (OSError, TLSError) as exc:  # a full disk, say: nginx serves on with the certificate it has
            log.warning("front: cannot issue the front's certificate again: %s", exc)
            continue
        if reason:
            log.info("front: certificate issued again (%s); nginx reloads it", reason)
            nginx.send_signal(signal.SIGHUP)
