"""The unprivileged user the box's services run as, and handing it the files it must read (keys, secrets)."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

SERVICE_USER = "everycycle"


def service_ids(name: str = SERVICE_USER) -> tuple[int, int] | None:
    """(uid, gid) of the services' user; None where it does not exist (a developer's machine, the tests)."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    return entry.pw_uid, entry.pw_gid


def give_to_services(path: str | os.PathLike, name: str = SERVICE_USER) -> None:
    """Make a root-written file the services' own (still 0600): only root can, and only where the user exists."""
    ids = service_ids(name)
    if ids is not None and os.geteuid() == 0:
        os.chown(Path(path), *ids)


def service_owner(name: str = SERVICE_USER) -> tuple[int, int] | None:
    """The (uid, gid) root gives the services' files (atomic_write's owner, set on the open file); None where root
    cannot or the user does not exist."""
    return service_ids(name) if os.geteuid() == 0 else None
