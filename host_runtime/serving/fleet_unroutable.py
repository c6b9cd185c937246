"""POST /v1/everycycle/fleet/unroutable, on the fleet's gateway: what a client is told when the router could not
route its request. sglang-router answers in plain text, and with the same 503 whether no box serves the model or
every box that does is busy; the gateway's front sends its 404 and 5xx here instead (nginx error_page, the
client's request as it was), and this asks the router which models its workers serve to tell the two apart (its
/v1/models: the control plane's /workers needs the router's admin key, which only the gateway's controller has)."""

from __future__ import annotations

from host_runtime.fleet.router_api import RouterAPI, RouterUnavailable
from host_runtime.serving.errors import APIError
from host_runtime.serving.protocol import parse_json_body

ROUTER_TIMEOUT_S = 2.0


def explain(model: object, fleet_models: list[str] | None) -> APIError:
    """The client's error (pure): a 404 naming the fleet's models when none of its boxes serves `model`, else a 503
    to retry. fleet_models None: the router did not say."""
    if isinstance(model, str) and model and fleet_models is not None and model not in fleet_models:
        has = ", ".join(sorted(fleet_models)) or "none yet"
        return APIError(404, f"the model '{model}' is served by no box in the fleet; it has: {has}",
                        param="model", code="model_not_found", error_type="invalid_request_error")
    which = f"that serves '{model}' " if isinstance(model, str) and model else ""
    return APIError(503, f"no box in the fleet {which}can take the request now; retry shortly",
                    code="fleet_unavailable", retry_after=2)


def router_models(router: str) -> list[str] | None:
    """The models the router has a worker for (its /v1/models), or None when it does not answer."""
    try:
        return RouterAPI(f"http://{router}", ROUTER_TIMEOUT_S).models()
    except RouterUnavailable:
        return None


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
            # The API's own body parser (its depth and type checks); a body it refuses names no model here: the
            # fleet's answer still goes out, not a second error about the body.
            try:
                model = parse_json_body(raw).get("model") if len(raw) <= self.body_limit else None
            except APIError:
                model = None
        raise explain(model, router_models(self.router))

    def on_post(self, req, resp):
        self._answer(req)

    def on_get(self, req, resp):
        self._answer(req)
