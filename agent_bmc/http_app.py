"""The agent's HTTP endpoint (falcon): the latest snapshot as JSON, and Prometheus text."""

from __future__ import annotations

import json

import falcon

from agent_bmc import metrics


class Telemetry:
    def __init__(self, coordinator):
        self._c = coordinator

    def on_get(self, req, resp):
        resp.content_type = falcon.MEDIA_JSON
        resp.text = json.dumps(self._c.view())


class Metrics:
    def __init__(self, coordinator):
        self._c = coordinator

    def on_get(self, req, resp):
        resp.content_type = "text/plain; version=0.0.4; charset=utf-8"
        resp.text = metrics.render(self._c.view())


def create_app(coordinator) -> falcon.App:
    app = falcon.App()
    app.add_route("/telemetry", Telemetry(coordinator))
    app.add_route("/metrics", Metrics(coordinator))
    return app
