"""Reading the boxes' capability maps (I/O): one GET per box with the fleet key, mapped to a Report (a map, or
why there is none)."""

from __future__ import annotations

import ssl
from concurrent.futures import ThreadPoolExecutor

from host_runtime.common.http_client import HTTPClient, HTTPFailure
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


def unverified_certificate(why: str | None) -> bool:
    """Whether a poll failed because the box's certificate is not one the fleet trusts (not that it is down)."""
    text = (why or "").lower()
    return "certificate verify failed" in text or "certificate_verify_failed" in text or "hostname mismatch" in text


def peer_client(context: ssl.SSLContext | None = None) -> HTTPClient:
    """The polls' client: trusting `context` (tls_context's), and never following a redirect: a poll carries the
    fleet key, and a redirect (to anywhere) is an answer."""
    return HTTPClient(verify=context if context is not None else True, follow_redirects=False)


def poll(box: str, key: str, timeout_s: float, client: HTTPClient | None = None) -> Report:
    url = box.rstrip("/") + PATH
    try:
        if client is None:
            with peer_client() as own:
                answer = own.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=timeout_s)
        else:
            answer = client.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=timeout_s)
    except HTTPFailure as exc:
        return Report(box, None, exc.why)
    if answer.status == 401:
        return Report(box, None, "the fleet key is refused (is it in the box's keys?)")
    if 300 <= answer.status < 400:
        where = answer.headers.get("Location", "elsewhere")
        return Report(box, None, f"HTTP {answer.status} (redirects to {where}, which is not followed)")
    if not answer.ok:
        return Report(box, None, f"HTTP {answer.status}")
    try:
        return Report(box, Capabilities.from_wire(answer.json()))
    except ValueError as exc:
        return Report(box, None, f"not a capability map: {exc}")


def poll_all(boxes: tuple[str, ...], key: str, timeout_s: float, pool: ThreadPoolExecutor,
             client: HTTPClient) -> list[Report]:
    """Every box at once, so that a box that hangs costs one timeout, not one per box after it."""
    return list(pool.map(lambda b: poll(b, key, timeout_s, client), boxes))
