"""Prometheus text for metric families, written by prometheus_client: how the engine and the BMC agent turn
the figures they read when /metrics is asked for into its answer."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric


class _Collector:
    def __init__(self, families: Callable[[], Iterable[Metric]]):
        self.collect = families


def exposition(families: Callable[[], Iterable[Metric]]) -> str:
    """The text of what families() returns, called once, now."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(families))
    return generate_latest(registry).decode()


def up_text(up: bool) -> str:
    """`everycycle_up`: whether the serving API reached its engine."""
    from prometheus_client.core import GaugeMetricFamily

    def families():
        yield GaugeMetricFamily("everycycle_up", "1 when the serving API reaches its inference engine.",
                                value=1 if up else 0)

    return exposition(families)


def merge(texts: list[str]) -> str:
    """Several engines' Prometheus texts as one (each family once; a sample repeated with the same labels, such
    as an engine's fixed gauges, is kept once), parsed and written by prometheus_client."""
    from prometheus_client.parser import text_string_to_metric_families

    families: dict[str, Metric] = {}
    seen: set = set()
    for text in texts:
        for family in text_string_to_metric_families(text):
            merged = families.setdefault(family.name, Metric(family.name, family.documentation, family.type,
                                                             family.unit))
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key not in seen:
                    seen.add(key)
                    merged.samples.append(sample)
    return exposition(lambda: list(families.values()))
