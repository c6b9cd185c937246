"""Engine metrics (pure): counters, gauges and histograms rendered as Prometheus text.

Names follow llama-server's `llamacpp:*` set with our `everycycle_` prefix.
"""

from __future__ import annotations

import bisect
import threading

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
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

    def render(self, name: str, help_text: str) -> list[str]:
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        cumulative = 0
        for bound, count in zip(self.buckets, self.counts):
            cumulative += count
            lines.append(f'{name}_bucket{{le="{bound}"}} {cumulative}')
        lines.append(f'{name}_bucket{{le="+Inf"}} {self.n}')
        lines.append(f"{name}_sum {self.total:.6f}")
        lines.append(f"{name}_count {self.n}")
        return lines


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
    }

    def __init__(self):
        self._lock = threading.Lock()
        self.counters = {name: 0.0 for name in self.COUNTERS}
        self.requests_processing = 0
        self.requests_deferred = 0
        self.kv_cells_used = 0
        self.kv_cells_total = 0
        self.cache: dict = {}
        self.throttle_level = 0
        self.sequences_allowed = 0
        self.placement_lines: list[str] = []  # fixed at load: where the model lives (placement/render.py)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.time_per_token = Histogram(TOKEN_BUCKETS)

    def add(self, name: str, value: float = 1.0) -> None:
        with self._lock:
            self.counters[name] += value

    def set_queue(self, processing: int, deferred: int, kv_used: int, kv_total: int) -> None:
        with self._lock:
            self.requests_processing = processing
            self.requests_deferred = deferred
            self.kv_cells_used = kv_used
            self.kv_cells_total = kv_total

    def set_throttle(self, level: int, allowed: int) -> None:
        with self._lock:
            self.throttle_level, self.sequences_allowed = level, allowed

    def set_cache(self, figures: dict) -> None:
        with self._lock:
            self.cache = figures

    def observe_ttft(self, seconds: float) -> None:
        with self._lock:
            self.ttft.observe(seconds)

    def observe_token_gap(self, seconds: float) -> None:
        with self._lock:
            self.time_per_token.observe(seconds)

    def snapshot(self) -> dict:
        with self._lock:
            return {
                **self.counters,
                "requests_processing": self.requests_processing,
                "requests_deferred": self.requests_deferred,
            }

    def render(self, model_id: str, state: str) -> str:
        p = "everycycle_"
        with self._lock:
            lines: list[str] = []
            for name, help_text in self.COUNTERS.items():
                lines += [f"# HELP {p}{name} {help_text}", f"# TYPE {p}{name} counter", f"{p}{name} {self.counters[name]:g}"]
            gauges = {
                "requests_processing": (self.requests_processing, "Requests being generated now."),
                "requests_deferred": (self.requests_deferred, "Requests waiting for a free sequence slot."),
                "governor_throttle_level": (self.throttle_level,
                                            "The power governor's admission hint (0 normal, 1 a GPU at its floor, "
                                            "2 emergency or failsafe)."),
                "sequences_allowed": (self.sequences_allowed, "Sequences the scheduler may run now, after the hint."),
                "kv_cache_usage_ratio": (
                    self.kv_cells_used / self.kv_cells_total if self.kv_cells_total else 0.0,
                    "Share of KV cache cells held by running sequences.",
                ),
            }
            for name, (value, help_text) in gauges.items():
                lines += [f"# HELP {p}{name} {help_text}", f"# TYPE {p}{name} gauge", f"{p}{name} {value:g}"]
            lines += [
                f"# HELP {p}model_info The loaded model and the engine's state.",
                f"# TYPE {p}model_info gauge",
                f'{p}model_info{{model="{model_id}",state="{state}"}} 1',
            ]
            lines += self.placement_lines
            lines += self._cache_lines(p)
            lines += self.ttft.render(f"{p}time_to_first_token_seconds", "Time from arrival to first generated token.")
            lines += self.time_per_token.render(f"{p}time_per_output_token_seconds", "Time between generated tokens of one sequence.")
        return "\n".join(lines) + "\n"

    def _cache_lines(self, p: str) -> list[str]:
        c = self.cache
        if not c:
            return []
        lookups = c["lookups"]
        lines = [f"# HELP {p}prefix_cache_lookups_total Requests that looked for a cached prompt prefix.",
                 f"# TYPE {p}prefix_cache_lookups_total counter", f"{p}prefix_cache_lookups_total {lookups}",
                 f"# HELP {p}prefix_cache_hits_total Lookups served from a tier.",
                 f"# TYPE {p}prefix_cache_hits_total counter"]
        lines += [f'{p}prefix_cache_hits_total{{tier="{t}"}} {n}' for t, n in c["hits"].items()]
        lines += [f"# HELP {p}prefix_cache_hit_ratio Share of lookups served from each tier.",
                  f"# TYPE {p}prefix_cache_hit_ratio gauge"]
        lines += [f'{p}prefix_cache_hit_ratio{{tier="{t}"}} {n / lookups if lookups else 0:g}'
                  for t, n in c["hits"].items()]
        lines += [f"# HELP {p}prefix_cache_bytes Bytes held by each tier.", f"# TYPE {p}prefix_cache_bytes gauge"]
        lines += [f'{p}prefix_cache_bytes{{tier="{t}"}} {n}' for t, n in c["bytes"].items()]
        lines += [f"# HELP {p}prefix_cache_entries Cached prefixes in each tier.",
                  f"# TYPE {p}prefix_cache_entries gauge"]
        lines += [f'{p}prefix_cache_entries{{tier="{t}"}} {n}' for t, n in c["entries"].items()]
        lines += [f"# HELP {p}prefix_cache_corrupt_files_total Disk entries found damaged and ignored.",
                  f"# TYPE {p}prefix_cache_corrupt_files_total counter",
                  f"{p}prefix_cache_corrupt_files_total {c['corrupt_files']}"]
        return lines
