"""Hardware discovery on this machine's real /sys, psutil and netlink; GPU translations on recorded values."""

from __future__ import annotations

import copy
import json
import os
import stat
import subprocess
import time

import psutil
import pytest

from host_runtime.discovery import table, topology
from host_runtime.discovery.cpu import numa_nodes, parse_cpuinfo, parse_cpulist
from host_runtime.common.readings import is_unavailable
from host_runtime.common.pci import bridge_path, normalize_address, pci_link
from host_runtime.gpu import amdgpu, nvml
from tests.servers import Proc, everycycle, wait_for


@pytest.fixture(scope="module")
def doc():
    return topology.collect()


def test_the_topology_validates_and_agrees_with_psutil(doc):
    topology.validate(doc)
    assert doc["cpu"]["threads"] == psutil.cpu_count(logical=True)
    assert doc["cpu"]["cores"] == psutil.cpu_count(logical=False)
    assert doc["memory"]["total_bytes"] == psutil.virtual_memory().total
    assert doc["content_hash"] == topology.content_hash(doc)


def test_every_link_netlink_sees_is_listed_with_its_addresses(doc):
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        links = {link.get_attr("IFLA_IFNAME"): link["index"] for link in ipr.get_links()}
        addrs = {(a["index"], a.get_attr("IFA_ADDRESS")) for a in ipr.get_addr()}
    listed = {link["name"]: link for link in doc["network"]}
    assert set(listed) == set(links)
    for name, index in links.items():
        assert {a["address"] for a in listed[name]["addresses"]} == {addr for i, addr in addrs if i == index}
    assert any(a["address"] == "127.0.0.1" for a in listed["lo"]["addresses"])


def test_the_hash_ignores_volatile_readings_and_follows_hardware(doc):
    moved = copy.deepcopy(doc)
    moved["memory"]["available_bytes"] += 12345
    moved["generated_at"] = "2030-01-01T00:00:00+00:00"
    assert topology.content_hash(moved) == doc["content_hash"]
    changed = copy.deepcopy(doc)
    changed["cpu"]["threads"] += 2
    assert topology.content_hash(changed) != doc["content_hash"]


def test_an_invalid_document_is_refused_and_nothing_is_written(doc, tmp_path):
    bad = copy.deepcopy(doc)
    bad["cpu"]["threads"] = "many"
    target = tmp_path / "topology.json"
    with pytest.raises(topology.TopologyInvalid, match="cpu/threads"):
        topology.write(bad, target)
    assert not target.exists()
    topology.write(doc, target)
    assert json.loads(target.read_text())["content_hash"] == doc["content_hash"]
    assert [p.name for p in tmp_path.iterdir()] == ["topology.json"]


def test_missing_gpu_sources_are_reported_with_a_reason(doc):
    for name, status in doc["gpus"]["sources"].items():
        assert status.get("available") is True or is_unavailable(status), name
        if is_unavailable(status):
            assert status["unavailable"]


def test_malformed_sysfs_entries_become_unavailable_fields(tmp_path):
    dev = tmp_path / "devices/pci0000:00/0000:00:01.0/0000:01:00.0"
    dev.mkdir(parents=True)
    (dev / "current_link_speed").write_text("16.0 GT/s PCIe\n")
    (dev / "current_link_width").write_text("garbage\n")
    (dev / "numa_node").write_text("-1\n")
    (dev / "max_link_speed").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "bus/pci/devices").mkdir(parents=True)
    (tmp_path / "bus/pci/devices/0000:01:00.0").symlink_to(dev)
    link = pci_link("0000:01:00.0", tmp_path)
    assert link["current_link_speed"] == "16.0 GT/s PCIe"
    assert is_unavailable(link["current_link_width"]) and "garbage" in link["current_link_width"]["unavailable"]
    assert is_unavailable(link["max_link_width"])  # missing file
    assert is_unavailable(link["max_link_speed"])  # not text
    assert link["numa_node"] is None  # -1: no affinity
    assert link["bridge_path"] == ["0000:00:01.0"]
    node = tmp_path / "devices/system/node/node0"
    node.mkdir(parents=True)
    (node / "cpulist").write_text("zz-\n")
    nodes = numa_nodes(tmp_path)
    assert is_unavailable(nodes[0]["cpus"]) and is_unavailable(nodes[0]["memory_total_bytes"])


def test_cpuinfo_and_cpulist_parsing():
    info = ("processor : 0\nmodel name : Example CPU\nphysical id : 0\nflags : fpu sse avx2 avx512f amx_tile\n"
            "processor : 1\nphysical id : 1\nflags : fpu\n")
    assert parse_cpuinfo(info) == {"model": "Example CPU", "sockets": 2, "flags": ["amx", "avx2", "avx512f"]}
    assert parse_cpuinfo("Features : fp asimd\n")["flags"] == ["neon"]
    assert parse_cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]


