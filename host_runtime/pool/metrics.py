"""The engine pool's Prometheus families (pure, from EnginePool.snapshot()): which models are loaded and how much
memory each holds, how often each was loaded and unloaded (and why), and the bundle's first-boot pull."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from host_runtime.common.prometheus_text import exposition

PULL_STATES = ("pending", "pulling", "retrying", "pulled", "failed")
UNLOAD_REASONS = ("room", "keep_alive", "removed", "exited", "stopping")


def pool_families(snapshot: dict):
    loaded = GaugeMetricFamily("everycycle_model_loaded", "1 for each model with an engine (loading or ready).",
                               labels=["model"])
    memory = GaugeMetricFamily("everycycle_model_memory_bytes",
                               "Memory of each loaded model: planned (room it was given) and resident (its engine's "
                               "RSS).", labels=["model", "kind"])
    for model, figures in sorted(snapshot["memory"].items()):
        loaded.add_metric([model], 1)
        for kind in ("planned", "resident"):
            if figures.get(kind) is not None:
                memory.add_metric([model, kind], figures[kind])
    yield loaded
    yield memory
    yield GaugeMetricFamily("everycycle_models_memory_budget_bytes", "Memory the loaded models may hold together.",
                            value=snapshot["budget"])
    loads = CounterMetricFamily("everycycle_model_loads", "Engines started for each model.", labels=["model"])
    for model, n in sorted(snapshot["loads"].items()):
        loads.add_metric([model], n)
    yield loads
    unloads = CounterMetricFamily("everycycle_model_unloads",
                                  "Engines stopped for each model, by reason (room, keep_alive, removed, exited, "
                                  "stopping).", labels=["model", "reason"])
    counted = {(model, reason): n for model, reason, n in snapshot["unloads"]}
    # Every model ever loaded has each reason's series from 0 (Prometheus' advice: a rate needs its start).
    for model in snapshot["loads"]:
        for reason in UNLOAD_REASONS:
            counted.setdefault((model, reason), 0)
    for (model, reason), n in sorted(counted.items()):
        unloads.add_metric([model, reason], n)
    yield unloads
    pull = snapshot.get("pull")
    if pull is not None:
        state = GaugeMetricFamily("everycycle_model_pull_state", "The bundle's model pull: 1 for its state.",
                                  labels=["model", "state"])
        for name in PULL_STATES:
            state.add_metric([pull.name, name], 1 if pull.state == name else 0)
        yield state
        done = GaugeMetricFamily("everycycle_model_pull_bytes", "Bytes of the bundle's model pulled so far.",
                                 labels=["model"])
        done.add_metric([pull.name], pull.done_bytes)
        yield done
        if pull.total_bytes:
            total = GaugeMetricFamily("everycycle_model_pull_size_bytes", "Size of the bundle's model.",
                                      labels=["model"])
            total.add_metric([pull.name], pull.total_bytes)
            yield total
        rate = GaugeMetricFamily("everycycle_model_pull_rate_bytes", "Bytes per second of the pull.", labels=["model"])
        rate.add_metric([pull.name], pull.rate_bytes_s)
        yield rate


def pool_text(snapshot: dict) -> str:
    return exposition(lambda: list(pool_families(snapshot)))
