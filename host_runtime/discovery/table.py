"""The short human summary of a topology (what a person wants to see on first boot)."""

from __future__ import annotations

from host_runtime.common.readings import is_unavailable


def _v(value, fmt=str) -> str:
    return f"unavailable ({value['unavailable']})" if is_unavailable(value) else fmt(value)


def _gib(n) -> str:
    return _v(n, lambda b: f"{b / 2**30:.1f} GiB")


def _each(label: str, items, line) -> list[str]:
    """One line per item, or one line saying why the whole source is unavailable."""
    if is_unavailable(items):
        return [f"{label:<8} {_v(items)}"]
    return [f"{label:<8} {line(item)}" for item in items]


def _disk_line(d: dict) -> str:
    mounts = ", ".join(f"{m['mountpoint']} ({_gib(m['free_bytes'])} free)" for m in d["mounts"]) or "not mounted"
    rotational = " rotational" if d["rotational"] is True else ""
    return f"{d['name']} {_v(d['model'])} {_gib(d['size_bytes'])} {d['transport']}{rotational}: {mounts}"


def _link_line(link: dict) -> str:
    addrs = ", ".join(f"{a['address']}/{a['prefixlen']}" for a in link["addresses"]) or "no address"
    speed = "speed n/a" if is_unavailable(link["speed_mbps"]) else f"{link['speed_mbps']} Mb/s"
    return f"{link['name']} {link['state']} {link['mac'] or ''} mtu {link['mtu']} {speed}: {addrs}"


def render(doc: dict) -> str:
    cpu, mem = doc["cpu"], doc["memory"]
    lines = [f"Host     {doc['host']['hostname']} (kernel {doc['host']['kernel']})",
             f"CPU      {_v(cpu['model'])}: {cpu['sockets']} socket(s), {_v(cpu['cores'])} cores, "
             f"{cpu['threads']} threads; {', '.join(cpu['flags']) or 'no AVX2/AVX-512/AMX/NEON'}"]
    nodes = cpu["numa_nodes"]
    lines.append(f"NUMA     {_v(nodes, lambda n: f'{len(n)} node(s)')}")
    hp = mem["hugepages"]
    hugepages = _v(hp, lambda h: "%d x %d KiB" % (h["total"], h["page_size_bytes"] // 1024))
    lines.append(f"Memory   {_gib(mem['total_bytes'])} total, {_gib(mem['available_bytes'])} available; "
                 f"hugepages {hugepages}")
    gpus = doc["gpus"]["devices"]
    if not gpus:
        srcs = doc["gpus"]["sources"]
        why = "; ".join(f"{k}: {v['unavailable']}" for k, v in srcs.items() if is_unavailable(v))
        lines.append(f"GPUs     none found ({why})" if why else "GPUs     none found")
    for g in gpus:
        d = g.get("details") or {}
        name = _v(d.get("name", g["vendor"] or "unknown")) if d else (g["vendor"] or "unknown")
        vram = f", {_gib(d['vram_total_bytes'])}" if isinstance(d, dict) and "vram_total_bytes" in d else ""
        pcie = g["pcie"]
        link = f"x{_v(pcie.get('current_link_width', '?'))} of x{_v(pcie.get('max_link_width', '?'))}"
        lines.append(f"GPU      {g['pci_address']} {name}{vram}, driver {g['driver'] or 'NONE'}, PCIe {link}")
    lines += _each("Disk", doc["storage"], _disk_line)
    lines += _each("Link", doc["network"], _link_line)
    bmc = doc["bmc"]
    lines.append("BMC      " + (f"local {bmc['local_ipmi_device']}" if bmc["local_ipmi_device"] else
                               f"configured at {bmc['configured_address']}" if bmc["configured_address"] else "none found"))
    return "\n".join(lines)
