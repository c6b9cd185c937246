"""Three boxes behind one endpoint, for real: each `everycycle serve` (1 thread) in a network namespace the test
makes; box 0 is also the gateway (its front checks the client's key, sglang-router routes, our controller feeds
it from the capability maps). Box 2 has only its own model. The tests run in file order: the last one kills a box."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx2 as httpx
import openai
import pytest

from host_runtime.engine.model import default_model_path
from tests.fleet_hosts import SMOL, box_metric, start_fleet
from tests.otlp_receiver import OTLPReceiver
from tests.servers import Proc, everycycle, http_get, wait_for

pytestmark = pytest.mark.root  # ip netns and a bridge
SOLO = "Solo-Model"


@pytest.fixture(scope="module")
def collector():
    """Every box's API sends its spans here (an OTLP/HTTP collector in the root namespace, on the bridge)."""
    receiver = OTLPReceiver(host="0.0.0.0")
    yield receiver
    receiver.close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, collector):
    work = tmp_path_factory.mktemp("fleet")
    solo = work / f"{SOLO}.gguf"
    shutil.copy(default_model_path(), solo)
    # Box 2 is a member as shipped (its API behind its own front, reached over HTTPS with the fleet key); box 1 is
    # plain HTTP, so that the killed box's front does not outlive its API.
    f = start_fleet(work, [None, None, str(solo)], parallel=4, max_queue=256, governor_state=True,
                    behind_front=(2,), trace_port=collector.port)
    yield f
    f.stop()


def client(fleet, key: str | None = None, **kw) -> openai.OpenAI:
    # The front's certificate names its listen address: verified against the local CA that issued it.
    return openai.OpenAI(base_url=fleet.url + "/v1", api_key=key or fleet.client_key, max_retries=0, timeout=120,
                         http_client=httpx.Client(verify=fleet.tls()), **kw)


def ask(c: openai.OpenAI, model: str, text: str, max_tokens: int = 4) -> str:
    out = c.chat.completions.create(model=model, messages=[{"role": "user", "content": text}],
                                    max_tokens=max_tokens, temperature=0)
    return out.model


def requests_on(fleet, i: int) -> float:
    return box_metric(fleet, i, "everycycle_requests_total")


def test_requests_for_a_model_on_one_box_all_go_to_that_box(fleet):
    c = client(fleet)
    before = [requests_on(fleet, i) for i in range(3)]
    for n in range(6):
        assert ask(c, SOLO, f"question {n}") == SOLO
    after = [requests_on(fleet, i) for i in range(3)]
    assert after[2] - before[2] == 6
    # The built-in model is not on box 2: its requests go to boxes 0 and 1 only (box 2 would answer 404).
    for n in range(6):
        assert ask(c, SMOL, f"other question {n}") == SMOL
    assert requests_on(fleet, 2) == after[2]
    assert requests_on(fleet, 0) + requests_on(fleet, 1) - after[0] - after[1] == 6


