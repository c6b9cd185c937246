"""The fleet prefix (/fleet/BOX/...) and the key check (pure: falcon's test client, no server)."""

import falcon
import falcon.testing
import pytest

from host_runtime.auth.keystore import KeyVerifier, create_key
from host_runtime.serving.app import AuthMiddleware, FleetPrefix
from host_runtime.serving.errors import APIError, handle_api_error


class Answer:
    def on_get(self, req, resp):
        resp.media = {"path": req.path}


@pytest.fixture
def client(tmp_path):
    keys = tmp_path / "keys.json"
    key = create_key(keys, "owner")
    app = falcon.App(middleware=[FleetPrefix(), AuthMiddleware(KeyVerifier(keys), "loopback")])
    for path in ("/metrics", "/health", "/v1/models"):
        app.add_route(path, Answer())
    app.add_error_handler(APIError, handle_api_error)
    return falcon.testing.TestClient(app), key


def test_behind_the_fleet_prefix_only_health_is_open(client):
    """The third hardening review: with metrics = "loopback" the front lets no LAN client reach /metrics, and the
    app opens it; but the front passes /fleet/... to anyone, and the app stripped the prefix before its key
    check, so GET /fleet/x/metrics from the LAN was a 200."""
    test, key = client
    assert test.simulate_get("/fleet/x/metrics").status_code == 401
    assert test.simulate_get("/fleet/x/metrics", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    assert test.simulate_get("/fleet/x/v1/models").status_code == 401
    # The router's health check of a worker, and what the front lets through unprefixed, are as before.
    assert test.simulate_get("/fleet/x/health").json == {"path": "/health"}
    assert test.simulate_get("/metrics").status_code == 200
