"""API keys made at first boot, handed to the console to show once: never printed to the journal or a serial
console. The file lives on a RAM file system (/run), 0600, and the console removes it once the owner has seen it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from host_runtime.common.atomic_file import atomic_write


def write_new_keys(path: str | Path, keys: dict[str, str]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    existing = read_new_keys(path)  # keys not yet shown stay until they are
    atomic_write(path, json.dumps({"keys": {**existing, **keys}}).encode(), 0o600)


def read_new_keys(path: str | Path) -> dict[str, str]:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    keys = doc.get("keys") if isinstance(doc, dict) else None
    return {str(k): str(v) for k, v in keys.items()} if isinstance(keys, dict) else {}


def forget_new_keys(path: str | Path) -> None:
    """Shown: nothing keeps the keys any more (the key file has only their hashes)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
