"""The Grafana dashboard shipped for the box queries only metrics the box exports: the serving API's /metrics
(the engine, and the governor's file it joins in), and the BMC agent's (ipmi_exporter's names)."""

from __future__ import annotations

import json
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.servers import REPO, Proc, everycycle, free_port, http_get, wait_for

DASHBOARD = REPO / "rootfs_overlay/usr/share/everycycle/grafana/everycycle-box.json"
PROMQL_WORDS = {"sum", "by", "rate", "histogram_quantile", "le", "instance", "model", "tier", "gpu", "state", "name"}


def _queried(doc: dict) -> set[str]:
    names = set()
    for panel in doc["panels"]:
        for target in panel["targets"]:
            expr = re.sub(r'"[^"]*"', '""', target["expr"])  # label values are not metric names
            names |= {w for w in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr)
                      if w.startswith(("everycycle_", "ipmi_"))}
    return names


def _sample_names(text: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def _governor_text(tmp_path) -> str:
    from host_runtime.governor.backends import SimulatorBackend
    from host_runtime.governor.control import PowerPolicy
    from host_runtime.governor.service import Governor

    gov = Governor(SimulatorBackend(2, 25.0, 60.0), PowerPolicy(), mode="observe", state_path=tmp_path / "g.json")
    for _ in range(3):
        gov.tick(1.0)
    return (tmp_path / "g.prom").read_text()


def _bmc_text() -> str:
    from agent_bmc.metrics import render

    sensor = {"id": 1, "health": "ok"}
    return render({"up": True, "stale": False, "power": {"current_w": 310.0}, "sel": {"count": 2}, "sensors": [
        {**sensor, "name": "Inlet Temp", "type": "temperature", "value": 24.0},
        {**sensor, "id": 2, "name": "FAN1", "type": "fan", "value": 5400.0},
        {**sensor, "id": 3, "name": "PSU1 Power", "type": "power", "value": 300.0}]})


def test_the_dashboard_is_an_importable_grafana_document():
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] and doc["title"] and doc["schemaVersion"] >= 30 and doc["panels"]
    assert [i["pluginId"] for i in doc["__inputs"]] == ["prometheus"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)) and all(p["targets"] for p in doc["panels"])


@pytest.mark.system
def test_every_metric_the_dashboard_queries_is_exported(server, tmp_path):
    served = http_get(server + "/metrics")[1].decode()
    exported = _sample_names(served) | _sample_names(_governor_text(tmp_path)) | _sample_names(_bmc_text())
    queried = _queried(json.loads(DASHBOARD.read_text()))
    assert len(queried) > 20
    assert queried <= exported, sorted(queried - exported)


@pytest.mark.system
def test_serving_metrics_join_the_governors_and_say_up_0_with_a_200(tmp_path):
    """No engine answers here: everycycle_up 0 comes with a 200 (Prometheus drops a 503's samples), and the
    governor's Prometheus file is in the same answer while its state (written with it) is fresh."""
    state = tmp_path / "governor.json"
    _governor_text(tmp_path)
    (tmp_path / "g.prom").rename(state.with_suffix(".prom"))
    (tmp_path / "g.json").rename(state)
    port = free_port()
    proc = Proc(everycycle("serve", "--port", str(port), "--engine-socket", str(tmp_path / "none.sock"),
                           "--governor-state", str(state), "--metrics-access", "open", "--workers", "1"),
                tmp_path / "serve.log")
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: _ok(base + "/health"), 30, "the front end", proc)
        status, body = http_get(base + "/metrics")
        samples = {s.name: s for f in text_string_to_metric_families(body.decode()) for s in f.samples}
        assert status == 200 and samples["everycycle_up"].value == 0
        assert "everycycle_governor_temperature_celsius" in samples
    finally:
        proc.stop()


def _ok(url: str) -> bool:
    try:
        return http_get(url)[0] == 200
    except OSError:
        return False
