"""Reading the boxes' capability maps (I/O): one GET per box with the fleet key, mapped to a Report (a map, or
why there is none)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from host_runtime.fleet.capabilities import Capabilities
from host_runtime.fleet.controller import Report

PATH = "/v1/everycycle/capabilities"


def tls_context(certificates: tuple[str, ...]) -> ssl.SSLContext:
    """What the router trusts for https:// peers (its --ca-cert-paths), for the polls too. OSError when a
    certificate cannot be read, ssl.SSLError when it is not one."""
    context = ssl.create_default_context()
    for path in certificates:
        context.load_verify_locations(cafile=path)
    return context


def poll(box: str, key: str, timeout_s: float, context: ssl.SSLContext | None = None) -> Report:
    req = urllib.request.Request(box.rstrip("/") + PATH, headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s, context=context) as resp:
            return Report(box, Capabilities.from_wire(json.loads(resp.read())))
    except urllib.error.HTTPError as exc:
        why = "the fleet key is refused (is it in the box's keys?)" if exc.code == 401 else f"HTTP {exc.code}"
        return Report(box, None, why)
    except (OSError, urllib.error.URLError) as exc:
        return Report(box, None, str(getattr(exc, "reason", exc)))
    except ValueError as exc:
        return Report(box, None, f"not a capability map: {exc}")


def poll_all(boxes: tuple[str, ...], key: str, timeout_s: float, pool: ThreadPoolExecutor,
             context: ssl.SSLContext | None = None) -> list[Report]:
    """Every box at once, so that a box that hangs costs one timeout, not one per box after it."""
    return list(pool.map(lambda b: poll(b, key, timeout_s, context), boxes))
