"""The box-status client's typed rows, and the ones built from the serving API's /metrics (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field

from host_runtime.common.prometheus_text import metric_samples


@dataclass
class Source:
    ok: bool
    detail: str = ""


@dataclass
class ModelRow:
    """A loaded model: the memory it was given and holds, and its generation rate since the last read."""
    name: str
    planned_bytes: float | None = None
    resident_bytes: float | None = None
    tokens_per_s: float | None = None


@dataclass
class ModelPull:
    """The bundle's model being pulled at first boot."""
    name: str
    state: str
    done_bytes: float = 0
    total_bytes: float | None = None
    rate_bytes_s: float = 0


@dataclass
class Serving:
    source: Source
    ready: bool = False
    ready_reason: str = ""
    model: str | None = None
    running: float = 0
    waiting: float = 0
    tokens_total: float = 0
    tokens_per_s: float | None = None
    ttft_p50_s: float | None = None
    prefix_hit_ratio: float | None = None
    backend: dict[str, str] = field(default_factory=dict)   # backend, device, reason (everycycle_backend_info)
    layers: dict[str, int] = field(default_factory=dict)    # device -> model layers placed there
    models: list[ModelRow] = field(default_factory=list)    # every loaded model (the pool's)
    pull: ModelPull | None = None
    top_users: list[tuple[str, float, float]] = field(default_factory=list)  # (key name, requests, generated)


@dataclass
class BoxStatus:
    box_name: str
    version: str
    uptime_s: float
    api_urls: list[str]
    serving: Serving
    gpus: list[dict]
    governor: Source
    throttle_level: int | None
    chassis: list[dict]
    bmc: Source
    services: dict[str, str]
    supervisor: Source
    cpu_percent: float
    ram_used_percent: float
    events: list[dict] = field(default_factory=list)
    token_history: list[float] = field(default_factory=list)
    tls_fingerprint: str | None = None
    system: dict = field(default_factory=dict)  # host_runtime.update.system.status: version, slot, last update


TOP_USERS = 3


def top_users(metrics_text: str) -> list[tuple[str, float, float]]:
    """The keys that generated most (every model's engine summed), from /metrics' per-key usage: (name, requests,
    generated tokens), at most TOP_USERS."""
    usage: dict[str, list[float]] = {}
    for name, column in (("everycycle_key_requests_total", 0), ("everycycle_key_generated_tokens_total", 1)):
        for labels, value in metric_samples(metrics_text, name):
            if "key" in labels:
                usage.setdefault(labels["key"], [0.0, 0.0])[column] += value
    ranked = sorted(usage.items(), key=lambda kv: (-kv[1][1], -kv[1][0], kv[0]))
    return [(key, requests, generated) for key, (requests, generated) in ranked[:TOP_USERS]]


def models_from_metrics(metrics_text: str, now: float, last_tokens: dict[str, tuple[float, float]]
                        ) -> tuple[list[ModelRow], ModelPull | None]:
    """The loaded models (memory, and tok/s since the reading kept in last_tokens, which is updated) and the
    bundle's pull, from the serving API's /metrics."""
    rows: dict[str, ModelRow] = {}
    for labels, _ in metric_samples(metrics_text, "everycycle_model_loaded"):
        rows[labels.get("model", "?")] = ModelRow(labels.get("model", "?"))
    for labels, value in metric_samples(metrics_text, "everycycle_model_memory_bytes"):
        row = rows.get(labels.get("model"))
        if row is not None and labels.get("kind") in ("planned", "resident"):
            setattr(row, f"{labels['kind']}_bytes", value)
    for labels, tokens in metric_samples(metrics_text, "everycycle_tokens_predicted_total"):
        row = rows.get(labels.get("model"))
        if row is None:
            continue
        last = last_tokens.get(row.name)
        if last is not None and now > last[0]:
            row.tokens_per_s = max(0.0, (tokens - last[1]) / (now - last[0]))
        last_tokens[row.name] = (now, tokens)
    pull = None
    for labels, value in metric_samples(metrics_text, "everycycle_model_pull_state"):
        if value:
            pull = ModelPull(labels.get("model", "?"), labels.get("state", "?"))
    if pull is not None:
        for name, attr in (("everycycle_model_pull_bytes", "done_bytes"),
                           ("everycycle_model_pull_size_bytes", "total_bytes"),
                           ("everycycle_model_pull_rate_bytes", "rate_bytes_s")):
            for _, value in metric_samples(metrics_text, name):
                setattr(pull, attr, value)
    return list(rows.values()), pull
