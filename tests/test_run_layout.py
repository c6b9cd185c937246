"""Who owns what the services write on the box (#56, item 2): /run/everycycle was the serving user's, so code
running as that user could rename the front's folder and plant an nginx.conf, or keepalived's (root's) config.
Now it is root's, each service writes only in a folder tmpfiles.d gives that service, and the usage directory the
serving settings name exists and is the serving user's (its absence kept the image from ever becoming ready)."""

from __future__ import annotations

import configparser
import os
import re
import shlex
import stat
from pathlib import Path

import pytest

from host_runtime.fleet.vrrp import FailoverError
from host_runtime.fleet.vrrp_run import own_folder
from provisioning.service_settings import MODELS_DIR, USAGE_DIR

ROOT = Path(__file__).resolve().parent.parent
TMPFILES = ROOT / "rootfs_overlay/usr/lib/tmpfiles.d/everycycle.conf"
DEFAULTS = ROOT / "rootfs_overlay/etc/everycycle/defaults.env"
PROGRAMS = ROOT / "supervisor.d/programs"
# Options whose value is a file or folder the program writes.
WRITES = {"--output": "file", "--state": "file", "--unix-socket": "file", "--run-dir": "folder"}
# fleet-address writes its folder only as root, where it holds a virtual address (vrrp_run.own_folder checks it
# is root's alone); waiting as the fleet user it writes nothing.
ROOT_ONLY_WRITERS = {"fleet-address"}


def tmpfiles() -> dict[str, tuple[str, str, str]]:
    """path -> (mode, user, group) of each 'd' line."""
    out = {}
    for line in TMPFILES.read_text().splitlines():
        parts = line.split()
        if parts and parts[0] == "d":
            out[parts[1]] = (parts[2], parts[3], parts[4])
    return out


def box_environment() -> dict[str, str]:
    env = {}
    for line in DEFAULTS.read_text().splitlines():
        if re.match(r"^[A-Z_]+=", line):
            name, value = line.split("=", 1)
            env[f"ENV_{name}"] = value
    return env


def program_writes() -> list[tuple[str, str, str]]:
    """(program, its user, a folder it writes in) for every supervised program, with the box's environment."""
    env = box_environment()
    out = []
    for conf in sorted(PROGRAMS.glob("*.conf")):
        parser = configparser.RawConfigParser()
        parser.read(conf)
        for section in parser.sections():
            name = section.removeprefix("program:")
            fields = {k: re.sub(r"%\((\w+)\)s", lambda m: env.get(m.group(1), ""), v)
                      for k, v in parser.items(section)}
            argv = shlex.split(fields["command"])
            for i, arg in enumerate(argv[:-1]):
                if arg in WRITES:
                    path = argv[i + 1]
                    out.append((name, fields.get("user", "root"),
                                path if WRITES[arg] == "folder" else os.path.dirname(path)))
    return out


def test_the_run_directory_is_roots_and_each_service_writes_only_in_a_folder_of_its_own():
    dirs = tmpfiles()
    mode, user, group = dirs["/run/everycycle"]
    assert (user, group) == ("root", "root") and not int(mode, 8) & 0o022
    checked = 0
    for program, user, folder in program_writes():
        if not folder.startswith("/run/everycycle"):
            continue
        if program in ROOT_ONLY_WRITERS:
            assert folder not in dirs, f"{program}'s {folder}: made by root when needed, never given to a service"
            continue
        assert folder != "/run/everycycle", f"{program} writes in the run directory itself"
        assert folder in dirs, f"{program} writes in {folder}, which tmpfiles.d does not make"
        assert dirs[folder][1] == user, f"{program} ({user}) writes in {folder}, which is {dirs[folder][1]}'s"
        checked += 1
    assert checked >= 5  # discovery, governor, serving (two), front, fleet


def test_the_directories_the_serving_settings_name_are_the_serving_users():
    dirs = tmpfiles()
    serving_user = box_environment()["ENV_EVERYCYCLE_SERVICE_USER"]
    for path in (f"/{USAGE_DIR}", f"/{MODELS_DIR}"):
        assert path in dirs and dirs[path][1] == serving_user, path


def test_keepalived_configuration_goes_only_into_a_folder_of_this_users_alone(tmp_path):
    fresh = own_folder(tmp_path / "fleet-address")
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(FailoverError, match="not a folder of this user's alone"):
        own_folder(shared)
    (tmp_path / "planted").symlink_to(fresh)
    with pytest.raises(FailoverError, match="not a folder of this user's alone"):
        own_folder(tmp_path / "planted")
