"""The gateway routes by each box's measured speed (#62), for real: two boxes in network namespaces holding the same
model, box 1 held to a sixth of a CPU by a cgroup quota. The router's cache_aware alone sends a new prompt to
whichever box's prefix tree is smaller; the controller reads each box's prompt tokens per second computing from
its capability map, leaves the slow box out of the model's workers while the fast one has room, lets it in while the
fast one is full, and `fleet status` shows what it measured and where the model goes."""

from __future__ import annotations

import random
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import httpx2 as httpx
import openai
import pytest

from tests.fleet_hosts import SMOL, box_metric, start_fleet
from tests.servers import everycycle

pytestmark = pytest.mark.root  # ip netns, a bridge and a cgroup
WORDS = ("river", "lamp", "copper", "orbit", "maple", "signal", "harbor", "violet", "quartz", "meadow", "ember",
         "glacier", "tunnel", "saffron", "pixel", "canyon", "willow", "beacon", "marble", "thistle")


def routed_to(fleet) -> set[str]:
    """The boxes the controller decided the model goes to (box 0's own API is its loopback URL)."""
    return {w["box"] for w in fleet.state().get("workers", []) if w["model_id"] == SMOL}


def until(what, timeout_s: float, step_s: float = 0.25):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(step_s)
    return what()


def test_a_slow_box_gets_the_model_only_while_the_fast_one_is_full_and_status_says_why(tmp_path):
    fleet = start_fleet(tmp_path, [None, None], parallel=2, max_queue=64, cpu_percent=[None, 16],
                        route_by_speed=True)
    try:
        slow = fleet.boxes[1].base
        c = openai.OpenAI(base_url=fleet.url + "/v1", api_key=fleet.client_key, max_retries=0, timeout=120,
                          http_client=httpx.Client(verify=fleet.tls()))

        def ask(n: int, max_tokens: int = 24, box: openai.OpenAI | None = None) -> None:
            # A text of its own each time: cache_aware matches no prefix, so it picks by its trees and loads
            words = random.Random(n).choices(WORDS, k=40)
            (box or c).chat.completions.create(model=SMOL, max_tokens=max_tokens, temperature=0,
                                               messages=[{"role": "user", "content": " ".join(words)}])

        # Each box measured: two requests at a time on each, straight to its API with the fleet key (box 0's is its
        # Unix socket: its TCP listener is its loopback), until the gateway's poll of its map says its speed.
        direct = [openai.OpenAI(base_url="http://box0/v1", api_key=fleet.fleet_key, max_retries=0, timeout=120,
                                http_client=httpx.Client(transport=httpx.HTTPTransport(
                                    uds=str(fleet.workdir / "box0_api" / "http.sock")))),
                  openai.OpenAI(base_url=slow + "/v1", api_key=fleet.fleet_key, max_retries=0, timeout=120)]
        seen: dict[int, float] = {}

        def keep_busy(i: int, lane: int) -> None:  # until the gateway has seen box i's speed (a second of work)
            for k in range(30):
                if i in seen:
                    return
                ask(1000 + 100 * i + 10 * lane + k, 32, direct[i])

        with ThreadPoolExecutor(max_workers=4) as pool:
            work = [pool.submit(keep_busy, i, lane) for i in (0, 1) for lane in (0, 1)]
            while not all(f.done() for f in work):
                for i, b in enumerate(fleet.state().get("boxes", [])):
                    if b.get("speeds", {}).get(SMOL):
                        seen[i] = max(seen.get(i, 0.0), b["speeds"][SMOL])
                time.sleep(0.2)
            for f in work:
                f.result()
        assert len(seen) == 2 and seen[0] > 2 * seen[1], seen
        assert until(lambda: routed_to(fleet) and slow not in routed_to(fleet), 15), fleet.state()["workers"]
        assert until(lambda: (slow, SMOL) not in fleet.registered(), 15), fleet.state()["registered"]

        # While the slow box is out, requests go to the fast one alone.
        before = box_metric(fleet, 1, "everycycle_requests_total")
        for m in range(4):
            ask(100 + m, max_tokens=8)
        assert box_metric(fleet, 1, "everycycle_requests_total") == before

        # The fast box full (2 sequences, a queue): the slow one is let in while it lasts, then out again.
        with ThreadPoolExecutor(max_workers=10) as pool:
            load = [pool.submit(ask, 200 + m, 48) for m in range(10)]
            spilled = until(lambda: slow in routed_to(fleet), 30)
            for f in load:
                f.result()
        assert spilled, "the slow box was never let in while the fast one was full"
        assert until(lambda: slow not in routed_to(fleet), 20), "the slow box stayed in after the load"

        status = subprocess.run(everycycle("fleet", "status", "--state", str(fleet.state_file)),
                                capture_output=True, text=True, timeout=30)
        assert status.returncode == 0, status.stderr
        assert "(cache_aware, by speed)" in status.stdout and "prefill speed:" in status.stdout, status.stdout
        assert f"{SMOL} -> http://127.0.0.1:8081" in status.stdout, status.stdout
    finally:
        fleet.stop()
