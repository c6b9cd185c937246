"""Starting the front (I/O): the certificate, nginx's config from the settings, a config test, then nginx itself
in the foreground (supervisord's child; exec, so signals reach nginx directly)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path

from host_runtime.common.atomic_file import atomic_write
from host_runtime.front.nginx_conf import FrontPaths, render
from host_runtime.front.settings import FrontSettings
from host_runtime.front.tls import CertificatePair, ensure_certificate


class FrontError(Exception):
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
    run_dir.mkdir(parents=True, exist_ok=True)
    conf = run_dir / "nginx.conf"
    worker_user = pwd.getpwuid(os.geteuid()).pw_name if os.geteuid() == 0 else None
    atomic_write(conf, render(settings, FrontPaths(run_dir, upstream_socket, worker_user, gateway_port), pair).encode(), 0o644)
    test = subprocess.run([nginx_binary(), "-t", "-q", "-e", "stderr", "-p", str(run_dir), "-c", str(conf)],
                          capture_output=True, text=True)
    if test.returncode != 0:
        raise FrontError(f"nginx refused the generated config {conf}: {test.stderr.strip()}")
    return conf, pair


def exec_nginx(conf: Path, run_dir: Path) -> None:
    binary = nginx_binary()
    os.execv(binary, [binary, "-e", "stderr", "-p", str(run_dir), "-c", str(conf)])
