"""Two gateways, one address, for real: four network namespaces (boxes 0 and 1 gateways, 2 and 3 members), each
gateway with its front, router and controller, and keepalived (`everycycle fleet address`) holding the virtual
address PREFIX.200 by VRRP. Clients in the root namespace use only that address, trusting both gateways' local CAs.
The tests run in file order: the first gateway loses its programs, comes back as the standby; then the second loses
its link, and comes back as the standby too."""

from __future__ import annotations

import socket
import subprocess
import threading
import time

import httpx2 as httpx
import openai
import pytest

from tests.fleet_hosts import SMOL, start_fleet, vip_holder
from tests.servers import wait_for

pytestmark = pytest.mark.root  # ip netns, a bridge, keepalived

# What the tests measured may take, at most: VRRP's master-down time (three adverts at 1 s, about 3.6 s) or the
# check's two failures (about 2 s), then the client's next try.
FAILOVER_BOUND_S = 10.0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    f = start_fleet(tmp_path_factory.mktemp("failover"), [None, None, None, None], parallel=4, max_queue=256,
                    failover=True)
    yield f
    f.stop()


def client(fleet) -> openai.OpenAI:
    # TCP keepalive every second: a stream whose gateway vanished (its link cut) learns it from the standby's reset
    # (or three unanswered probes) instead of waiting out a read timeout.
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1), (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 1),
               (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1), (socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)]
    transport = httpx.HTTPTransport(verify=fleet.tls(), socket_options=options)
    return openai.OpenAI(base_url=fleet.url + "/v1", api_key=fleet.client_key, max_retries=0, timeout=30,
                         http_client=httpx.Client(transport=transport))


def ask(c: openai.OpenAI, text: str) -> str:
    return c.chat.completions.create(model=SMOL, messages=[{"role": "user", "content": text}], max_tokens=4,
                                     temperature=0).model


def streams(c: openai.OpenAI, n: int) -> tuple[list[threading.Thread], list[str]]:
    """n long streams through the virtual address, in threads; each ends "finished" or "failed: ..."."""
    endings: list[str] = []

    def one(i: int) -> None:
        try:
            for _ in c.chat.completions.create(model=SMOL, stream=True, max_tokens=400, temperature=0,
                                               messages=[{"role": "user", "content": f"Tell a long story {i}."}]):
                pass
            endings.append("finished")
        except (openai.APIError, httpx.HTTPError) as exc:
            endings.append(f"failed: {type(exc).__name__}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads, endings


def first_success_after(c: openai.OpenAI, since: float) -> float:
    """Seconds from `since` to the first request through the virtual address that succeeds (tries every 0.2 s)."""
    deadline = since + 60
    while time.monotonic() < deadline:
        try:
            if ask(c, "are you there?") == SMOL:
                return time.monotonic() - since
        except (openai.APIError, httpx.HTTPError):
            pass
        time.sleep(0.2)
    raise AssertionError("no request through the virtual address succeeded within 60 s")


def vrrp_log(fleet, side: int) -> str:
    return (fleet.workdir / f"address-{side}.log").read_text(errors="replace")


def test_the_first_gateway_holds_the_address_and_the_fleet_answers_there(fleet):
    assert vip_holder(fleet) == 0
    c = client(fleet)
    assert all(ask(c, f"hello {n}") == SMOL for n in range(4))
    # Both routers have every member: the standby is ready before it is needed.
    assert fleet.registered(0) == fleet.registered(1) and len(fleet.registered(1)) == 3


def test_when_the_active_gateways_programs_stop_the_standby_answers_within_the_bound(fleet, record_property):
    c = client(fleet)
    threads, endings = streams(c, 3)
    time.sleep(1.5)
    active = fleet.gateways[0]
    killed = time.monotonic()
    active.front.stop()     # nginx goes with its runner: the streams through it end now
    active.gateway.stop()   # and the router
    took = first_success_after(c, killed)
    record_property("failover_after_programs_stopped_s", round(took, 2))
    print(f"failover after the active gateway's programs stopped: {took:.2f} s")
    assert took < FAILOVER_BOUND_S
    assert vip_holder(fleet) == 1
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a stream hung"
    assert len(endings) == 3 and any(e.startswith("failed") for e in endings), endings
    # It comes back as the standby: nopreempt keeps the address where it is (no second cut for the clients).
    active.start("front")
    active.start("gateway")
    wait_for(lambda: "Entering BACKUP STATE" in vrrp_log(fleet, 0).rsplit("Entering FAULT STATE", 1)[-1], 30,
             "the first gateway back as the standby", active.address)
    time.sleep(3)  # several adverts: it would have taken the address by now if it were going to
    assert vip_holder(fleet) == 1
    assert ask(c, "still here") == SMOL


def test_when_the_active_gateways_link_is_cut_the_standby_takes_over_and_streams_end(fleet, record_property):
    assert vip_holder(fleet) == 1
    wait_for(lambda: len(fleet.registered(0)) == 3, 60, "the first gateway's router to have every member again",
             fleet.gateways[0].gateway)
    c = client(fleet)
    threads, endings = streams(c, 3)
    time.sleep(1.5)
    ns = fleet.net.names[1]
    cut = time.monotonic()
    subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "down"], check=True)
    try:
        took = first_success_after(c, cut)
        record_property("failover_after_link_cut_s", round(took, 2))
        print(f"failover after the active gateway's link was cut: {took:.2f} s")
        assert took < FAILOVER_BOUND_S
        assert vip_holder(fleet) == 0
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads), "a stream hung on the cut gateway"
        assert len(endings) == 3 and any(e.startswith("failed") for e in endings), endings
    finally:
        subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "up"], check=True)
    # Back on the LAN, it hears the new master's adverts and stays the standby.
    wait_for(lambda: "Entering BACKUP STATE" in vrrp_log(fleet, 1).rsplit("Entering FAULT STATE", 1)[-1], 30,
             "the second gateway back as the standby", fleet.gateways[1].address)
    time.sleep(3)
    assert vip_holder(fleet) == 0
    assert ask(c, "after the link came back") == SMOL
