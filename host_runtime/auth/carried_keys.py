"""Keys changed while an update waits for its reboot: `update apply` copied /etc/everycycle (the API keys among it)
to the data partition, and the new slot's first boot restores that copy. A key revoked, or a limit tightened,
after the copy was taken would come back with the new slot; so a key change takes the copy again."""

from __future__ import annotations

from pathlib import Path

from host_runtime.update import carry
from host_runtime.update.system import UpdatePaths

BOX_KEYS = "etc/everycycle/api_keys.json"


def refresh_carried(keys_path: str | Path, paths: UpdatePaths = UpdatePaths()) -> bool:
    """Take the carried snapshot again when one is waiting and `keys_path` is the box's own key file; True if
    it was taken. A key file elsewhere (a developer's, a test's) is not carried and changes nothing."""
    try:
        if Path(keys_path).resolve() != (paths.root / BOX_KEYS).resolve() or not paths.carry.is_dir():
            return False
    except OSError:
        return False
    carry.snapshot(paths.root, paths.carry)
    return True
