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
    """What the polls trust for https:// peers, which carry the fleet key: the fleet's peer certificates alone
    where it names any (a publicly trusted certificate for a peer's DNS name is not enough), else the system's
    CAs. OSError when a certificate cannot be read, ssl.SSLError when it is not one."""
    if not certificates:
        return ssl.create_default_context()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the chain and the host name; no system CAs
    for path in certificates:
        context.load_verify_locations(cafile=path)
    return context


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A poll carries the fleet key: a redirect (to anywhere) is an answer, never followed."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise urllib.error.HTTPError(req.full_url, code, f"redirects to {newurl}, which is not followed", headers, fp)


def poll(box: str, key: str, timeout_s: float, context: ssl.SSLContext | None = None) -> Report:
    req = urllib.request.Request(box.rstrip("/") + PATH, headers={"Authorization": f"Bearer {key}"})
    opener = urllib.request.build_opener(_NoRedirects, urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(req, timeout=timeout_s) as resp:
            return Report(box, Capabilities.from_wire(json.loads(resp.read())))
    except urllib.error.HTTPError as exc:
        why = "the fleet key is refused (is it in the box's keys?)" if exc.code == 401 else \
            f"HTTP {exc.code} ({exc.msg})" if 300 <= exc.code < 400 else f"HTTP {exc.code}"
        return Report(box, None, why)
    except (OSError, urllib.error.URLError) as exc:
        return Report(box, None, str(getattr(exc, "reason", exc)))
    except ValueError as exc:
        return Report(box, None, f"not a capability map: {exc}")


def poll_all(boxes: tuple[str, ...], key: str, timeout_s: float, pool: ThreadPoolExecutor,
             context: ssl.SSLContext | None = None) -> list[Report]:
    """Every box at once, so that a box that hangs costs one timeout, not one per box after it."""
    return list(pool.map(lambda b: poll(b, key, timeout_s, context), boxes))
