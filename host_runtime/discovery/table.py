"""The short human summary of a topology (what a person wants to see on first boot)."""

from __future__ import annotations

from host_runtime.discovery.fields import is_unavailable


def _v(value, fmt=str) -> str:
    return f"unavailable ({value['unavailable']})" if is_unavailable(value) else fmt(value)


def _gib(n) -> str:
    return _v(n, lambda b: f"{b / 2**30:.1f} GiB")


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
    disks = doc["storage"]
    if is_unavailable(disks):
        lines.append(f"Disks    {_v(disks)}")
    else:
        for d in disks:
            mounts = ", ".join(f"{m['mountpoint']} ({_gib(m['free_bytes'])} free)" for m in d["mounts"]) or "not mounted"
            lines.append(f"Disk     {d['name']} {_v(d['model'])} {_gib(d['size_bytes'])} {d['transport']}"
                         f"{' rotational' if d['rotational'] is True else ''}: {mounts}")
    net = doc["network"]
    if is_unavailable(net):
        lines.append(f"Network  {_v(net)}")
    else:
        for link in net:
            addrs = ", ".join(f"{a['address']}/{a['prefixlen']}" for a in link["addresses"]) or "no address"
            speed = _v(link["speed_mbps"], lambda s: f"{s} Mb/s") if not is_unavailable(link["speed_mbps"]) else "speed n/a"
            lines.append(f"Link     {link['name']} {link['state']} {link['mac'] or ''} mtu {link['mtu']} {speed}: {addrs}")
    bmc = doc["bmc"]
    lines.append("BMC      " + (f"local {bmc['local_ipmi_device']}" if bmc["local_ipmi_device"] else
                               f"configured at {bmc['configured_address']}" if bmc["configured_address"] else "none found"))
    return "\n".join(lines)
