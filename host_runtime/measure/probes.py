"""The measurements that cross the network (I/O): round trips, link throughput, prefill and decode timings,
metrics and capability maps, each against a box's API (or the fleet's endpoint) with a key. A connection per
request (as a client without keep-alive makes), through the box's one HTTP client, the same for every box
measured."""

from __future__ import annotations

import json
import ssl
import statistics
import time
import uuid
from dataclasses import dataclass

from host_runtime.common.errors import EveryCycleError
from host_runtime.common import http_client
from host_runtime.fleet.capabilities import Capabilities


class ProbeError(EveryCycleError):
    """A measurement could not be made; says which and why."""


@dataclass(frozen=True)
class Target:
    base: str                       # http(s)://host:port
    key: str
    context: ssl.SSLContext | None = None

    def request(self, path: str, body: dict | None = None, timeout: float = 300) -> http_client.Stream:
        """The answer, its body still to read; ProbeError for no answer or an error status."""
        try:
            resp = http_client.open_stream(self.base.rstrip("/") + path, method="GET" if body is None else "POST",
                                           json=body, headers={"Authorization": f"Bearer {self.key}"},
                                           timeout=timeout, verify=self.context or True)
        except http_client.HTTPFailure as exc:
            raise ProbeError(f"{self.base}{path}: {exc.why}") from None
        if resp.status >= 400:
            with resp:
                detail = resp.read(300).decode("utf-8", "replace")
            raise ProbeError(f"{self.base}{path}: HTTP {resp.status}: {detail}")
        return resp

    def json(self, path: str, body: dict | None = None, timeout: float = 300) -> dict:
        with self.request(path, body, timeout) as resp:
            return json.loads(resp.read())

    def text(self, path: str) -> str:
        with self.request(path, timeout=30) as resp:
            return resp.read().decode()


def round_trip_ms(t: Target, n: int = 20) -> float:
    """Median of n GET /health (a connection each, as a client without keep-alive makes)."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        with t.request("/health", timeout=10) as resp:
            resp.read()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def throughput_mbytes_per_s(t: Target, nbytes: int = 8 << 20, n: int = 3) -> float:
    """The best of n downloads of the box's probe body (MB/s, 10^6 bytes)."""
    best = 0.0
    for _ in range(n):
        start = time.perf_counter()
        with t.request(f"/v1/everycycle/probe?bytes={nbytes}", timeout=120) as resp:
            got = len(resp.read())
        elapsed = time.perf_counter() - start
        if got != nbytes:
            raise ProbeError(f"{t.base}: the probe sent {got} bytes, not {nbytes}")
        best = max(best, nbytes / elapsed / 1e6)
    return best


def filler(tokens: int, nonce: str) -> str:
    """About `tokens` tokens of text that no cache holds (the nonce leads)."""
    words = ["river", "stone", "lamp", "garden", "window", "copper", "meadow", "signal", "harbor", "violet"]
    return f"[{nonce}] " + " ".join(words[i % len(words)] for i in range(max(1, tokens - 8)))


def prefill(t: Target, model: str, prompt_tokens: int) -> tuple[float, int]:
    """Seconds to answer a fresh prompt of about prompt_tokens with one token (prefill and one decode step),
    and the prompt tokens the box counted. The best of two, each with a prompt no cache holds."""
    best, counted = None, 0
    for _ in range(2):
        body = {"model": model, "max_tokens": 1, "temperature": 0,
                "messages": [{"role": "user", "content": filler(prompt_tokens, uuid.uuid4().hex)}]}
        start = time.perf_counter()
        doc = t.json("/v1/chat/completions", body)
        elapsed = time.perf_counter() - start
        if best is None or elapsed < best:
            best, counted = elapsed, int(doc["usage"]["prompt_tokens"])
    return best, counted


def stream(t: Target, model: str, messages: list[dict], max_tokens: int) -> dict:
    """One streamed chat completion: ttft_s, token times, the text."""
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0, "stream": True, "messages": messages}
    start = time.perf_counter()
    stamps, text = [], []
    with t.request("/v1/chat/completions", body) as resp:
        for line in resp.lines():
            line = line.strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            delta = (chunk.get("choices") or [{}])[0].get("delta", {}).get("content")
            if delta:
                stamps.append(time.perf_counter() - start)
                text.append(delta)
    if not stamps:
        raise ProbeError(f"{t.base}: a streamed answer from {model} had no text")
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"ttft_s": stamps[0], "gaps": gaps, "text": "".join(text), "tokens": len(stamps)}


def decode_time_per_token(t: Target, model: str, answer_tokens: int) -> float:
    """Median time between streamed tokens of one request alone."""
    out = stream(t, model, [{"role": "user", "content": f"[{uuid.uuid4().hex}] Tell a long story about a "
                                                         "lighthouse keeper."}], answer_tokens)
    if not out["gaps"]:
        raise ProbeError(f"{t.base}: {model} answered one token; time per token needs two")
    return statistics.median(out["gaps"])


def metrics(t: Target) -> str:
    return t.text("/metrics")


def capabilities(t: Target):
    """The box's capability map, through the type both the box and the gateway use. (Not fleet/peers.poll:
    its errors speak of the fleet key, and a single box is measured with a client's.)"""
    try:
        return Capabilities.from_wire(t.json("/v1/everycycle/capabilities", timeout=30))
    except ValueError as exc:
        raise ProbeError(f"{t.base}: {exc}") from None
