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


def fails_over(fleet, cause, to: int, what: str, record_property) -> None:
    """Three streams through the active gateway, then cause(): the first request through the virtual address
    succeeds within the bound, gateway `to` holds it, and every stream has ended, at least one with an error."""
    c = client(fleet)
    threads, endings = streams(c, 3)
    time.sleep(1.5)
    since = time.monotonic()
    cause()
    took = first_success_after(c, since)
    record_property(f"failover_after_{what.replace(' ', '_')}_s", round(took, 2))
    print(f"failover after the active gateway's {what}: {took:.2f} s")
    assert took < FAILOVER_BOUND_S
    assert vip_holder(fleet) == to
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a stream hung"
    assert len(endings) == 3 and any(e.startswith("failed") for e in endings), endings


def comes_back_as_standby(fleet, side: int, holder: int) -> None:
    """Gateway `side` is a standby again (keepalived says so after its last fault) and, several adverts later,
    `holder` still holds the address: nopreempt spares the clients a second cut."""
    wait_for(lambda: "Entering BACKUP STATE" in vrrp_log(fleet, side).rsplit("Entering FAULT STATE", 1)[-1], 30,
             f"gateway {side} back as the standby", fleet.gateways[side].address)
    time.sleep(3)
    assert vip_holder(fleet) == holder
    assert ask(client(fleet), "still here") == SMOL


def test_when_the_active_gateways_programs_stop_the_standby_answers_within_the_bound(fleet, record_property):
    active = fleet.gateways[0]

    def stop_programs() -> None:
        active.front.stop()     # nginx goes with its runner: the streams through it end now
        active.gateway.stop()   # and the router

    fails_over(fleet, stop_programs, 1, "programs stopped", record_property)
    active.start("front")
    active.start("gateway")
    comes_back_as_standby(fleet, 0, holder=1)


def test_when_the_active_gateways_link_is_cut_the_standby_takes_over_and_streams_end(fleet, record_property):
    assert vip_holder(fleet) == 1
    wait_for(lambda: len(fleet.registered(0)) == 3, 60, "the first gateway's router to have every member again",
             fleet.gateways[0].gateway)
    link = ["ip", "-n", fleet.net.names[1], "link", "set", "eth0"]
    try:
        fails_over(fleet, lambda: subprocess.run([*link, "down"], check=True), 0, "link cut", record_property)
    finally:
        subprocess.run([*link, "up"], check=True)
    comes_back_as_standby(fleet, 1, holder=0)
