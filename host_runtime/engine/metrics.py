"""Engine metrics (pure): counters, gauges and histograms, written as Prometheus text by prometheus_client.

Names follow llama-server's `llamacpp:*` set with our `everycycle_` prefix. The engine keeps its figures under
one lock (the scheduler thread adds, the metrics request reads); a collector turns a consistent copy of them
into metric families when /metrics is asked for.
"""

from __future__ import annotations

import bisect
import statistics
import threading
import time
from collections import deque

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from host_runtime.common.prometheus_text import exposition

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
RECENT_S = 30  # the window of the capability map's recent tok/s
# The window of its speed (prompt tokens computed per second of the calls that computed them): what the fleet's
# controller routes by. Generated tokens per busy second, the figure before, read 0.5 to 34 on the fast box of the
# hetero fleet bench and 0.16 to 21 on a 0.3-CPU one within a run (a window spent on a long prompt read as a slow
# box), prompt and generated tokens together still 57 to 292 (a decode step costs several prompt tokens' time): the
# controller took the fast box out and let the slow one in. The prompt's rate, over 30 s (several of a 0.3-CPU
# box's prompt chunks): 103 to 142 and 28 to 52 over a run, what their CPU quotas say.
SPEED_WINDOW_S = 30
TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1

    def family(self, name: str, help_text: str, labels: dict[str, str] | None = None) -> HistogramMetricFamily:
        cumulative, buckets = 0, []
        for bound, count in zip(self.buckets, self.counts):
            cumulative += count
            buckets.append((repr(float(bound)), cumulative))
        buckets.append(("+Inf", self.n))
        if not labels:
            return HistogramMetricFamily(name, help_text, buckets=buckets, sum_value=self.total)
        family = HistogramMetricFamily(name, help_text, labels=list(labels))
        family.add_metric(list(labels.values()), buckets, self.total)
        return family


