"""The box-status client: what the console's dashboard and `everycycle status` show, read from what the services
publish; never from hardware, never blocking.

One `StatusReader.read()` per refresh tick reads every source once, each with a bounded
timeout; a source that does not answer is reported as down with the reason.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from host_runtime import __version__
from host_runtime.auth.keystore import KeyStoreError, load_keys
from host_runtime.box_status.rows import BoxStatus, Serving, Source, models_from_metrics, top_users
from host_runtime.common.status_sources import serving_get, supervisor_programs
from host_runtime.common import http_client
from host_runtime.common.run_layout import governor_state_file, supervisor_socket, topology_file
from host_runtime.common.prometheus_text import histogram_quantile, metric_samples, parse_prometheus
from host_runtime.front.tls import fingerprint
from host_runtime.front.trust import TrustAnchor
from host_runtime.governor.state_file import read_state
from host_runtime.update.system import UpdatePaths, status

TIMEOUT_S = 1.0
SERVING_TIMEOUT_S = 2.0   # /health and /metrics: cheap even under load
READY_EVERY_S = 10.0      # /ready runs a real canary: ask it now and then, not every tick
READY_TIMEOUT_S = 5.0


@dataclass
class StatusConfig:
    """Where the status reader looks (the run directory, the API, the BMC agent, the key file) and what the box
    tells clients (its API address, scheme, certificate). The console reads the box through it today; it belongs
    to the UI-free layer, so that any other reader can (hence not ConsoleConfig, its old name)."""
    run_dir: Path
    serving_url: str = "http://127.0.0.1:8080"
    serving_socket: Path | None = None  # the API's own Unix socket: read there (no key, no front) when set
    bmc_url: str | None = "http://127.0.0.1:9290/telemetry"
    keys_file: Path | None = None
    api_port: int = 8080
    api_scheme: str = "http"
    api_listen: str = "0.0.0.0"  # the front's address: a specific one is the only URL shown
    tls_certificate: Path | None = None  # what clients trust (the local CA's): its fingerprint is shown
    tls_anchor: TrustAnchor | None = None  # where clients fetch it (front/trust.py)
    lan_name: str | None = None  # NAME.local, announced by mDNS: shown beside the addresses
    box_name: str | None = None
    provision_root: Path = Path("/")          # what the wizard configures ("/" on the box)
    new_keys_file: Path | None = None  # first boot's generated keys, shown once (host_runtime/auth/new_keys.py)
    bundle_dir: Path = Path("/efi/everycycle")  # where the wizard writes its bundle: the ESP, which gpt-auto mounts at /efi
    model_store: Path | None = None       # the models screen's store (None: the models screen says there is none)
    serving_settings: Path | None = None  # serving.toml, whose model the models screen changes


class StatusReader:
    def __init__(self, config: StatusConfig):
        self.config = config
        self._last_tokens: tuple[float, float] | None = None
        self._last_model_tokens: dict[str, tuple[float, float]] = {}  # model -> (when, tokens)
        self._history: list[float] = []
        self._last_services: dict[str, str] = {}
        self._ready: tuple[bool, str] = (False, "not checked yet")
        self._ready_at = 0.0
        self._service_events: list[dict] = []
        self._fingerprint: tuple[int | None, str | None] = (None, None)  # (certificate mtime, its fingerprint)

    # ---- sources ------------------------------------------------------------------

    def _serving_get(self, path: str, timeout: float) -> tuple[int, bytes]:
        answer = serving_get(path, timeout, socket=self.config.serving_socket, url=self.config.serving_url)
        return answer.status, answer.body

    def _serving_ok(self, path: str, timeout: float) -> bytes:
        status, body = self._serving_get(path, timeout)
        if status >= 400:
            raise OSError(f"HTTP {status} on {path}")
        return body

    def serving(self) -> Serving:
        try:
            health = json.loads(self._serving_ok("/health", SERVING_TIMEOUT_S))
            metrics_text = self._serving_ok("/metrics", SERVING_TIMEOUT_S).decode()
            metrics = parse_prometheus(metrics_text)
        except (OSError, ValueError) as exc:
            self._ready_at = 0.0
            return Serving(Source(False, f"not answering: {exc}"))
        if health.get("engine") not in ("ready", "unreachable"):
            # Loading (with its progress) or failed: /health says so on every tick; /ready follows once loaded.
            self._ready, self._ready_at = (False, health.get("engine_detail") or health.get("engine", "")), 0.0
        elif time.monotonic() - self._ready_at >= READY_EVERY_S:
            try:
                status, body = self._serving_get("/ready", READY_TIMEOUT_S)
                self._ready = (status == 200, json.loads(body).get("reason", ""))
            except (OSError, ValueError):
                self._ready = (self._ready[0], f"readiness check timed out (engine {health.get('engine')}, busy?)")
            self._ready_at = time.monotonic()
        model = next((labels.get("model") for labels, _ in metric_samples(metrics_text, "everycycle_model_info")), None)
        tokens = metrics.get("everycycle_tokens_predicted_total", 0.0)
        now = time.monotonic()
        rate = None
        if self._last_tokens is not None and now > self._last_tokens[0]:
            rate = max(0.0, (tokens - self._last_tokens[1]) / (now - self._last_tokens[0]))
            self._history = (self._history + [rate])[-120:]
        self._last_tokens = (now, tokens)
        hits = sum(v for k, v in metrics.items() if k.startswith("everycycle_prefix_cache_hit_ratio{"))
        backend = next((labels for labels, _ in metric_samples(metrics_text, "everycycle_backend_info")), {})
        layers = {labels.get("device", "?"): int(v) for labels, v in metric_samples(metrics_text, "everycycle_model_layers")}
        models, pull = models_from_metrics(metrics_text, now, self._last_model_tokens)
        return Serving(Source(True, "answering"), ready=self._ready[0], ready_reason=self._ready[1],
                       model=model, running=metrics.get("everycycle_requests_processing", 0),
                       waiting=metrics.get("everycycle_requests_deferred", 0), tokens_total=tokens,
                       tokens_per_s=rate, ttft_p50_s=histogram_quantile(metrics, "everycycle_time_to_first_token_seconds", 0.5),
                       prefix_hit_ratio=hits if any(k.startswith("everycycle_prefix_cache_lookups_total") for k in metrics) else None,
                       backend=backend, layers=layers, models=models, pull=pull, top_users=top_users(metrics_text))

    def topology(self) -> dict | None:
        try:
            return json.loads(topology_file(self.config.run_dir).read_text())
        except (OSError, ValueError):
            return None

    def api_urls(self, topo: dict | None) -> list[str]:
        port = self.config.api_port
        if self.config.api_listen not in ("0.0.0.0", "::"):
            host = self.config.api_listen if ":" not in self.config.api_listen else f"[{self.config.api_listen}]"
            return [f"{self.config.api_scheme}://{host}:{port}/v1"]
        urls = []
        for link in (topo or {}).get("network") or []:
            if link.get("kind") == "loopback" or not isinstance(link.get("addresses"), list):
                continue
            for a in link["addresses"]:
                if a.get("scope") == "global":
                    host = a["address"] if a["family"] == "ipv4" else f"[{a['address']}]"
                    urls.append(f"{self.config.api_scheme}://{host}:{port}/v1")
        if urls and self.config.lan_name:  # the name outlives a DHCP lease; the address works without mDNS
            urls.append(f"{self.config.api_scheme}://{self.config.lan_name}:{port}/v1")
        return urls or [f"{self.config.api_scheme}://127.0.0.1:{port}/v1"]

    def governor(self) -> tuple[Source, list[dict], int | None, list[dict]]:
        state = read_state(governor_state_file(self.config.run_dir))
        if state.doc is None:
            return Source(False, state.reason), [], None, []
        if not state.fresh:
            return Source(False, state.reason), state.get("gpus", []), None, state.get("events", [])
        return Source(True, f"{state.get('backend')} backend, {state.get('mode')} mode"), state.get("gpus", []), \
            state.get("throttle_level"), state.get("events", [])

    def bmc(self) -> tuple[Source, list[dict], list[dict]]:
        if not self.config.bmc_url:
            return Source(False, "no BMC agent configured"), [], []
        try:
            snap = http_client.get(self.config.bmc_url, timeout=TIMEOUT_S).raise_for_status().json()
        except (OSError, ValueError) as exc:
            return Source(False, f"the BMC agent is not answering: {exc}"), [], []
        state = snap.get("state")
        if state == "none_found":
            return Source(True, "no BMC (hwmon found no sensors)"), [], []
        source = Source(not snap.get("stale"), f"{snap.get('backend')}: {state}" + (" (stale)" if snap.get("stale") else ""))
        return source, snap.get("sensors", []), snap.get("events", [])

    def services(self) -> tuple[Source, dict[str, str]]:
        sock = supervisor_socket(self.config.run_dir)
        try:
            states = supervisor_programs(sock)
        except Exception as exc:  # xmlrpc and socket errors both mean "not answering"
            return Source(False, f"supervisord not answering at {sock}: {exc}"), {}
        for name, state in states.items():
            before = self._last_services.get(name)
            if before is not None and before != state:
                self._service_events.insert(0, {"at": time.strftime("%H:%M:%S"), "source": "service",
                                                "detail": f"{name}: {before} -> {state}"})
        self._last_services = states
        del self._service_events[50:]
        return Source(True, "answering"), states

    # ---- one tick -------------------------------------------------------------------

    def read(self) -> BoxStatus:
        topo = self.topology()
        serving = self.serving()
        gov_source, gpus, throttle, gov_events = self.governor()
        bmc_source, chassis, sel = self.bmc()
        sup_source, services = self.services()
        record = self.provisioned() or {}
        provision_events = [{"at": h.get("applied_at", ""), "source": "provision",
                             "detail": f"applied bundle {h.get('digest', '')[:12]} ({h.get('hostname')})"}
                            for h in record.get("history", [])[-5:]]
        events = provision_events + ([{"at": e.get("at", ""), "source": "governor", "detail": f"{e.get('gpu') or ''} {e.get('detail', '')}".strip()}
                   for e in gov_events[:20]] +
                  [{"at": e.get("timestamp", ""), "source": "bmc", "detail": f"{e.get('component')}: {e.get('event')}"}
                   for e in sel[:20]] + self._service_events[:20])
        system = self.system()
        last = system.get("last_update")
        if last:
            events.append({"at": last.get("updated_at", ""), "source": "update",
                           "detail": f"{last.get('target')}: {last.get('phase')}: {last.get('reason')}"})
        events.sort(key=lambda e: str(e["at"]), reverse=True)
        return BoxStatus(
            box_name=self.config.box_name or ((topo or {}).get("host") or {}).get("hostname") or "everycycle",
            version=__version__, uptime_s=time.time() - psutil.boot_time(), api_urls=self.api_urls(topo),
            serving=serving, gpus=gpus, governor=gov_source, throttle_level=throttle, chassis=chassis,
            bmc=bmc_source, services=services, supervisor=sup_source, cpu_percent=psutil.cpu_percent(interval=None),
            ram_used_percent=psutil.virtual_memory().percent, events=events[:30], token_history=list(self._history),
            tls_fingerprint=self.tls_fingerprint(), system=system)

    def system(self) -> dict:
        """The running image's version and slot and the last update (no boot entries: that would mount the ESP)."""
        return status(UpdatePaths(state=self.config.provision_root / "var/lib/everycycle/update"), with_entries=False)

    def tls_fingerprint(self) -> str | None:
        """The front's certificate's fingerprint, parsed again only when the file changes (reads run every tick)."""
        if self.config.tls_certificate is None:
            return None

        try:
            stamp = self.config.tls_certificate.stat().st_mtime_ns
            if self._fingerprint[0] != stamp:
                self._fingerprint = (stamp, fingerprint(self.config.tls_certificate))
            return self._fingerprint[1]
        except (OSError, ValueError) as exc:
            return f"unavailable ({exc.__class__.__name__}: the front makes its certificate when it first starts)"

    def provisioned(self) -> dict | None:
        try:
            return json.loads((self.config.provision_root / "var/lib/everycycle/provisioned.json").read_text())
        except (OSError, ValueError):
            return None

    def key_hint(self) -> str:
        """Never the key: its name and hint, as stored."""
        if not self.config.keys_file:
            return "no API key file configured: the API is open"

        try:
            keys = load_keys(self.config.keys_file)
        except KeyStoreError as exc:
            return str(exc)
        return ", ".join(f"{k.name}: {k.hint}" for k in keys) or "no keys yet"


