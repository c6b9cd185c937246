"""The fleet's virtual address held by keepalived (fleet/vrrp.py says how): its configuration written from
fleet.toml and front.toml, then keepalived itself in this process's place, in the foreground under supervisord.

keepalived runs as root: it adds and removes an address and sends VRRP and ARP packets (CAP_NET_ADMIN and
CAP_NET_RAW); its check runs as an unprivileged user (the configuration's script_user)."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from host_runtime.common.atomic_file import atomic_write
from host_runtime.discovery.network import collect_network
from host_runtime.fleet.settings import FleetSettings
from host_runtime.fleet.vrrp import Failover, FailoverError, interface_for, render

CONF_NAME = "keepalived.conf"


def keepalived_binary() -> str:
    """keepalived's path; FailoverError naming the package where it is missing."""
    found = shutil.which("keepalived", path=f"{os.environ.get('PATH', '')}:/usr/sbin")
    if not found:
        raise FailoverError("keepalived is not installed (Debian's package keepalived): the virtual address "
                            "cannot be held")
    return found


def own_folder(run_dir: Path) -> Path:
    """run_dir, made if missing; FailoverError unless it is a folder of this user's that no other may write:
    keepalived runs as root what its configuration names (#56, item 2)."""
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(run_dir)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise FailoverError(f"{run_dir} is not a folder of this user's alone (owner uid {st.st_uid}, mode "
                            f"{stat.filemode(st.st_mode)}): keepalived's configuration goes nowhere another user "
                            "could change it")
    return run_dir


def prepare(settings: FleetSettings, front_port: int, run_dir: Path) -> list[str]:
    """Write keepalived.conf under run_dir; the command line that runs keepalived on it in the foreground."""
    links = collect_network()
    if isinstance(links, dict):  # unavailable: only a named interface will do
        if not settings.vrrp_interface:
            raise FailoverError(f"the network interfaces cannot be read ({links.get('unavailable')}): name the "
                                "virtual address's interface with vrrp_interface")
        links = []
    failover = Failover(interface=interface_for(settings, links), front_port=front_port)
    conf = own_folder(run_dir) / CONF_NAME
    atomic_write(conf, render(settings, failover).encode(), mode=0o644)
    return [keepalived_binary(), "--dont-fork", "--log-console", "--vrrp", "--use-file", str(conf),
            "--pid", str(run_dir / "keepalived.pid"), "--vrrp_pid", str(run_dir / "vrrp.pid")]


def run(settings: FleetSettings, front_port: int, run_dir: Path) -> None:
    """keepalived in this process's place (never returns; FailoverError before it starts)."""
    argv = prepare(settings, front_port, run_dir)
    os.execv(argv[0], argv)
