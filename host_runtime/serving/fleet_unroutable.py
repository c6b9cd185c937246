"""POST /v1/everycycle/fleet/unroutable, on the fleet's gateway: what a client is told when the router could not
route its request. sglang-router answers in plain text, and with the same 503 whether no box serves the model or
every box that does is busy; the gateway's front sends its 404 and 5xx here instead (nginx error_page, the
client's request as it was), and this asks the router which models it has to tell the two apart."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from host_runtime.serving.errors import APIError

ROUTER_TIMEOUT_S = 2.0


def explain(model: object, fleet_models: list[str] | None) -> APIError:
    """The client's error (pure): a 404 naming the fleet's models when none of its boxes serves `model`, else a 503
    to retry. fleet_models None: the router did not say."""
    if isinstance(model, str) and model and fleet_models is not None and model not in fleet_models:
        has = ", ".join(sorted(fleet_models)) or "none yet"
        return APIError(404, f"the model '{model}' is served by no box in the fleet; it has: {has}",
                        param="model", code="model_not_found", error_type="invalid_request_error")
    what = f"serves '{model}'" if isinstance(model, str) and model else "could take it"
    return APIError(503, f"no box in the fleet that {what} can take the request now; retry shortly",
                    code="fleet_unavailable", retry_after=2)


def router_models(router: str) -> list[str] | None:
    """The model ids the router has workers for (its /v1/models), or None when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{router}/v1/models", timeout=ROUTER_TIMEOUT_S) as r:
            doc = json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return [] if exc.code in (404, 503) else None   # the router's way of saying it has no worker at all
    except (OSError, ValueError):
        return None
    data = doc.get("data") if isinstance(doc, dict) else None
    return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)] if isinstance(data, list) else None


class FleetUnroutable:
    def __init__(self, router: str | None, body_limit: int):
        self.router = router
        self.body_limit = body_limit

    def _answer(self, req) -> None:
        if not self.router:
            raise APIError(404, "this box is not a fleet's gateway (serving.toml has no fleet_router)",
                           code="not_a_gateway")
        model = None
        if req.method == "POST" and req.content_length:
            raw = req.bounded_stream.read(self.body_limit + 1)
            try:
                doc = json.loads(raw) if len(raw) <= self.body_limit else None
            except ValueError:
                doc = None
            model = doc.get("model") if isinstance(doc, dict) else None
        raise explain(model, router_models(self.router))

    def on_post(self, req, resp):
        self._answer(req)

    def on_get(self, req, resp):
        self._answer(req)