def test_pci_helpers():
    assert normalize_address("00000000:65:00.0") == "0000:65:00.0"
    from pathlib import Path

    assert bridge_path(Path("/sys/devices/pci0000:00/0000:00:03.1/0000:08:00.0/0000:09:00.0")) == \
        ["0000:00:03.1", "0000:08:00.0"]


# Recorded from real RTX 3090s, in NVML's units (bytes, milliwatts, degrees C):
# - memory, power limits and temperature thresholds: the `nvidia-smi -q` dump in
#   NVIDIA/nvidia-docker issue #1547 (FB memory 19147 MiB used + 5121 MiB free; power limit
#   350 W, default 350 W, min 100 W, max 350 W; slowdown 95 C, shutdown 98 C);
# - name, PCI bus id and UUID: the `nvidia-smi -q` dump in NVIDIA/nvidia-container-toolkit #166;
# - compute capability 8.6: NVIDIA's CUDA GPU list for the GeForce RTX 3090.
RTX3090_NVML = {
    "index": 0, "name": "NVIDIA GeForce RTX 3090", "uuid": "GPU-1a6d7df5-1d75-f538-1cab-77d60aee0264",
    "pci_bus_id": "00000000:65:00.0", "memory_total": 24268 * 2**20, "memory_free": 5121 * 2**20,
    "compute_capability": (8, 6), "power_limit_constraints": (100000, 350000), "power_limit_default": 350000,
    "power_limit": 350000, "temp_slowdown": 95, "temp_shutdown": 98, "nvlink_peers": [],
}


def test_nvml_translation_on_recorded_rtx3090_values():
    g = nvml.translate(RTX3090_NVML)
    assert g["pci_address"] == "0000:65:00.0"
    assert g["vram_total_bytes"] == 25446842368
    assert g["compute_capability"] == "8.6"
    assert g["power_limit_w"] == {"min": 100.0, "max": 350.0, "default": 350.0, "current": 350.0}
    assert g["temperature_thresholds_c"] == {"slowdown": 95, "shutdown": 98}


# Read from NVML on the lent H200 by bench/gpu_check.py's fixture (2026-12-04; driver 580.159.04, CUDA 13.0):
# a four-digit PCI domain, and NVLink queries NVML does not support on that single-GPU machine.
H200_NVML = {
    "index": 0, "name": "NVIDIA H200", "uuid": "GPU-43d821bf-ba08-3d7f-96ee-94a8698b54d4",
    "pci_bus_id": "0000:00:06.0", "memory_total": 150754820096, "memory_free": 150109880320,
    "compute_capability": [9, 0], "power_limit_constraints": [200000, 700000], "power_limit_default": 700000,
    "power_limit": 700000, "temp_slowdown": 89, "temp_shutdown": 95,
    "nvlink_peers": {"unavailable": "NVML: Not Supported"},
}


def test_nvml_translation_on_values_read_from_a_real_h200():
    g = nvml.translate(H200_NVML)
    assert g["pci_address"] == "0000:00:06.0"
    assert g["compute_capability"] == "9.0"
    assert g["power_limit_w"] == {"min": 200.0, "max": 700.0, "default": 700.0, "current": 700.0}
    assert g["temperature_thresholds_c"] == {"slowdown": 89, "shutdown": 95}
    assert is_unavailable(g["nvlink_peers"])


def test_a_topology_with_the_recorded_h200_validates(doc, monkeypatch):
    """The H200's readings through discovery (a card NVML sees and udev here does not) into the schema."""
    from host_runtime.discovery import gpus

    status = {"available": True, "driver_version": "580.159.04", "cuda_driver_version": 13000}
    monkeypatch.setattr(nvml, "snapshot", lambda: ([H200_NVML], status))
    with_h200 = dict(doc, gpus=gpus.collect_gpus())
    [card] = [d for d in with_h200["gpus"]["devices"] if d["vendor"] == "nvidia"]
    assert card["pci_address"] == "0000:00:06.0" and card["details"]["name"] == "NVIDIA H200"
    topology.validate(with_h200)


def test_nvml_translation_keeps_unsupported_readings_as_unavailable():
    raw = dict(RTX3090_NVML, power_limit_constraints={"unavailable": "NVML: Not Supported"},
               compute_capability={"unavailable": "NVML: Not Supported"})
    g = nvml.translate(raw)
    assert is_unavailable(g["power_limit_w"]["min"]) and is_unavailable(g["compute_capability"])
    assert g["power_limit_w"]["current"] == 350.0


def test_amd_translation_uses_the_hwmon_units():
    # The amdgpu hwmon ABI reports power caps in microwatts (kernel docs, amdgpu thermal);
    # the values are a 255 W card's (RX 6800 XT board power) at its default cap.
    raw = {"index": 0, "name": "AMD Radeon RX 6800 XT", "pci_slot": "0000:0b:00.0",
           "memory_info": {"vram_size": 17163091968, "gtt_size": 8589934592},
           "hwmon": {"current": 255000000, "max": 293000000, "min": 0, "default": 255000000}}
    g = amdgpu.translate(raw)
    assert g["vram_total_bytes"] == 17163091968
    assert g["power_limit_w"] == {"current": 255.0, "max": 293.0, "min": 0.0, "default": 255.0}


