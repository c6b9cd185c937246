"""Reading the boxes' capability maps (I/O): one GET per box with the fleet key, mapped to a Report (a map, or
why there is none)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from host_runtime.fleet.capabilities import Capabilities
from host_runtime.fleet.controller import Report

PATH = "/v1/everycycle/capabilities"


def poll(box: str, key: str, timeout_s: float) -> Report:
    req = urllib.request.Request(box.rstrip("/") + PATH, headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return Report(box, Capabilities.from_wire(json.loads(resp.read())))
    except urllib.error.HTTPError as exc:
        why = "the fleet key is refused (is it in the box's keys?)" if exc.code == 401 else f"HTTP {exc.code}"
        return Report(box, None, why)
    except (OSError, urllib.error.URLError) as exc:
        return Report(box, None, str(getattr(exc, "reason", exc)))
    except ValueError as exc:
        return Report(box, None, f"not a capability map: {exc}")


def poll_all(boxes: tuple[str, ...], key: str, timeout_s: float, pool: ThreadPoolExecutor) -> list[Report]:
    """Every box at once, so that a box that hangs costs one timeout, not one per box after it."""
    return list(pool.map(lambda b: poll(b, key, timeout_s), boxes))