def test_measure_fleet_writes_a_document_whose_figures_come_from_every_box(fleet, tmp_path):
    from host_runtime.measure.report import check
    from tests.test_measure import SMALL

    box_toml = tmp_path / "box.toml"
    box_toml.write_text(SMALL)
    out, doc_path = tmp_path / "measurements.json", tmp_path / "architecture.md"
    run = subprocess.run(fleet.net.run_in(0, everycycle(
        "measure", "--fleet", "--fleet-settings", str(fleet.workdir / "fleet-0.toml"), "--url", fleet.url,
        "--ca-cert", str(fleet.certificate), "--box-toml", str(box_toml), "--json", str(out), "--doc", str(doc_path))),
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert check(doc_path.read_text(), doc) == []
    f = doc["figures"]
    for i in range(3):   # each box measured over its own link, box 2 over HTTPS through its front
        assert f[f"link.box{i}.rtt_ms"]["value"] > 0 and f[f"box{i}.prefill_s"]["value"] > 0
    assert doc["machines"][0]["roles"][0]["role"] == "router"   # the gateway is the box on loopback
    assert f["load.ttft_p50_s"]["value"] > 0


def test_the_clients_key_works_at_the_gateway_and_never_travels_to_the_boxes(fleet):
    with pytest.raises(openai.AuthenticationError) as err:
        ask(client(fleet, key="ec-not-a-key"), SMOL, "hi")
    assert err.value.body["code"] == "invalid_api_key"
    # Box 1 does not know the client's key (only the fleet key), yet serves the gateway's requests.
    status, _ = http_get(fleet.boxes[1].base + "/v1/models", key=fleet.client_key)
    assert status == 401
    assert http_get(fleet.boxes[1].base + "/v1/models", key=fleet.fleet_key)[0] == 200
    models = {m.id for m in client(fleet).models.list()}
    assert models == {SMOL, SOLO}
    # A model no box has: a 404 naming the fleet's models (the router itself says 503 in plain text).
    with pytest.raises(openai.NotFoundError) as err:
        ask(client(fleet), "No-Such-Model", "hi")
    assert err.value.body["code"] == "model_not_found" and err.value.body["param"] == "model"
    assert f"'No-Such-Model' is served by no box in the fleet; it has: {', '.join(sorted([SMOL, SOLO]))}" in \
        err.value.body["message"]


def _gateway_key(fleet, name: str, *limits: str) -> str:
    keys = str(fleet.workdir / "box0_keys.json")  # the gateway's own key file: its front asks its API
    return subprocess.run(everycycle("keys", "create", "--keys", keys, name, *limits), capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


def test_a_keys_limits_hold_on_the_box_that_serves_it(fleet):
    """#56, item 6: the router sent every request on with the fleet key, so a client key's models, token limits,
    concurrency and class held nowhere. The gateway now vouches for the key and the box applies its limits."""
    narrow = _gateway_key(fleet, "narrow", "--models", SOLO)
    assert ask(client(fleet, narrow), SOLO, "hi") == SOLO  # box 2, which never saw the key
    with pytest.raises(openai.PermissionDeniedError) as err:
        ask(client(fleet, narrow), SMOL, "hi")
    assert err.value.body["code"] == "model_not_allowed" and "'narrow@fleet' may not use the model" in \
        err.value.body["message"]
    metered = _gateway_key(fleet, "metered", "--tokens-per-minute", "60")
    ask(client(fleet, metered), SOLO, "Tell me a long story about a lighthouse.", max_tokens=48)
    log_before = len(fleet.boxes[2].proc.log())
    with pytest.raises(openai.RateLimitError) as err:
        ask(client(fleet, metered), SOLO, "hi")
    # the box's 429, as it said it (not the front's page), asked of the box once: the router did not retry it
    assert err.value.body["code"] == "token_limit_exceeded" and "limit is 60 a minute" in err.value.message
    assert "metered@fleet" in err.value.message and 1 <= int(err.value.response.headers["retry-after"]) <= 60

    def refusals() -> list[str]:
        return [line for line in fleet.boxes[2].proc.log()[log_before:].splitlines() if '" 430 ' in line]

    # the access log's line is written after the answer went out: read once it is there (a full suite's load once
    # had the log read before it)
    wait_for(refusals, 10, "the box's access-log line of its refusal")
    assert len(refusals()) == 1, refusals()


def test_a_request_through_the_gateway_is_one_trace_from_its_key_check_to_the_box_that_answers(fleet, collector):
    """The gateway's front gives a request without a traceparent one (and passes a client's on): its key check on
    the gateway and the member's answer are spans of that one trace."""
    ask(client(fleet), SOLO, "hi")  # box 2's model: the answer comes from a member behind its own front
    answered = "POST /v1/chat/completions"

    def gateway_made_trace():
        for span in collector.spans:
            if span.name == answered and span.attributes.get("everycycle.model") == SOLO:
                checks = [s for s in collector.trace(span.trace_id) if s.name == "GET /v1/everycycle/auth"]
                if checks:
                    return span, checks[0]
        return None

    member, check = wait_for(gateway_made_trace, 30, "a member's span and the gateway's key check in one trace")
    assert member.parent_id == check.parent_id != ""  # both children of the span the gateway's front named
    # the member serves the client's key as the gateway vouched for it (#56, item 6), not as the fleet key
    assert member.attributes["everycycle.key"] == "client@fleet" and check.attributes["everycycle.key"] == "client"
    # A client's own traceparent goes through the gateway to the member as it is
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    traced = client(fleet, default_headers={"traceparent": f"00-{trace_id}-{span_id}-01"})
    assert ask(traced, SOLO, "hello") == SOLO
    spans = collector.wait_for_trace(trace_id, {answered, "GET /v1/everycycle/auth", "decode"})
    assert {s.parent_id for s in spans if s.name in (answered, "GET /v1/everycycle/auth")} == {span_id}


def test_two_hundred_concurrent_streams_across_the_boxes_get_no_5xx(fleet):
    c = client(fleet)
    statuses: list[str] = []
    lock = threading.Lock()

    def stream(n: int) -> None:
        try:
            chunks = c.chat.completions.create(model=SOLO if n % 3 == 2 else SMOL, stream=True, max_tokens=6,
                                               messages=[{"role": "user", "content": f"Count to {n % 17}."}])
            text = "".join((ch.choices[0].delta.content or "") for ch in chunks if ch.choices)
            outcome = "ok" if text else "empty"
        except openai.APIStatusError as exc:
            outcome = str(exc.status_code)
        except openai.APIConnectionError as exc:
            outcome = f"connection: {exc}"
        with lock:
            statuses.append(outcome)

    with ThreadPoolExecutor(max_workers=200) as pool:
        list(pool.map(stream, range(200)))
    counts = {s: statuses.count(s) for s in set(statuses)}
    assert len(statuses) == 200
    assert not [s for s in statuses if s.startswith("5") or s.startswith("connection")], counts
    assert counts.get("ok", 0) >= 190, counts  # a 429 is the box's queue speaking, not a failure of the gateway


def _governor(fleet, i: int, level: int, state: str) -> None:
    path = fleet.workdir / f"box{i}_governor.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"updated_unix": time.time(), "throttle_level": level, "gpus": [{"state": state}]}))
    tmp.replace(path)


def test_a_box_in_emergency_gets_no_new_work_and_returns_when_it_recovers(fleet):
    box1 = fleet.boxes[1].base
    _governor(fleet, 1, 2, "emergency")
    wait_for(lambda: (box1, SMOL) not in fleet.registered(), 15, "box 1's worker removed")
    assert "emergency" in {b["box"]: b["left_out"] for b in fleet.state()["boxes"]}[box1]
    # What an owner reads at the gateway: each box, its version and slot, and why box 1 gets no work.
    status = subprocess.run(everycycle("fleet", "status", "--state", str(fleet.state_file)), capture_output=True,
                            text=True, timeout=30)
    rows = {line.split()[0]: line for line in status.stdout.splitlines()[1:]}
    assert status.returncode == 0 and "3 boxes" in status.stdout.splitlines()[0]
    assert "left out: the governor is in emergency" in rows[box1] and "slot unavailable" in rows[box1]
    assert f"serving  models: {SMOL}" in rows[fleet.boxes[0].base]
    before = requests_on(fleet, 1)
    c = client(fleet)
    for n in range(6):
        assert ask(c, SMOL, f"while box 1 is hot {n}") == SMOL
    assert requests_on(fleet, 1) == before
    _governor(fleet, 1, 0, "normal")
    wait_for(lambda: (box1, SMOL) in fleet.registered(), 15, "box 1's worker back")


def test_a_killed_box_is_taken_out_in_seconds_its_streams_end_and_later_requests_all_succeed(fleet):
    box1 = fleet.boxes[1]
    c = client(fleet)
    endings: list[str] = []

    def long_stream(n: int) -> None:
        try:
            chunks = c.chat.completions.create(model=SMOL, stream=True, max_tokens=200,
                                               messages=[{"role": "user", "content": f"Tell a long story {n}."}])
            for _ in chunks:
                pass
            endings.append("finished")
        except (openai.APIError, httpx.HTTPError) as exc:
            endings.append(f"failed: {type(exc).__name__}")

    threads = [threading.Thread(target=long_stream, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    time.sleep(2.0)
    box1.proc.stop()  # the whole box's API and engine
    # Two missed polls (0.5 s apart, 1 s timeouts) and the next change: seconds; 15 s is the bound.
    wait_for(lambda: (box1.base, SMOL) not in fleet.registered(), 15, "the killed box's worker removed")
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a stream hung on the killed box"
    assert len(endings) == 6
    for n in range(8):
        assert ask(c, SMOL, f"after the kill {n}") == SMOL
    # It rejoins once its capability map answers again.
    box1.proc = Proc(box1.argv, fleet.workdir / "box1-again.log")
    wait_for(lambda: (box1.base, SMOL) in fleet.registered(), 120, "the restarted box's worker back")
    assert ask(c, SMOL, "welcome back") == SMOL
