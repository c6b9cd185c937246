"""#56, item 6: a key's limits hold where the fleet serves it. The gateway's API vouches for the client's key; the box
that serves the request checks the voucher with the public half of a key derived from the fleet key and applies the
key's models, token limits (with its use on the other boxes), concurrency and class."""

from __future__ import annotations

import json
import subprocess
import time

import falcon
import falcon.testing
import pytest

from host_runtime.auth import fleet_vouch
from host_runtime.auth.keystore import KeyVerifier, load_keys
from host_runtime.engine.key_ledger_file import SharedKeyLedger
from host_runtime.fleet.capabilities import Capabilities, GovernorView
from host_runtime.fleet.controller import Report
from host_runtime.fleet.state import GatewayState, vouched_use
from host_runtime.serving.app import AuthMiddleware, KeyCheck
from host_runtime.serving.errors import APIError, handle_api_error
from host_runtime.serving.key_tokens import KeyTokens
from tests.servers import everycycle

FLEET_KEY = "ec-" + "f" * 40


def _import(tmp_path, name: str, *extra: str):
    key_file = tmp_path / "fleet.key"
    key_file.write_text(FLEET_KEY + "\n")
    key_file.chmod(0o600)
    keys = tmp_path / f"{name}.json"
    done = subprocess.run(everycycle("keys", "import", "--keys", str(keys), "--key-file", str(key_file), "fleet",
                                     *extra), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return keys


def test_the_gateway_vouches_and_a_member_checks_with_the_public_half_alone(tmp_path):
    gateway = KeyVerifier(_import(tmp_path, "gateway", "--gateway"))
    member_keys = _import(tmp_path, "member")
    (record,) = load_keys(member_keys)
    assert record.vouch_public_key and not record.vouch_signing_seed  # a member cannot vouch: it opens no other box
    member = KeyVerifier(member_keys)
    assert member.voucher() is None and member.checks_vouchers()
    now = time.time()
    token = gateway.voucher().issue(fleet_vouch.Vouch("team", "batch", 2, 100, 5000, ("a",)), now)
    fleet_record, policy, _ = member.vouched(token, now)
    assert fleet_record.name == "fleet"
    assert (policy.name, policy.priority, policy.max_concurrent, policy.tokens_per_minute, policy.tokens_per_day,
            policy.models) == ("team@fleet", "batch", 2, 100, 5000, ("a",))
    # altered, out of date, or from another fleet's gateway: refused
    body, _, signature = token.rpartition(".")
    claims = json.loads(fleet_vouch._unb64(body[len(fleet_vouch.PREFIX):]))
    widened = fleet_vouch.PREFIX + fleet_vouch._b64(json.dumps({**claims, "tokens_per_minute": 0}).encode())
    assert member.vouched(widened + "." + signature, now) is None
    assert member.vouched(token, now + fleet_vouch.VOUCH_LIFETIME_S + fleet_vouch.CLOCK_SKEW_S + 1) is None
    other = fleet_vouch.Voucher(fleet_vouch.signing_seed("ec-" + "o" * 40))
    assert member.vouched(other.issue(fleet_vouch.Vouch("team"), now), now) is None


def _app(verifier, ledger, raise_status: int | None = None, use_id: str = "me"):
    class Echo:
        def on_post(self, req, resp):
            if raise_status:
                raise APIError(raise_status, "no", code="token_limit_exceeded", retry_after=7)
            resp.media = {"key": req.context.key_name, "models": list(req.context.key_policy.models)}

    app = falcon.App(middleware=[AuthMiddleware(verifier, "key", KeyTokens(ledger), use_id)])
    app.add_route("/v1/chat/completions", Echo())
    app.add_error_handler(APIError, handle_api_error)
    return falcon.testing.TestClient(app)


def test_a_vouched_key_counts_its_use_on_the_other_boxes_and_is_refused_as_430(tmp_path):
    gateway = KeyVerifier(_import(tmp_path, "gateway", "--gateway"))
    member = KeyVerifier(_import(tmp_path, "member"))
    ledger = SharedKeyLedger(tmp_path / "usage" / "ledger")
    ledger.add("team@fleet", 15, time.time())
    client = _app(member, ledger)

    def vouched(fleet_use):
        return {"Authorization": "Bearer " + gateway.voucher().issue(
            fleet_vouch.Vouch("team", tokens_per_minute=100, models=("a",), fleet_use=fleet_use), time.time())}

    ok = client.simulate_post("/v1/chat/completions", headers=vouched({"me": [15, 15], "box-b": [80, 80]}))
    assert ok.status_code == 200 and ok.json == {"key": "team@fleet", "models": ["a"]}  # 15 here + 80 there
    refused = client.simulate_post("/v1/chat/completions", headers=vouched({"me": [15, 15], "box-b": [85, 85]}))
    # 100 across the fleet: refused, as 430 so that the router does not retry it on every box, the 429 inside
    assert refused.status_code == 430 and refused.headers["Retry-After"] == "60"
    error = json.loads(refused.headers[fleet_vouch.ERROR_HEADER])["error"]
    assert error["code"] == "token_limit_exceeded" and "used 100 tokens in the last minute" in error["message"]
    assert client.simulate_post("/v1/chat/completions", headers={"Authorization": "Bearer ecv1.x.y"}).status_code == 401
    # the engine's own 429 for a vouched request (its concurrency, the box's own count) is a 430 too; a key of the
    # box's own still gets the 429
    keys = tmp_path / "member.json"
    mine = subprocess.run(everycycle("keys", "create", "--keys", str(keys), "mine"), capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()
    refusing = _app(KeyVerifier(keys), ledger, raise_status=429)
    assert refusing.simulate_post("/v1/chat/completions", headers=vouched({})).status_code == 430
    assert refusing.simulate_post("/v1/chat/completions", headers={"Authorization": f"Bearer {mine}"}).status_code == 429


def test_the_gateways_view_of_each_keys_use_goes_into_its_vouchers(tmp_path):
    def caps(use_id, use):
        return Capabilities("b", "1", GovernorView("normal"), (), use_id=use_id, vouched_use=use)

    reports = [Report("https://a", caps("ida", {"team@fleet": [10, 40], "mine": [1, 1]})),
               Report("https://b", caps("idb", {"team@fleet": [5, 5]})), Report("https://c", None, "down")]
    use = vouched_use(reports)
    assert use == {"team": {"ida": [10, 40], "idb": [5, 5]}}
    state = tmp_path / "fleet.json"
    state.write_text(json.dumps(GatewayState(0.0, "round_robin", vouched_use=use).to_json()))
    assert GatewayState.from_json(json.loads(state.read_text())).vouched_use == use

    gateway = KeyVerifier(_import(tmp_path, "gateway", "--gateway"))
    subprocess.run(everycycle("keys", "create", "--keys", str(tmp_path / "gateway.json"), "team",
                              "--tokens-per-minute", "100"), capture_output=True, text=True, check=True, timeout=60)
    app = falcon.App(middleware=[AuthMiddleware(gateway)])
    app.add_route("/v1/everycycle/auth", KeyCheck(gateway, str(state)))
    client = falcon.testing.TestClient(app)
    team_key = subprocess.run(everycycle("keys", "create", "--keys", str(tmp_path / "gateway.json"), "team2",
                                         "--tokens-per-minute", "100"), capture_output=True, text=True,
                              check=True, timeout=60).stdout.strip()
    answer = client.simulate_get("/v1/everycycle/auth", headers={"Authorization": f"Bearer {team_key}"})
    # the controller has the router's workers keep the fleet key: no voucher (a box's front refuses two bearers)
    assert answer.status_code == 204 and fleet_vouch.VOUCH_HEADER not in answer.headers
    state.write_text(json.dumps(GatewayState(0.5, "round_robin", vouching=True).to_json()))
    answer = client.simulate_get("/v1/everycycle/auth", headers={"Authorization": f"Bearer {team_key}"})
    assert answer.status_code == 204
    member = KeyVerifier(_import(tmp_path, "member"))
    _, policy, vouch = member.vouched(answer.headers[fleet_vouch.VOUCH_HEADER], time.time())
    assert policy.name == "team2@fleet" and policy.tokens_per_minute == 100 and vouch.fleet_use == {}
    state.write_text(json.dumps(GatewayState(1.0, "round_robin", vouched_use={"team2": {"ida": [3, 4]}},
                                             vouching=True).to_json()))
    answer = client.simulate_get("/v1/everycycle/auth", headers={"Authorization": f"Bearer {team_key}"})
    _, _, vouch = member.vouched(answer.headers[fleet_vouch.VOUCH_HEADER], time.time())
    assert vouch.fleet_use == {"ida": [3, 4]} and vouch.elsewhere("idb") == (3, 4) and vouch.elsewhere("ida") == (0, 0)


@pytest.mark.parametrize("role", ["gateway", "member"])
def test_provisioning_gives_every_fleet_box_the_public_half_and_the_gateway_alone_the_seed(tmp_path, role):
    from provisioning.apply import plan_files
    from provisioning.bundle import open_bundle
    from provisioning.service_settings import service_settings
    from tests.test_provisioning import FLEET_KEY_TEXT, _with, make_bundle

    fleet = {"role": role, "key_file": "files/fleet.key"}
    if role == "gateway":
        fleet["peers"] = ["https://10.0.0.3:8443"]
    bundle = open_bundle(make_bundle(tmp_path / "bundle", _with("fleet", fleet),
                                     {"files/bmc.pass": b"p", "files/fleet.key": FLEET_KEY_TEXT.encode()}))
    files = plan_files(bundle, {})
    (record,) = [k for k in json.loads(files["etc/everycycle/api_keys.json"][0])["keys"] if k["name"] == "fleet"]
    assert record["vouch_public_key"] == fleet_vouch.public_key(FLEET_KEY_TEXT)
    assert bool(record.get("vouch_signing_seed")) == (role == "gateway")
    assert service_settings(bundle.box)["etc/everycycle/fleet.toml"].vouch_for_clients == (role == "gateway")


def test_the_gateway_vouches_only_when_every_box_checks_vouchers():
    from host_runtime.fleet.controller import vouches, vouching_reason
    from host_runtime.fleet.settings import FleetSettings

    def caps(checks):
        return Capabilities("b", "1", GovernorView("normal"), (), checks_vouchers=checks)

    on = FleetSettings(role="gateway", peers=("https://a:8443",), vouch_for_clients=True)
    both = [Report("https://a", caps(True)), Report("https://b", caps(True)), Report("https://c", None, "down")]
    assert vouches(on, both)
    older = [Report("https://a", caps(True)), Report("https://b", caps(False))]
    assert not vouches(on, older) and "https://b cannot check them" in vouching_reason(on, older)
    off = FleetSettings(role="gateway", peers=("https://a:8443",))
    assert not vouches(off, both) and "vouch_for_clients is off" in vouching_reason(off, both)
    assert not vouches(on, [Report("https://c", None, "down")])
