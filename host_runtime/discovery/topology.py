"""The topology document: collected from every source, hashed, validated, written atomically."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import platform
import socket
from importlib import resources
from pathlib import Path

from host_runtime.common.errors import InputError
from host_runtime.common.atomic_file import atomic_write
from host_runtime.discovery.bmc import collect_bmc
from host_runtime.discovery.cpu import collect_cpu
from host_runtime.discovery.gpus import collect_gpus
from host_runtime.discovery.memory import collect_memory
from host_runtime.discovery.network import collect_network
from host_runtime.discovery.storage import collect_storage

SCHEMA_VERSION = 1
# Readings that change without the hardware changing: kept in the file, left out of the hash.
VOLATILE_KEYS = frozenset({"available_bytes", "free_bytes", "vram_free_bytes", "generated_at", "content_hash"})


class TopologyInvalid(InputError):
    pass


SECTIONS = ("cpu", "memory", "gpus", "storage", "network", "bmc")


def collect(bmc_address: str | None = None, *, only: frozenset[str] | None = None, previous: dict | None = None) -> dict:
    """The whole document; with `only` and `previous`, only those sections are read again and the rest kept.

    A link coming up should not cost a GPU probe (llama.cpp's device list, the BMC): under load that takes seconds.
    """
    readers = {
        "cpu": collect_cpu,
        "memory": collect_memory,
        "gpus": collect_gpus,
        "storage": collect_storage,
        "network": collect_network,
        "bmc": lambda: collect_bmc(configured_address=bmc_address),
    }
    doc = {
        "schema_version": SCHEMA_VERSION,
        "generated_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": {"hostname": socket.gethostname(), "kernel": platform.release()},
    }
    for section in SECTIONS:
        keep = previous is not None and only is not None and section not in only and section in previous
        doc[section] = previous[section] if keep else readers[section]()
    doc["content_hash"] = content_hash(doc)
    return doc


def _stable(value):
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in VOLATILE_KEYS}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def content_hash(doc: dict) -> str:
    """Changes when the hardware (or an address) does, not when free memory moves."""
    return hashlib.sha256(json.dumps(_stable(doc), sort_keys=True).encode()).hexdigest()


def schema() -> dict:
    return json.loads(resources.files("host_runtime.discovery").joinpath("topology.schema.json").read_text())


def validate(doc: dict) -> None:
    import jsonschema

    try:
        jsonschema.validate(doc, schema())
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top level)"
        raise TopologyInvalid(f"{where}: {exc.message}") from None


def write(doc: dict, path: Path) -> None:
    validate(doc)
    atomic_write(path, (json.dumps(doc, indent=2) + "\n").encode(), mode=0o644)


def read_hash(path: Path) -> str | None:
    try:
        return json.loads(path.read_text()).get("content_hash")
    except (OSError, ValueError):
        return None
