"""Where the services publish, under the run directory (/run/everycycle on the box, $EVERYCYCLE_RUN_DIR under
`make run`). The directory itself is root's (supervisord's socket and pid file); each service writes only in a
folder of its own (rootfs_overlay/usr/lib/tmpfiles.d/everycycle.conf), so no service can rename another's files
or root's: with the serving user owning it, code running as that user (it parses untrusted GGUFs and prompts)
could move the front's folder aside and plant an nginx.conf that serves the CA's key (#56, item 2).
Beside it, the state folder where provisioning writes the services' settings (/etc/everycycle on the box,
$EVERYCYCLE_STATE_DIR under `make run`)."""

from __future__ import annotations

import os
from pathlib import Path

BOX_RUN_DIR = "/run/everycycle"
BOX_STATE_DIR = "/etc/everycycle"
SERVING_SETTINGS = "serving.toml"  # in the state folder: the serving API's settings (serving/settings.py)
SUPERVISOR_SOCKET = "supervisor.sock"  # root's, in the run directory itself
TOPOLOGY = "discovery/topology.json"  # discovery's folder
GOVERNOR_STATE = "governor/governor.json"  # the governor's folder; its metrics beside it as governor.prom
FLEET_STATE = "fleet/fleet.json"  # the fleet program's folder: the gateway's view (fleet/state.py)


def run_dir(explicit: str | os.PathLike | None = None) -> Path:
    """The option, else $EVERYCYCLE_RUN_DIR (make run), else the box's /run/everycycle."""
    return Path(explicit or os.environ.get("EVERYCYCLE_RUN_DIR", BOX_RUN_DIR))


def state_dir(explicit: str | os.PathLike | None = None) -> Path:
    """The option, else $EVERYCYCLE_STATE_DIR (make run), else the box's /etc/everycycle."""
    return Path(explicit or os.environ.get("EVERYCYCLE_STATE_DIR", BOX_STATE_DIR))


def serving_settings_file(explicit_state_dir: str | os.PathLike | None = None) -> Path:
    """The box's serving.toml, in state_dir(explicit_state_dir)."""
    return state_dir(explicit_state_dir) / SERVING_SETTINGS


def topology_file(runs: Path) -> Path:
    return runs / TOPOLOGY


def governor_state_file(runs: Path) -> Path:
    return runs / GOVERNOR_STATE


def fleet_state_file(runs: Path) -> Path:
    return runs / FLEET_STATE


def supervisor_socket(runs: Path) -> Path:
    return runs / SUPERVISOR_SOCKET