class EngineMetrics:
    COUNTERS = {
        "prompt_tokens_total": "Prompt tokens processed.",
        "tokens_predicted_total": "Generated tokens.",
        "requests_total": "Generation requests accepted.",
        "requests_cancelled_total": "Requests cancelled before finishing (client gone or timed out).",
        "requests_rejected_total": "Requests refused because the queue was full.",
        "n_decode_total": "llama_decode calls.",
        "n_busy_slots_total": "Sequences summed over decode calls (divide by n_decode_total for the mean batch).",
        "prompt_tokens_cached_total": "Prompt tokens not computed because the prefix cache had them.",
        "prompt_seconds_total": "Time spent in decode calls that carried prompt tokens.",
        "predicted_seconds_total": "Time spent in decode calls that carried only generated tokens.",
        "n_decode_generated_total": "llama_decode calls that carried only generated tokens.",
        "n_busy_slots_generated_total": "Sequences summed over the calls that carried only generated tokens.",
        "canaries_total": "Readiness canary generations finished (each is also in requests_total).",
        "requests_preempted_total": "Sequences parked (their KV saved) to free a slot for a higher priority class.",
        "requests_resumed_total": "Parked sequences restored to a slot, going on where they stopped.",
    }

    def __init__(self):
        self._lock = threading.Lock()
        self.counters = {name: 0.0 for name in self.COUNTERS}
        # Per API key name (never the key): requests, prompt tokens, of them cached, generated, errors.
        self.key_usage: dict[str, dict[str, float]] = {}
        self.on_key_used = None  # (key, counts) -> None: engine/usage_file.UsageBook.record, where usage is kept
        self.requests_processing = 0
        self.requests_deferred = 0
        self.kv_cells_used = 0
        self.kv_cells_total = 0
        self.cache: dict = {}
        self.throttle_level = 0
        self.sequences_allowed = 0
        self.canary_seconds = 0.0
        self.cpu_threads = 0
        # Parked sequences' KV by where it waits: the engine's ParkingSpace.bytes_by_tier, read when asked.
        self.parked_bytes = lambda: {"ram": 0, "disk": 0}
        self.placement_lines: list[str] = []  # fixed at load: where the model lives (placement/render.py)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.time_per_token = Histogram(TOKEN_BUCKETS)
        # Recent figures for the fleet's capability map: the last TTFTs, and the generated-token count sampled
        # at most once a second (the rate over the last RECENT_S).
        self._recent_ttft: deque[float] = deque(maxlen=64)
        self.spec: dict[str, list[int]] = {}  # drafting kind -> [drafted, accepted]
        # (when, tokens generated, prompt tokens computed, seconds computing them) at most once a second
        self._token_samples: deque[tuple[float, float, float, float]] = deque(maxlen=max(RECENT_S, SPEED_WINDOW_S) + 2)

    KEY_USAGE = {
        "key_requests_total": "Generation requests answered or ended, per API key name.",
        "key_prompt_tokens_total": "Prompt tokens of those requests, per API key name.",
        "key_cached_prompt_tokens_total": "Of those, supplied by the prefix cache, per API key name.",
        "key_generated_tokens_total": "Tokens generated for them, per API key name.",
        "key_errors_total": "Of those requests, the ones that failed or were cancelled, per API key name.",
    }

    def key_usage_snapshot(self) -> dict[str, dict[str, float]]:
        return self.locked_key_usage(lambda _: None)

    def locked_key_usage(self, inside) -> dict[str, dict[str, float]]:
        """A copy of the per-key usage, with inside(copy) run under the lock that key_used takes (the usage
        file's fold starts its next log there: no request is in both the copy and that log)."""
        with self._lock:
            copy = {key: dict(counters) for key, counters in self.key_usage.items()}
            inside(copy)
            return copy

    def key_used(self, key: str, *, prompt: int, cached: int, generated: int, failed: bool) -> None:
        counts = {"key_requests_total": 1, "key_prompt_tokens_total": prompt, "key_cached_prompt_tokens_total": cached,
                  "key_generated_tokens_total": generated, "key_errors_total": 1 if failed else 0}
        with self._lock:
            usage = self.key_usage.setdefault(key, {name: 0.0 for name in self.KEY_USAGE})
            for name, value in counts.items():
                usage[name] += value
            if self.on_key_used is not None:  # the usage file's log: in the same lock as the counters
                self.on_key_used(key, counts)

    def add(self, name: str, value: float = 1.0) -> None:
        with self._lock:
            self.counters[name] += value
            if name in ("tokens_predicted_total", "prompt_tokens_total"):  # a call's seconds are added before
                self._sample_tokens_locked(time.monotonic())

    def _sample_tokens_locked(self, now: float) -> None:
        if not self._token_samples or now - self._token_samples[-1][0] >= 1.0:
            c = self.counters
            self._token_samples.append((now, c["tokens_predicted_total"], c["prompt_tokens_total"],
                                        c["prompt_seconds_total"]))

    def recent(self, now: float | None = None) -> dict:
        """Generated tokens per second over the last RECENT_S, the prompt rate over the last SPEED_WINDOW_S (None
        without a second of prompt calls in it), and the median of the last 64 TTFTs (None before the first
        request)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            first = next(((t, n) for t, n, _, _ in self._token_samples if now - t <= RECENT_S), None)
            lately = next(((p, s) for t, _, p, s in self._token_samples if now - t <= SPEED_WINDOW_S), None)
            tokens = self.counters["tokens_predicted_total"]
            prompt, prompt_s = self.counters["prompt_tokens_total"], self.counters["prompt_seconds_total"]
            ttfts = list(self._recent_ttft)
        rate = 0.0
        if first is not None:  # over at least a second: a burst just now is not an instant rate
            rate = (tokens - first[1]) / max(now - first[0], 1.0)
        speed = None  # unknown until a second of prompt work in the window: an idle box's speed is not zero
        if lately is not None and prompt_s - lately[1] >= 1.0:
            speed = round((prompt - lately[0]) / (prompt_s - lately[1]), 2)
        return {"tokens_per_s": round(rate, 2), "prefill_tokens_per_s": speed,
                "ttft_p50_s": statistics.median(ttfts) if ttfts else None,
                "running": self.requests_processing, "waiting": self.requests_deferred,
                "throttle_level": self.throttle_level, "sequences_allowed": self.sequences_allowed,
                "prefix_cache_bytes": dict(self.cache.get("bytes", {}))}

    def speculated(self, kind: str, drafted: int, accepted: int) -> None:
        with self._lock:
            counts = self.spec.setdefault(kind, [0, 0])
            counts[0] += drafted
            counts[1] += accepted

    def set_queue(self, processing: int, deferred: int, kv_used: int, kv_total: int) -> None:
        with self._lock:
            self.requests_processing = processing
            self.requests_deferred = deferred
            self.kv_cells_used = kv_used
            self.kv_cells_total = kv_total

    def set_cpu_threads(self, threads: int) -> None:
        with self._lock:
            self.cpu_threads = threads

    def set_throttle(self, level: int, allowed: int) -> None:
        with self._lock:
            self.throttle_level, self.sequences_allowed = level, allowed

    def canary(self, seconds: float) -> None:
        with self._lock:
            self.counters["canaries_total"] += 1
            self.canary_seconds = seconds

    def set_cache(self, figures: dict) -> None:
        with self._lock:
            self.cache = figures

    def observe_ttft(self, seconds: float) -> None:
        with self._lock:
            self.ttft.observe(seconds)
            self._recent_ttft.append(seconds)

    def observe_token_gap(self, seconds: float) -> None:
        with self._lock:
            self.time_per_token.observe(seconds)

    def snapshot(self) -> dict:
        with self._lock:
            return {
                **self.counters,
                "requests_processing": self.requests_processing,
                "requests_deferred": self.requests_deferred,
                **{f"parked_bytes_{tier}": n for tier, n in self.parked_bytes().items()},
            }

    def render(self, model_id: str, state: str) -> str:
        # The placement's gauges are fixed at load and already written by prometheus_client (placement/render.py).
        return exposition(lambda: self.families(model_id, state)) + "".join(line + "\n" for line in self.placement_lines)

    def families(self, model_id: str, state: str) -> list:
        """Every family carries the model's name (label `model`), as one scrape config may cover several boxes."""
        p = "everycycle_"
        model = {"model": model_id}

        def counter(name, help_text, value):
            family = CounterMetricFamily(p + name, help_text, labels=["model"])
            family.add_metric([model_id], value)
            return family

        def gauge(name, help_text, value):
            family = GaugeMetricFamily(p + name, help_text, labels=["model"])
            family.add_metric([model_id], value)
            return family

        with self._lock:
            out = [counter(name, help_text, self.counters[name]) for name, help_text in self.COUNTERS.items()]
            gauges = {
                "requests_processing": (self.requests_processing, "Requests being generated now."),
                "requests_deferred": (self.requests_deferred, "Requests waiting for a free sequence slot."),
                "governor_throttle_level": (self.throttle_level,
                                            "The power governor's admission hint (0 normal, 1 a GPU at its floor, "
                                            "2 emergency or failsafe)."),
                "sequences_allowed": (self.sequences_allowed, "Sequences the scheduler may run now, after the hint."),
                "canary_seconds": (self.canary_seconds, "How long the last readiness canary took: what a probe costs."),
                "cpu_threads": (self.cpu_threads, "CPU threads the engine's llama.cpp calls use now: fewer than it "
                                                  "was given while other processes hold the cores."),
                "kv_cache_usage_ratio": (
                    self.kv_cells_used / self.kv_cells_total if self.kv_cells_total else 0.0,
                    "Share of KV cache cells held by running sequences.",
                ),
            }
            out += [gauge(name, help_text, value) for name, (value, help_text) in gauges.items()]
            parked = GaugeMetricFamily(p + "parked_bytes", "Parked sequences' KV (taken off their slot for a higher "
                                       "class), by where it waits.", labels=["model", "tier"])
            for tier, n in self.parked_bytes().items():
                parked.add_metric([model_id, tier], n)
            out.append(parked)
            out.append(_model_info(model_id, state))
            for name, help_text in self.KEY_USAGE.items():
                family = CounterMetricFamily(p + name, help_text, labels=["model", "key"])
                for key, usage in sorted(self.key_usage.items()):
                    family.add_metric([model_id, key], usage[name])
                out.append(family)
            out += self._cache_families(p, model_id)
            out += self._spec_families(p, model_id)
            out.append(self.ttft.family(f"{p}time_to_first_token_seconds", "Time from arrival to first generated token.",
                                        model))
            out.append(self.time_per_token.family(f"{p}time_per_output_token_seconds",
                                                  "Time between generated tokens of one sequence.", model))
        return out

    def _cache_families(self, p: str, model_id: str) -> list:
        c = self.cache
        if not c:
            return []
        lookups = c["lookups"]
        hits = CounterMetricFamily(p + "prefix_cache_hits_total", "Lookups served from a tier.", labels=["model", "tier"])
        ratio = GaugeMetricFamily(p + "prefix_cache_hit_ratio", "Share of lookups served from each tier.",
                                  labels=["model", "tier"])
        for tier, n in c["hits"].items():
            hits.add_metric([model_id, tier], n)
            ratio.add_metric([model_id, tier], n / lookups if lookups else 0)
        held = GaugeMetricFamily(p + "prefix_cache_bytes", "Bytes held by each tier.", labels=["model", "tier"])
        for tier, n in c["bytes"].items():
            held.add_metric([model_id, tier], n)
        entries = GaugeMetricFamily(p + "prefix_cache_entries", "Cached prefixes in each tier.", labels=["model", "tier"])
        for tier, n in c["entries"].items():
            entries.add_metric([model_id, tier], n)
        looked = CounterMetricFamily(p + "prefix_cache_lookups_total", "Requests that looked for a cached prompt prefix.",
                                     labels=["model"])
        looked.add_metric([model_id], lookups)
        corrupt = CounterMetricFamily(p + "prefix_cache_corrupt_files_total", "Disk entries found damaged and ignored.",
                                      labels=["model"])
        corrupt.add_metric([model_id], c["corrupt_files"])
        return [looked, hits, ratio, held, entries, corrupt]


    def _spec_families(self, p: str, model_id: str) -> list:
        drafted = CounterMetricFamily(p + "spec_draft_tokens_total", "Tokens drafted for speculative decoding.",
                                      labels=["model", "kind"])
        accepted = CounterMetricFamily(p + "spec_accepted_tokens_total", "Drafted tokens the model agreed with.",
                                       labels=["model", "kind"])
        ratio = GaugeMetricFamily(p + "spec_acceptance_ratio", "Share of drafted tokens accepted.",
                                  labels=["model", "kind"])
        for kind, (n_drafted, n_accepted) in self.spec.items():
            drafted.add_metric([model_id, kind], n_drafted)
            accepted.add_metric([model_id, kind], n_accepted)
            ratio.add_metric([model_id, kind], n_accepted / n_drafted if n_drafted else 0.0)
        return [drafted, accepted, ratio]


def _model_info(model_id: str, state: str) -> GaugeMetricFamily:
    info = GaugeMetricFamily("everycycle_model_info", "The loaded model and the engine's state.",
                             labels=["model", "state"])
    info.add_metric([model_id, state], 1)
    return info


def model_info_text(model_id: str, state: str) -> str:
    """/metrics of an engine with no model loaded yet: only what it is and its state."""
    return exposition(lambda: [_model_info(model_id, state)])

