"""`everycycle status`: the console's facts as plain text (the same data layer)."""

from __future__ import annotations

from host_runtime.box_status.rows import BoxStatus, Serving


def model_lines(sv: Serving) -> list[str]:
    """The loaded models and the bundle's pull, a line each: what the console and `everycycle status` show."""
    def mib(v):
        return "n/a" if v is None else f"{v / 2**20:,.0f} MiB"

    lines = [f"{m.name}: {mib(m.resident_bytes)} resident of {mib(m.planned_bytes)} planned, "
             f"{'n/a' if m.tokens_per_s is None else format(m.tokens_per_s, '.1f')} tok/s" for m in sv.models]
    p = sv.pull
    if p is not None and p.state != "pulled":
        done = f"{mib(p.done_bytes)} of {mib(p.total_bytes)}" + (
            f" ({100 * p.done_bytes / p.total_bytes:.0f} %)" if p.total_bytes else "")
        lines.append(f"pulling {p.name}: {p.state}, {done}, {p.rate_bytes_s / 2**20:.1f} MiB/s"
                     if p.state != "failed" else f"pulling {p.name} FAILED (see the serving log)")
    return lines


def users_line(sv: Serving) -> str | None:
    """The top users in a line (the console's and `everycycle status`'s), or None when no key has used the box."""
    if not sv.top_users:
        return None
    return "top users: " + ", ".join(f"{key} {generated:,.0f} tok ({requests:,.0f} req)"
                                     for key, requests, generated in sv.top_users)


def system_line(system: dict) -> str | None:
    """The image's version and slot and the last update's outcome, one line (None off the box image)."""
    version, slot = system.get("version", ""), system.get("slot", "")
    if not version or version.startswith("unavailable"):
        return None
    line = f"image {version}" + (f", slot {slot}" if not slot.startswith("unavailable") else "")
    last = system.get("last_update")
    if last:
        line += f"; last update {last.get('target')}: {last.get('phase')} ({last.get('reason')})"
    return line


def fmt(v, spec: str = "", none: str = "n/a") -> str:
    return none if v is None else format(v, spec)


def render(s: BoxStatus) -> str:
    sv = s.serving
    lines = [f"{s.box_name}  EveryCycle {s.version}  up {s.uptime_s / 3600:.1f} h",
             "API      " + "  ".join(s.api_urls)]
    if line := system_line(s.system):
        lines.append(f"System   {line}")
    if s.tls_fingerprint:
        lines.append(f"TLS      clients trust SHA-256 {s.tls_fingerprint}  (`everycycle front ca` says how)")
    if sv.source.ok:
        lines.append(f"Serving  {sv.model or '?'}: {'ready' if sv.ready else 'NOT READY'} ({sv.ready_reason}); "
                     f"{sv.running:.0f} running, {sv.waiting:.0f} waiting; {fmt(sv.tokens_per_s, '.1f')} tok/s; "
                     f"TTFT p50 {fmt(sv.ttft_p50_s and sv.ttft_p50_s * 1000, '.0f')} ms; "
                     f"prefix hits {fmt(sv.prefix_hit_ratio and sv.prefix_hit_ratio * 100, '.0f')} %")
        if sv.backend:
            lines.append(f"Backend  {sv.backend.get('backend')} on {sv.backend.get('device')} ({sv.backend.get('reason')}); "
                         "layers " + ", ".join(f"{d} {n}" for d, n in sv.layers.items()))
        lines += [f"Model    {line}" for line in model_lines(sv)]
        if users_line(sv):
            lines.append(f"Users    {users_line(sv)}")
    else:
        lines.append(f"Serving  DOWN: {sv.source.detail}")
    lines.append(f"Governor {s.governor.detail if s.governor.ok else 'DOWN: ' + s.governor.detail}; "
                 f"throttle {fmt(s.throttle_level)}")
    for g in s.gpus:
        lines.append(f"GPU      {g['name']}: {fmt(g.get('temperature_c'), '.1f')} C, {fmt(g.get('power_w'), '.0f')} W "
                     f"of {fmt(g.get('applied_limit_w'), '.0f')} W (target {fmt(g.get('target_c'), '.1f')} C, {g.get('state')})"
                     + (f", VRAM {g['vram_used_bytes'] / 2**30:.1f}/{g['vram_total_bytes'] / 2**30:.0f} GiB"
                        if g.get("vram_total_bytes") and g.get("vram_used_bytes") is not None else ""))
    lines.append(f"Host     CPU {s.cpu_percent:.0f} %, RAM {s.ram_used_percent:.0f} %")
    if not s.chassis:
        lines.append(f"Chassis  {s.bmc.detail}")
    for c in s.chassis:
        lines.append(f"Chassis  {c['name']}: {fmt(c.get('value'))} {c.get('units', '')} ({c.get('health')})")
    lines.append("Services " + (", ".join(f"{k} {v}" for k, v in sorted(s.services.items())) if s.supervisor.ok
                                else "DOWN: " + s.supervisor.detail))
    for e in s.events[:5]:
        lines.append(f"Event    {e['at']} {e['source']}: {e['detail']}")
    return "\n".join(lines)