@pytest.mark.gpu
def test_real_nvml_discovery():
    raw, status = nvml.snapshot()
    assert status.get("available") is True and raw
    for r in raw:
        g = nvml.translate(r)
        assert g["vram_total_bytes"] > 0 and g["pci_address"].count(":") == 2


def test_the_table_summarises_cpus_memory_disks_and_links(doc):
    text = table.render(doc)
    assert f"{doc['cpu']['threads']} threads" in text
    assert "GiB total" in text
    for link in doc["network"]:
        assert f"Link     {link['name']} " in text
    assert "BMC" in text


@pytest.mark.system
def test_cli_prints_and_writes(tmp_path):
    out = subprocess.run(everycycle("discover", "--print"), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    topology.validate(json.loads(out.stdout))
    out = subprocess.run(everycycle("discover", "--format", "table"), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("Host")
    target = tmp_path / "run" / "topology.json"
    out = subprocess.run(everycycle("discover", "--output", str(target)), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == str(target)
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o644
    topology.validate(json.loads(target.read_text()))


def test_a_link_added_in_a_namespace_appears_and_disappears(netns, tmp_path):
    """The watcher in a namespace the test made: a veth pair shows up in the file, then goes."""
    target = tmp_path / "topology.json"
    proc = Proc(["ip", "netns", "exec", netns, *everycycle("discover", "--watch", "--output", str(target),
                                                           "--debounce", "0.2")], tmp_path / "watch.log")

    def links() -> set[str]:
        try:
            return {link["name"] for link in json.loads(target.read_text())["network"]}
        except (OSError, ValueError):
            return set()

    try:
        wait_for(lambda: links() == {"lo"}, 30, "the first topology inside the namespace", proc)
        started = time.monotonic()
        subprocess.run(["ip", "netns", "exec", netns, "ip", "link", "add", "ectest0", "type", "veth", "peer", "name",
                        "ectest1"], check=True)
        wait_for(lambda: {"ectest0", "ectest1"} <= links(), 10, "the new links in the file", proc)
        appeared = time.monotonic() - started
        subprocess.run(["ip", "netns", "exec", netns, "ip", "link", "del", "ectest0"], check=True)
        wait_for(lambda: links() == {"lo"}, 10, "the links to leave the file", proc)
        assert appeared < 10
    finally:
        proc.stop()


def test_a_link_event_reads_only_the_network_again(tmp_path, monkeypatch):
    """A link or address event costs a netlink read, not a GPU probe (seconds under load); a full scan reads all."""
    from host_runtime.discovery.watch import SECTIONS_BY_SUBSYSTEM, TopologyWatcher

    calls: list[str] = []
    for section in ("cpu", "memory", "gpus", "storage", "network"):
        real = getattr(topology, f"collect_{section}")
        monkeypatch.setattr(topology, f"collect_{section}",
                            lambda real=real, section=section: (calls.append(section), real())[1])
    watcher = TopologyWatcher(tmp_path / "topology.json")
    assert watcher.refresh() is True
    assert sorted(calls) == ["cpu", "gpus", "memory", "network", "storage"]
    calls.clear()
    first = json.loads((tmp_path / "topology.json").read_text())
    assert watcher.refresh(frozenset({"network"})) is False  # nothing changed: the file is not rewritten
    assert calls == ["network"]
    calls.clear()
    watcher.refresh(SECTIONS_BY_SUBSYSTEM["block"])
    assert calls == ["storage"]
    calls.clear()
    watcher.refresh(None)
    assert sorted(calls) == ["cpu", "gpus", "memory", "network", "storage"]
    assert json.loads((tmp_path / "topology.json").read_text())["gpus"] == first["gpus"]


def test_a_card_llama_cpp_does_not_drive_is_named_with_the_reason():
    from host_runtime.discovery.gpus import _why_not_driven

    card = {"pci_address": "0000:65:00.0", "vendor": "nvidia", "driver": None}
    assert "no kernel driver" in _why_not_driven(card, [])
    assert "nvidia driver runs it, but no llama.cpp backend lists it" in _why_not_driven(dict(card, driver="nvidia"), [])
    assert "cannot be read: no libllama" in _why_not_driven(card, {"unavailable": "no libllama"})


def test_the_topology_lists_llama_cpps_devices_and_validates(doc):
    listed = doc["gpus"]["llama_devices"]
    assert isinstance(listed, list)  # the installed llama.cpp answered (no GPU here: an empty list)
    for d in listed:
        assert d["name"] and d["backend"] and d["total_bytes"] >= d["free_bytes"] >= 0
    topology.validate(doc)
