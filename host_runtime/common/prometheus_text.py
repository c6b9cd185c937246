"""Prometheus text, written and read by prometheus_client: how the engine and the BMC agent turn the figures
they read when /metrics is asked for into its answer, and how its readers (the box-status client, the boot
check, the benchmarks) read it back: samples by name and labels, histogram quantiles."""

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


# ---- reading it back ----

def parse_prometheus(text: str, ignore_labels: tuple[str, ...] = ("model",)) -> dict[str, float]:
    """Every sample by its name and labels as written (`name{k="v"}`), parsed by prometheus_client; none if the
    text is malformed. The `model` label is left out of the key: one box's engine serves one model."""
    from prometheus_client.parser import text_string_to_metric_families

    def key(sample) -> str:
        labels = {k: v for k, v in sample.labels.items() if k not in ignore_labels}
        return sample.name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")

    try:
        return {key(s): s.value for family in text_string_to_metric_families(text) for s in family.samples}
    except ValueError:
        return {}


def metric_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of `name` as (labels, value), parsed by prometheus_client; none if the text is malformed."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return [(dict(s.labels), s.value) for family in text_string_to_metric_families(text)
                for s in family.samples if s.name == name]
    except ValueError:
        return []


def histogram_quantile(metrics: dict[str, float], name: str, q: float) -> float | None:
    """The q-quantile's bucket bound from a cumulative histogram (upper bound, as Prometheus does)."""
    buckets = sorted(((float(k.split('le="')[1].rstrip('"}')), v) for k, v in metrics.items()
                      if k.startswith(name + "_bucket{") and "+Inf" not in k))
    total = metrics.get(name + "_count", 0)
    if not total:
        return None
    for bound, count in buckets:
        if count >= q * total:
            return bound
    return None
