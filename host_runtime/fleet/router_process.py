"""How the fleet's router is started (pure): sglang-router (the SGLang Model Gateway's Python package, a Rust
router) in IGW mode, so that it routes by the model a request names, bound to loopback: the gateway box's front
(nginx) checks clients' keys and forwards to it. Its workers come from the controller, never from argv."""

from __future__ import annotations

import sys
from pathlib import Path

from host_runtime.fleet.settings import FleetSettings

HEALTH_INTERVAL_S = 2    # the router's own probe of each worker's /health, beside the controller's polls
HEALTH_FAILURES = 2
# A box answers a full queue with 503 and Retry-After: 2 (engine.py). That is backpressure, not a fault: the
# router retries it, backing off to about the box's hint (0.5 s, then x1.5 up to 3 s: about 16 s in all), and
# never counts it toward taking the box out. The router's circuit breaker would count it (10 in 120 s opens the
# circuit for 60 s), and for a model on one box that turns a busy minute into an outage; a box that is really
# gone is the controller's and the health check's to remove, within seconds.
RETRIES = 8
RETRY_FIRST_MS = 500
RETRY_MAX_MS = 3000
# cache_aware keeps a conversation on the box that holds its prefix until the boxes' loads differ by this many
# requests (and by 1.5x); the router's default, 64, is several times what a box admits (4-16 sequences, 4 waiting
# per sequence), so one box's queue would fill while another idles.
BALANCE_ABS_THRESHOLD = 8
# The router's control-plane key (admin role) travels in this variable, never in argv (router_main.py says why).
ADMIN_KEY_ENV = "EVERYCYCLE_ROUTER_ADMIN_KEY"


def control_plane_key_arg(key: str) -> list[str]:
    """sglang-router's control-plane key, as id:name:role:key."""
    if ":" in key or not key:
        raise ValueError("the router's control-plane key must be non-empty and hold no ':'")
    return ["--control-plane-api-keys", f"everycycle-gateway:fleet gateway:admin:{key}"]


def argv(settings: FleetSettings) -> list[str]:
    return [sys.executable, "-m", "host_runtime.fleet.router_main",
            "--host", "127.0.0.1", "--port", str(settings.router_port),
            "--enable-igw", "--policy", settings.policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(settings.metrics_port),
            "--health-check-endpoint", "/health",
            "--health-check-interval-secs", str(HEALTH_INTERVAL_S),
            "--health-failure-threshold", str(HEALTH_FAILURES),
            "--health-check-timeout-secs", "2",
            "--request-timeout-secs", "900",   # a long generation without streaming, as the front allows
            "--retry-max-retries", str(RETRIES), "--retry-initial-backoff-ms", str(RETRY_FIRST_MS),
            "--retry-max-backoff-ms", str(RETRY_MAX_MS), "--retry-backoff-multiplier", "1.5",
            "--disable-circuit-breaker",
            *(["--balance-abs-threshold", str(BALANCE_ABS_THRESHOLD)] if settings.policy == "cache_aware" else []),
            "--log-level", "warn",
            # https:// peers are verified (an unknown certificate: the worker never registers)
            *(["--ca-cert-paths", *settings.peer_certificates] if settings.peer_certificates else [])]


def environment(base: dict[str, str], vocab_dir: Path, trust_bundle: Path | None = None,
                admin_key: str | None = None) -> dict[str, str]:
    # See router_vocab.py; HF_HUB_OFFLINE: the router would look for tokenizers on the hub, which HTTP mode
    # never needs.
    env = {**base, "TIKTOKEN_ENCODINGS_BASE": str(vocab_dir), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
    if admin_key is not None:
        env[ADMIN_KEY_ENV] = admin_key
    if trust_bundle is not None:
        # The router's health checks use a second HTTP client (OpenSSL's, not the rustls one --ca-cert-paths
        # configures): measured here, it refused a member's self-signed certificate and marked the worker
        # unhealthy while requests to it succeeded. OpenSSL reads its trust from SSL_CERT_FILE.
        env["SSL_CERT_FILE"] = str(trust_bundle)
    return env


def trust_bundle(peer_certificates: list[bytes]) -> bytes:
    """What SSL_CERT_FILE holds for the router where fleet.toml names peer certificates: those alone. The router
    sends the fleet key to every peer, so a peer named by DNS must not be anyone a public CA vouches for (the
    gateway's own polls trust the same, peers.tls_context)."""
    return b"".join(p if p.endswith(b"\n") else p + b"\n" for p in peer_certificates if p)