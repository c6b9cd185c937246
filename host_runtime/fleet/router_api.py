"""The fleet router's control API (I/O): sglang-router's /workers, as the controller needs it. HTTP and JSON
errors become RouterUnavailable."""

from __future__ import annotations

from urllib.parse import quote

from host_runtime.common.errors import UnavailableError
from host_runtime.common.http_client import HTTPClient, HTTPFailure
from host_runtime.fleet.controller import Registered, Worker


class RouterUnavailable(UnavailableError):
    """The router did not answer, or answered something unusable (`status`: its HTTP status, where it answered)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class RouterAPI:
    """`admin_key`: the router's control-plane key (router_process.py); /workers answers 401 without it."""

    def __init__(self, base_url: str, timeout_s: float = 5.0, admin_key: str | None = None):
        self.base = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.admin_key = admin_key
        self._http = HTTPClient()  # the controller asks every few seconds: one kept connection

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        headers = {"Authorization": f"Bearer {self.admin_key}"} if self.admin_key else {}
        try:
            answer = self._http.request(method, self.base + path, json=body, headers=headers, timeout=self.timeout_s)
        except HTTPFailure as exc:
            raise RouterUnavailable(f"{method} {path}: {exc.why}") from None
        if not answer.ok:
            raise RouterUnavailable(f"{method} {path}: HTTP {answer.status} {answer.body[:200]!r}", answer.status)
        try:
            return answer.json() if answer.body.strip() else {}
        except ValueError:
            raise RouterUnavailable(f"{method} {path}: not JSON: {answer.body[:200]!r}") from None

    def alive(self) -> bool:
        try:
            return self._http.get(self.base + "/liveness", timeout=1.0).ok
        except HTTPFailure:
            return False

    def models(self) -> list[str]:
        """The models its workers serve: the router's own /v1/models, an inference route (no key). With no worker
        it answers 503 ("No models available"): none."""
        try:
            doc = self._call("GET", "/v1/models")
        except RouterUnavailable as exc:
            if exc.status == 503:
                return []
            raise
        try:
            return sorted({str(m["id"]) for m in doc["data"]})
        except (KeyError, TypeError) as exc:
            raise RouterUnavailable(f"GET /v1/models: unexpected answer ({exc})") from None

    def workers(self) -> list[Registered]:
        doc = self._call("GET", "/workers")
        try:
            return [Registered(str(w["id"]), str(w["url"]), str(w.get("model_id") or "")) for w in doc["workers"]]
        except (KeyError, TypeError) as exc:
            raise RouterUnavailable(f"GET /workers: unexpected answer ({exc})") from None

    def add(self, worker: Worker, api_key: str | None) -> None:
        """Queue the worker's registration; the router reaches it with `api_key` (the fleet key), or, None, with
        the bearer token the request came with (the gateway's voucher for the client's key)."""
        self._call("POST", "/workers", {"url": worker.url, "model_id": worker.model_id,
                                        **({"api_key": api_key} if api_key is not None else {})})

    def remove(self, registered: Registered) -> None:
        self._call("DELETE", f"/workers/{quote(registered.id, safe='')}")
