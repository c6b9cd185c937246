"""One measuring run over a box or a fleet: each box's machine, link, prefill, decode and KV figures, a
multi-turn run through the endpoint for the cache tiers, and the requirement's load; filled into a Report
(report.py) with the roles and decisions the figures support."""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from host_runtime.fleet.capabilities import Capabilities, ModelCapability
from host_runtime.measure import probes
from host_runtime.measure.probes import Target
from host_runtime.measure.report import Report, kv_conclusion
from host_runtime.measure.requirement import Requirement

CONVERSATIONS = 3
TURNS = 3


def _metric_sums(text: str) -> dict[str, float]:
    """Counters summed over models, and prefix cache hits per tier (`hits.<tier>`)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "everycycle_prefix_cache_hits_total":
                key = f"hits.{s.labels.get('tier', '?')}"
            elif s.name in ("everycycle_prompt_tokens_total", "everycycle_prompt_tokens_cached_total",
                            "everycycle_prefix_cache_lookups_total"):
                key = s.name
            else:
                continue
            out[key] = out.get(key, 0.0) + s.value
    return out


def _loaded_model(caps: Capabilities) -> ModelCapability:
    for state in ("loaded", "loading", "available"):
        for m in caps.models:
            if m.state == state:
                return m
    raise probes.ProbeError(f"box {caps.box} has no model to measure")


def roles(caps: Capabilities, is_gateway: bool, lookups: float) -> list[dict]:
    """What a box does in the design, each with why (pure)."""
    out = []
    if is_gateway:
        out.append({"role": "router", "why": "it runs the fleet gateway (sglang-router fed by every box's capability "
                                             "map); every client request enters the fleet here"})
    loaded = [m.id for m in caps.models if m.state == "loaded"]
    if loaded:
        out.append({"role": "prefill and decode", "why": f"it serves {', '.join(loaded)} end to end; the KV "
                                                         "section shows why the two are not split"})
    tiers = {t: b for m in caps.models for t, b in m.prefix_cache_bytes.items() if b}
    if tiers or lookups:
        held = ", ".join(f"{t} {b / 2**20:.1f} MiB" for t, b in sorted(tiers.items())) or "nothing held yet"
        out.append({"role": "cache", "why": f"its prefix cache answered {lookups:.0f} lookups in this run ({held})"})
    stored = [m.id for m in caps.models]
    if stored:
        out.append({"role": "storage", "why": f"its model store holds {len(stored)} model(s): {', '.join(stored)}"})
    out.append({"role": "agent", "why": "the BMC (or hwmon) agent and the power governor run on it under supervisord; "
                                        "their readings are telemetry, not figures of this document"})
    return out


def _load(endpoint: Target, model: str, req: Requirement, report: Report) -> None:
    """The requirement's users at once through the endpoint, each a fresh prompt of the typical length."""
    results, lock = [], threading.Lock()

    def one(i: int) -> None:
        out = probes.stream(endpoint, model, [{"role": "user", "content": probes.filler(req.prompt_tokens,
                                                                                        uuid.uuid4().hex)}],
                            req.answer_tokens)
        with lock:
            results.append(out)

    start = time.perf_counter()
    with ThreadPoolExecutor(req.concurrent_users) as pool:
        list(pool.map(one, range(req.concurrent_users)))
    wall = time.perf_counter() - start
    gaps = [g for r in results for g in r["gaps"]]
    how = f"{req.concurrent_users} streamed requests at once through the endpoint ({model})"
    report.measured("load.ttft_p50_s", statistics.median(r["ttft_s"] for r in results), "s", how)
    report.measured("load.time_per_token_p50_s", statistics.median(gaps) if gaps else 0.0, "s", how)
    report.measured("load.tokens_per_s", sum(r["tokens"] for r in results) / wall, "tokens/s", how)


