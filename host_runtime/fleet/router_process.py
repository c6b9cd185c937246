"""How the fleet's router is started (pure): sglang-router (the SGLang Model Gateway's Python package, a Rust
router) in IGW mode, so that it routes by the model a request names, bound to loopback: the gateway box's front
(nginx) checks clients' keys and forwards to it. Its workers come from the controller, never from argv."""

from __future__ import annotations

import sys
from pathlib import Path

from host_runtime.fleet.settings import FleetSettings

HEALTH_INTERVAL_S = 2    # the router's own probe of each worker's /health, beside the controller's polls
HEALTH_FAILURES = 2


def argv(settings: FleetSettings) -> list[str]:
    return [sys.executable, "-m", "sglang_router.launch_router",
            "--host", "127.0.0.1", "--port", str(settings.router_port),
            "--enable-igw", "--policy", settings.policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(settings.metrics_port),
            "--health-check-endpoint", "/health",
            "--health-check-interval-secs", str(HEALTH_INTERVAL_S),
            "--health-failure-threshold", str(HEALTH_FAILURES),
            "--health-check-timeout-secs", "2",
            "--request-timeout-secs", "900",   # a long generation without streaming, as the front allows
            "--log-level", "warn",
            # https:// peers are verified (an unknown certificate: the worker never registers)
            *(["--ca-cert-paths", *settings.peer_certificates] if settings.peer_certificates else [])]


def environment(base: dict[str, str], vocab_dir: Path) -> dict[str, str]:
    # See router_vocab.py; HF_HUB_OFFLINE: the router would look for tokenizers on the hub, which HTTP mode
    # never needs.
    return {**base, "TIKTOKEN_ENCODINGS_BASE": str(vocab_dir), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
