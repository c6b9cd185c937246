"""The unprivileged users the box's services run as, which of the box's secrets each one owns, and handing a
root-written file to its owner.

One uid per service that holds a secret, so that one llama.cpp or GGUF bug in an engine (untrusted weights and
prompts) reads none of the others': the front holds the TLS keys and the local CA, the BMC agent its password,
the fleet program the fleet key; the serving API, its engines and discovery share the first user. The image makes
them (rootfs_overlay/usr/lib/sysusers.d/everycycle.conf) and supervisord runs each program as its own
(EVERYCYCLE_*_USER in defaults.env); on a developer's machine they are all whoever runs `make run`."""

from __future__ import annotations

import fnmatch
import os
import pwd
from pathlib import Path

SERVICE_USER = "everycycle"        # the serving API, its engines, discovery (and the governor while it observes)
FRONT_USER = "everycycle-front"    # nginx: the TLS keys, the local CA's key
BMC_USER = "everycycle-bmc"        # the BMC agent: the BMC's password
FLEET_USER = "everycycle-fleet"    # the fleet program: the fleet key (on the gateway)
SHARD_USER = "everycycle-shard"    # a shard host (llama.cpp's RPC server behind stunnel): its wire key
SERVICE_USERS = (SERVICE_USER, FRONT_USER, BMC_USER, FLEET_USER, SHARD_USER)

# Which user owns each of the box's secrets (paths relative to the root; a pattern covers a directory's files).
# Provisioning writes them so, and an update's carried copy is restored so, whoever owned it before.
SECRET_OWNERS = (
    ("etc/everycycle/api_keys.json", SERVICE_USER),
    ("etc/everycycle/tls/*", FRONT_USER),
    ("etc/everycycle/bmc.password", BMC_USER),
    ("etc/everycycle/fleet.key", FLEET_USER),
    ("etc/everycycle/shard-wire.key", SHARD_USER),
    ("etc/everycycle/shard-holder.keys", SERVICE_USER),
)


def owner_of(rel: str) -> str | None:
    """The service user that owns this path (relative to the root), or None: root's, or nobody's in particular."""
    return next((user for pattern, user in SECRET_OWNERS if fnmatch.fnmatchcase(rel, pattern)), None)


def service_ids(name: str = SERVICE_USER) -> tuple[int, int] | None:
    """(uid, gid) of a services' user; None where it does not exist (a developer's machine, the tests)."""
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