def _conversations(endpoint: Target, model: str, req: Requirement) -> None:
    """Several conversations, each turn extending the last: what the prefix cache exists for."""
    def talk(n: int) -> None:
        messages = [{"role": "system", "content": f"[{uuid.uuid4().hex}] You answer briefly. "
                                                  + probes.filler(req.prompt_tokens // 2, str(n))}]
        for turn in range(TURNS):
            messages.append({"role": "user", "content": probes.filler(max(8, req.prompt_tokens // 4), f"{n}.{turn}")})
            out = probes.stream(endpoint, model, messages, 8)
            messages.append({"role": "assistant", "content": out["text"]})

    with ThreadPoolExecutor(CONVERSATIONS) as pool:
        list(pool.map(talk, range(CONVERSATIONS)))


def survey(boxes: list[Target], endpoint: Target, req: Requirement, *, scope: str, gateway: int | None = None,
           endpoint_is_box: bool = True, progress: Callable[[str], None] = print) -> Report:
    report = Report(scope, req)
    report.stated()
    caps = []
    for i, t in enumerate(boxes):
        progress(f"box{i} ({t.base}): capability map, round trip, link throughput")
        caps.append(probes.capabilities(t))
    measured = [_loaded_model(c) for c in caps]
    models = [m.id for m in measured]
    progress(f"cache tiers: {CONVERSATIONS} conversations x {TURNS} turns through the endpoint")
    before = [_metric_sums(probes.metrics(t)) for t in boxes]
    _conversations(endpoint, models[0], req)
    after = [_metric_sums(probes.metrics(t)) for t in boxes]
    for i, (t, c) in enumerate(zip(boxes, caps)):
        b = f"box{i}"
        hw = c.hardware
        from_map = "reported by the box's capability map (psutil)"
        report.measured(f"{b}.host_memory_gib", (hw.get("host_memory_bytes") or 0) / 2**30, "GiB", from_map)
        report.measured(f"{b}.cpu_threads", int(hw.get("cpu_count") or 0), "", from_map)
        rtt = report.measured(f"link.{b}.rtt_ms", probes.round_trip_ms(t), "ms",
                              "median of 20 GET /health, a connection each, from where `measure` ran")
        mbps = report.measured(f"link.{b}.mbytes_per_s", probes.throughput_mbytes_per_s(t), "MB/s",
                               "best of 3 downloads of 8 MiB from /v1/everycycle/probe")
        carries = ("per-request: prompts in, streamed tokens out, gateway to box" if scope == "fleet"
                   else "client: requests in, streamed answers out")
        report.links.append({"name": f"{'gateway' if scope == 'fleet' else 'client'} to {b} ({t.base})",
                             "carries": carries, "rtt": rtt, "throughput": mbps})
        progress(f"{b}: prefill of {req.prompt_tokens} tokens, decode of {req.answer_tokens}")
        seconds, counted = probes.prefill(t, models[i], req.prompt_tokens)
        how = f"best of 2 fresh prompts with max_tokens 1 on {models[i]} (prefill, one decode step, HTTP)"
        report.measured(f"{b}.prefill_s", seconds, "s", how)
        report.measured(f"{b}.prefill_tokens", counted, "tokens", "the box's usage.prompt_tokens for that prompt")
        report.measured(f"{b}.time_per_token_s", probes.decode_time_per_token(t, models[i], req.answer_tokens), "s",
                        f"median gap between streamed tokens of one request alone on {models[i]}")
        kv_per_token = measured[i].kv_bytes_per_token
        if kv_per_token:
            report.measured(f"{b}.kv_bytes_per_token", kv_per_token, "bytes",
                            "the placement planner's KV bytes per token (capability map)")
            report.derived(f"{b}.kv_bytes_per_request", f"{{{b}.kv_bytes_per_token}} * {{requirement.prompt_tokens}}",
                           "bytes", "one typical prompt's KV")
            report.derived(f"{b}.kv_transfer_s", f"{{{b}.kv_bytes_per_request}} / ({{{mbps}}} * 1000000) + {{{rtt}}} / 1000",
                           "s", "time to move it over the measured link")
            report.derived(f"{b}.kv_move_vs_prefill", f"{{{b}.kv_transfer_s}} / {{{b}.prefill_s}}", "",
                           "moving the KV against computing it")
            ratio = report.figures[f"{b}.kv_move_vs_prefill"].value
            conclusion = kv_conclusion(ratio)
            if scope == "box":
                conclusion = ("with one box there is nothing to split over; were the next box this link away, "
                              + conclusion)
            report.kv.append({"box": b, "link": f"the {carries.split(':')[0]} link", "bytes_per_token": f"{b}.kv_bytes_per_token",
                              "bytes_per_request": f"{b}.kv_bytes_per_request", "transfer_s": f"{b}.kv_transfer_s",
                              "prefill_s": f"{b}.prefill_s", "prefill_tokens": f"{b}.prefill_tokens",
                              "ratio": f"{b}.kv_move_vs_prefill", "conclusion": conclusion})
        else:
            report.not_measured.append(f"{b}: KV bytes per token (its model is not loaded, so no placement says)")
        delta = {k: after[i].get(k, 0.0) - before[i].get(k, 0.0) for k in after[i]}
        run = f"the multi-turn run ({CONVERSATIONS} conversations x {TURNS} turns), counter deltas on {b}"
        computed = report.measured(f"cache.{b}.computed_tokens",
                                   int(delta.get("everycycle_prompt_tokens_total", 0)), "tokens", run)
        cached = report.measured(f"cache.{b}.cached_tokens",
                                 int(delta.get("everycycle_prompt_tokens_cached_total", 0)), "tokens", run)
        lookups = report.measured(f"cache.{b}.lookups", int(delta.get("everycycle_prefix_cache_lookups_total", 0)),
                                  "", run)
        tiers = [{"tier": k.split(".", 1)[1], "hits": report.measured(f"cache.{b}.hits.{k.split('.', 1)[1]}",
                                                                      int(v), "", run)}
                 for k, v in sorted(delta.items()) if k.startswith("hits.") and v > 0]
        if report.figures[computed].value + report.figures[cached].value > 0:
            report.derived(f"cache.{b}.hit_ratio", f"{{{cached}}} / ({{{cached}}} + {{{computed}}})", "",
                           "cached share of prompt tokens")
            report.derived(f"cache.{b}.saved_s", f"{{{cached}}} * {{{b}.prefill_s}} / {{{b}.prefill_tokens}}", "s",
                           "cached tokens at the measured prefill rate")
            report.caches.append({"box": b, "computed_tokens": computed, "cached_tokens": cached, "lookups": lookups,
                                  "tiers": tiers, "hit_ratio": f"cache.{b}.hit_ratio", "saved_s": f"cache.{b}.saved_s"})
        else:
            report.not_measured.append(f"{b}: cache tiers (the multi-turn run sent it no prompt)")
        accelerators = hw.get("accelerators") or []
        report.machines.append({"name": f"{b}: {c.box} ({t.base}), version {c.version}",
                                "accelerators": accelerators, "host_memory_label": f"{b}.host_memory_gib",
                                "cpu_threads_label": f"{b}.cpu_threads",
                                "roles": roles(c, gateway == i, report.figures[lookups].value)})
    progress(f"load: {req.concurrent_users} users at once through the endpoint")
    _load(endpoint, models[0], req, report)
    _decisions(report, len(boxes))
    report.not_measured += [
        "the per-token link inside each box (the API's Unix socket to its engine process)",
        "the load-time link (model store to memory): models were already loaded",
        "power draw and temperatures (the governor publishes them; they do not change the decisions below)",
    ]
    if scope == "fleet":
        report.not_measured.append("box-to-box links: the gateway-to-box link stands for them in the KV arithmetic")
        if not endpoint_is_box:
            report.not_measured.append("the client's link to the gateway (its /v1 goes to the router, which has no "
                                       "probe); the load figures are measured through it")
    return report


def _decisions(report: Report, n_boxes: int) -> None:
    f = report.figures
    ratios = [k["ratio"] for k in report.kv]
    if ratios:
        split = min(f[r].value for r in ratios) < 0.25
        report.decisions.append({
            "text": ("Prefill and decode stay on the box that serves the request" if not split else
                     "Prefill and decode stay on one box for now, though moving KV is cheap next to computing it") +
                    ": the KV arithmetic compares moving one request's KV with computing it.",
            "labels": ratios})
    if report.caches:
        report.decisions.append({
            "text": "Keep each conversation where its prefix is cached (the router's cache_aware policy, the boxes' "
                    "prefix cache tiers): the cached share of prompt tokens is the work not redone.",
            "labels": [c["hit_ratio"] for c in report.caches]})
    ttft_ok = f["load.ttft_p50_s"].value <= f["requirement.ttft_p50_s"].value
    tpt_ok = f["load.time_per_token_p50_s"].value <= f["requirement.time_per_token_s"].value
    verdict = ("meets" if ttft_ok and tpt_ok else "does not meet") + " the requirement"
    why = [] if ttft_ok else ["time to first token is over its budget"]
    why += [] if tpt_ok else ["time per token is over its budget"]
    report.decisions.append({
        "text": f"At the stated number of users, {'this fleet' if n_boxes > 1 else 'this box'} {verdict}"
                + (f" ({'; '.join(why)}): add a box or a faster card, or lower the prompt length" if why else "") + ".",
        "labels": ["requirement.concurrent_users", "load.ttft_p50_s", "requirement.ttft_p50_s",
                   "load.time_per_token_p50_s", "requirement.time_per_token_s"]})
