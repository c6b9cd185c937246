"""The fleet gateway's service (I/O): starts the router, then polls every box's capability map and keeps the
router's worker set equal to the controller's decision (controller.py). supervisord runs it on the box whose
box.toml says [fleet] role = "gateway"; the router is its child and ends with it."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets
import shutil
import ssl
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from host_runtime.common.errors import EveryCycleError
from host_runtime.common.atomic_file import atomic_write
from host_runtime.fleet import router_process
from host_runtime.fleet.controller import (BoxHealth, Decision, Speeds, changes, decide, merge_peers, vouches,
                                           vouching_reason)
from host_runtime.fleet.peers import peer_client, poll_all, tls_context, unverified_certificate
from host_runtime.fleet.router_api import RouterAPI, RouterUnavailable
from host_runtime.fleet.settings import FleetSettings
from host_runtime.fleet.state import GatewayState, box_state, vouched_use

log = logging.getLogger("everycycle.fleet")

ROUTER_START_S = 30.0
PENDING_S = 10.0  # an add the router has queued but not yet listed is not asked again for this long


class GatewayError(EveryCycleError):
    """The gateway cannot run; says why."""


class Gateway:
    def __init__(self, settings: FleetSettings, key: str, vocab_dir: Path, state_file: Path | None = None,
                 browser=None):
        self.settings = settings
        self.browser = browser   # mdns.PeerBrowser when fleet.toml says mdns = true
        self._untrusted_logged = False
        self.key = key
        self.vocab_dir = vocab_dir
        self.state_file = state_file
        # The router's control-plane key: made here, for this run of the router, and known to this process alone.
        self.admin_key = secrets.token_urlsafe(32)
        self.api = RouterAPI(f"http://127.0.0.1:{settings.router_port}", admin_key=self.admin_key)
        self.health = BoxHealth()
        self.speeds = Speeds() if settings.route_by_speed else None  # None: the router's policy alone
        self.vouching: bool | None = None  # whether the router's workers go without the fleet key (vouches())
        self.decision: Decision | None = None
        self._pending: dict[str, float] = {}
        self._router: subprocess.Popen | None = None
        self._trust_dir: Path | None = None
        try:
            self.tls = tls_context(settings.peer_certificates)
        except (OSError, ssl.SSLError) as exc:
            raise GatewayError(f"peer_certificates: {exc}") from None
        self.peer_http = peer_client(self.tls)  # polled every few seconds: kept connections

    def start_router(self) -> None:
        bundle = self._write_trust_bundle() if self.settings.peer_certificates else None
        self._router = subprocess.Popen(router_process.argv(self.settings),
                                        env=router_process.environment(dict(os.environ), self.vocab_dir, bundle,
                                                                       self.admin_key))
        deadline = time.monotonic() + ROUTER_START_S
        while not self.api.alive():
            if self._router.poll() is not None:
                raise GatewayError(f"the router exited at start (status {self._router.returncode}); see its log above")
            if time.monotonic() > deadline:
                raise GatewayError(f"the router did not answer on port {self.settings.router_port} "
                                   f"within {ROUTER_START_S:.0f} s")
            time.sleep(0.2)
        log.info("router (sglang-router, policy %s) on 127.0.0.1:%d; %d boxes to poll",
                 self.settings.policy, self.settings.router_port, len(self.settings.peers))

    def _write_trust_bundle(self) -> Path:
        peers = [Path(p).read_bytes() for p in self.settings.peer_certificates]
        if self._trust_dir is not None:   # a restarted router: the last bundle goes
            shutil.rmtree(self._trust_dir, ignore_errors=True)
        self._trust_dir = Path(tempfile.mkdtemp(prefix="everycycle-fleet-"))
        bundle = self._trust_dir / "trust.pem"
        atomic_write(bundle, router_process.trust_bundle(peers), 0o644)
        return bundle

    def router_exited(self) -> int | None:
        return None if self._router is None else self._router.poll()

    def stop_router(self) -> None:
        if self._router is not None and self._router.poll() is None:
            self._router.terminate()
            try:
                self._router.wait(10)
            except subprocess.TimeoutExpired:
                self._router.kill()
                self._router.wait()
        if self._trust_dir is not None:
            shutil.rmtree(self._trust_dir, ignore_errors=True)
            self._trust_dir = None

    def trusted_found(self) -> tuple[str, ...]:
        """The boxes mDNS found that may be polled: only where fleet.toml's peer_certificates can vouch for them
        (a poll carries the fleet key, and a box polled well gets clients' prompts); without them none is, and
        `everycycle fleet peers` lists them as found, untrusted (#56, item 9: any announcement was polled)."""
        if not self.browser:
            return ()
        found = self.browser.peers()
        if found and not self.settings.peer_certificates and not self._untrusted_logged:
            self._untrusted_logged = True
            log.warning("mDNS found %d box(es) (%s); none is polled: a box found on the LAN is trusted only as far "
                        "as fleet.toml's peer_certificates vouch for it", len(found), ", ".join(found))
        return found if self.settings.peer_certificates else ()

    def step(self, pool: ThreadPoolExecutor) -> None:
        """One poll of every box, and the router brought in line with what it says."""
        timeout = max(0.5, min(2.0, 2 * self.settings.poll_interval_s))
        peers = merge_peers(self.settings.peers, self.trusted_found())
        reports = poll_all(peers, self.key, timeout, pool, self.peer_http)
        if self.browser:
            for r in reports:
                if r.caps is None:
                    self.browser.unanswered(r.box)
                    if r.box not in self.settings.peers and unverified_certificate(r.why):
                        self.browser.unverified(r.box)
        decision = decide(reports, self.health, self.decision, self.speeds, time.monotonic())
        for box, why in decision.left_out.items():
            if self.decision is None or self.decision.left_out.get(box) != why:
                log.warning("box %s takes no work: %s", box, why)
        self.decision = decision
        registered = self.api.workers()
        vouching = vouches(self.settings, reports)
        if vouching != self.vouching:
            # Every worker again, with the fleet key or without: the router sends the client's header and adds a
            # worker's key beside it, and a box's front refuses two (400), so the front's voucher and a worker's
            # key never meet. The router has no worker for a poll; the state file says the mode once it holds.
            for r in registered:
                self.api.remove(r)
            self._pending.clear()
            registered = []
            decision = dataclasses.replace(decision, workers={})  # added at the next poll, once the state says so
            log.warning("the gateway %s vouch for clients' keys: %s", "now does" if vouching else "does not",
                        "every box checks its vouchers" if vouching else vouching_reason(self.settings, reports))
            self.vouching = vouching
        add, remove = changes(decision, registered)
        now = time.monotonic()
        for r in remove:
            self.api.remove(r)
            self._pending.pop(r.url, None)
            log.info("removed worker %s (%s)", r.url, r.model_id)
        for w in add:
            if now - self._pending.get(w.url, -PENDING_S) < PENDING_S:
                continue
            self.api.add(w, None if self.vouching else self.key)
            self._pending[w.url] = now
            log.info("added worker %s (%s)", w.url, w.model_id)
        listed = {r.url for r in registered}
        self._pending = {u: t for u, t in self._pending.items() if u not in listed and now - t < PENDING_S}
        self._write_state(reports, registered)

    def _write_state(self, reports, registered) -> None:
        if self.state_file is None:
            return
        state = GatewayState(time.time(), self.settings.policy + (", by speed" if self.speeds is not None else ""),
                             tuple(box_state(r, self.decision.left_out.get(r.box, "")) for r in reports),
                             tuple(self.decision.workers.values()), tuple(registered), vouched_use(reports),
                             bool(self.vouching))
        atomic_write(self.state_file, json.dumps(state.to_json(), indent=1).encode(), 0o644)

    def run(self, stop: threading.Event) -> int:
        self.start_router()
        try:
            # one thread per box so that a hung box costs one timeout; peers found by mDNS may come later
            with ThreadPoolExecutor(max_workers=max(len(self.settings.peers), 16 if self.browser else 1)) as pool:
                while not stop.is_set():
                    started = time.monotonic()
                    if self.router_exited() is not None:
                        log.error("the router exited (status %s)", self.router_exited())
                        return 1
                    try:
                        self.step(pool)
                    except RouterUnavailable as exc:
                        log.warning("router control: %s", exc)
                    stop.wait(max(0.0, self.settings.poll_interval_s - (time.monotonic() - started)))
        finally:
            self.stop_router()
        return 0
