"""The console against real services: serving, the governor on the simulator, the BMC agent on ipmi_sim,
discovery, and supervisord; driven through textual's pilot, plus an SVG snapshot of the layout."""

from __future__ import annotations

import re
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from host_runtime.console.app import Dashboard
from host_runtime.common.supervisor_rpc import supervisor_proxy
from host_runtime.box_status.reader import StatusConfig, StatusReader
from host_runtime.box_status.rows import BoxStatus, Serving, Source
from host_runtime.console.status_text import render
from tests.conftest import MODEL_ID
from tests.equipment.ipmi_sim_env import PASSWORD, USER, IpmiSim
from tests.servers import Proc, free_port, wait_for

BIN = Path(sys.executable).parent


@pytest.fixture
def box(tmp_path, server, api_key):
    """The services a box runs, each real, publishing into one run directory."""
    run = tmp_path / "run"
    run.mkdir()
    sim = IpmiSim(tmp_path / "bmc")
    pw = tmp_path / "pw"
    pw.write_text(PASSWORD)
    os.chmod(pw, 0o600)
    bmc_port = free_port()
    (tmp_path / "supervisord.conf").write_text(f"""[supervisord]
nodaemon=true
logfile={tmp_path}/supervisord.log
pidfile={run}/supervisord.pid
[unix_http_server]
file={run}/supervisor.sock
[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface
[program:serving]
command=sleep 1000
[program:discovery]
command={BIN}/everycycle discover --watch --output {run}/discovery/topology.json
[program:governor]
command={BIN}/everycycle governor run --backend simulator --sim-speed 30 --tick 0.2 --state {run}/governor/governor.json
[program:bmc]
command={BIN}/everycycle bmc --backend ipmi --host 127.0.0.1 --port {sim.port} --user {USER} --password-file {pw} --listen 127.0.0.1:{bmc_port} --period 0.5
""")
    sup = Proc([str(BIN / "supervisord"), "-c", str(tmp_path / "supervisord.conf")], tmp_path / "sup.out")
    provisioned = tmp_path / "root" / "var/lib/everycycle"
    provisioned.mkdir(parents=True)
    (provisioned / "provisioned.json").write_text(json.dumps({"provisioned": True, "digest": "ab" * 32, "history": [
        {"digest": "ab" * 32, "applied_at": "2026-11-29T12:00:00+00:00", "hostname": "box-1"}]}))
    config = StatusConfig(run_dir=run, serving_url=server, bmc_url=f"http://127.0.0.1:{bmc_port}/telemetry",
                           keys_file=Path(api_key[0]), api_port=int(server.rsplit(":", 1)[1]),
                           provision_root=tmp_path / "root")
    reader = StatusReader(config)
    try:
        wait_for(lambda: (run / "discovery" / "topology.json").exists()
                 and (run / "governor" / "governor.json").exists(), 30, "the services")
        wait_for(lambda: any(c["name"] == "Inlet Temp" for c in reader.read().chassis), 30, "the BMC agent")
        wait_for(lambda: set(reader.read().services.values()) == {"RUNNING"}, 30, "every program RUNNING")
        yield reader, sim, run
    finally:
        try:
            supervisor_proxy(run / "supervisor.sock").supervisor.shutdown()
        except Exception:
            pass
        sup.popen.wait(timeout=30)
        sup.stop()
        sim.stop()


def test_the_data_layer_reads_what_the_services_publish(box):
    reader, sim, run = box
    s = reader.read()
    assert s.serving.source.ok and s.serving.ready and s.serving.model == MODEL_ID
    assert [g["id"] for g in s.gpus] == ["simulated-gpu-0", "simulated-gpu-1"]
    governor = json.loads((run / "governor" / "governor.json").read_text())
    assert s.throttle_level == governor["throttle_level"]
    inlet = next(c for c in s.chassis if c["name"] == "Inlet Temp")
    assert inlet["value"] == 24.0 and inlet["health"] == "ok"
    assert s.services == {"serving": "RUNNING", "discovery": "RUNNING", "governor": "RUNNING", "bmc": "RUNNING"}
    topo = json.loads((run / "discovery" / "topology.json").read_text())
    global_addrs = [a["address"] for link in topo["network"] if link["kind"] != "loopback" for a in link["addresses"]
                    if a["scope"] == "global"]
    assert len(s.api_urls) == max(1, len(global_addrs))
    text = render(s)  # `everycycle status` prints the same facts
    assert MODEL_ID in text and "Inlet Temp: 24.0" in text and "serving RUNNING" in text
    assert "VRAM 4.0/24 GiB" in text  # the simulator's cards, through the governor's state


def test_the_dashboard_shows_live_values_and_the_keys_work(box, api_key):
    import asyncio

    asyncio.run(_drive_dashboard(box, api_key))


async def _drive_dashboard(box, api_key):
    reader, sim, run = box
    app = Dashboard(reader, tick_s=0.5)
    async with app.run_test(size=(120, 32)) as pilot:
        await _until(pilot, lambda: app.reads >= 1)
        screen = lambda: "\n".join(str(w.render()) for w in app.query("Static"))  # noqa: E731
        assert MODEL_ID in screen() and "Inlet Temp" in screen() and "simulated-gpu-0" in screen()
        assert "provision" in screen() and "applied bundle abababababab (box-1)" in screen()  # the record, as an event
        assert app.status.api_urls[0] in screen()

        sim.set_raw(1, 47)  # the inlet goes critical in the simulator...
        await _until(pilot, lambda: "Inlet Temp" in screen() and "critical" in screen(), timeout=15)

        proxy = supervisor_proxy(run / "supervisor.sock")
        proxy.supervisor.stopProcess("discovery", True)  # ...a service stops...
        await _until(pilot, lambda: "discovery:STOPPED" in screen(), timeout=10)

        await pilot.press("k")  # key hint: the name and hint, never the key
        await _until(pilot, lambda: "API keys: tests:" in screen())
        assert api_key[1] not in screen()

        await pilot.press("g")
        await _until(pilot, lambda: app.screen.__class__.__name__ == "GpuDetails")
        assert "simulated-gpu-1" in str(app.screen.query_one("#gpu-details").render())
        await pilot.press("escape")

        pid_before = proxy.supervisor.getProcessInfo("serving")["pid"]
        await pilot.press("r")
        await _until(pilot, lambda: "restarted serving" in screen(), timeout=15)
        assert proxy.supervisor.getProcessInfo("serving")["pid"] != pid_before

        await pilot.press("q")  # quitting is not enabled
        await _until(pilot, lambda: "not enabled" in screen())
        assert app.is_running


async def _until(pilot, predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        await pilot.pause(0.2)
    raise AssertionError("the dashboard did not show it in time")


class FixedReader:
    """A reader with fixed figures, for the layout snapshot (live values would change every run)."""

    config = StatusConfig(run_dir=Path("/nonexistent"))

    def read(self) -> BoxStatus:
        return BoxStatus(
            box_name="box-1", version="0.1.0", uptime_s=7200, api_urls=["http://192.168.1.20:8080/v1"],
            serving=Serving(Source(True, "answering"), ready=True, ready_reason="canary passed recently",
                            model=MODEL_ID, running=3, waiting=1, tokens_total=1000, tokens_per_s=128.5,
                            ttft_p50_s=0.25, prefix_hit_ratio=0.4),
            gpus=[{"id": "gpu-0", "name": "RTX 3090", "temperature_c": 74.5, "power_w": 260.0,
                   "applied_limit_w": 280.0, "target_c": 75.0, "state": "controlling",
                   "vram_used_bytes": 6 << 30, "vram_total_bytes": 24 << 30}],
            governor=Source(True, "nvml backend, observe mode"), throttle_level=0,
            chassis=[{"name": "Inlet Temp", "value": 47.0, "units": "°C", "health": "critical"},
                     {"name": "FAN1", "value": 3000.0, "units": "RPM", "health": "ok"}],
            bmc=Source(True, "ipmi: ok"), services={"serving": "RUNNING", "governor": "RUNNING"},
            supervisor=Source(True, "answering"), cpu_percent=42.0, ram_used_percent=31.0,
            events=[{"at": "12:00:01", "source": "governor", "detail": "gpu-0 idle -> controlling"}],
            token_history=[10, 40, 90, 128, 120, 130])

    def key_hint(self) -> str:
        return "dev: ec-AbCd…wxyz"


def test_layout_snapshot(snap_compare):
    assert snap_compare(Dashboard(FixedReader(), tick_s=60), terminal_size=(120, 32))


def test_first_boot_keys_are_shown_once_on_the_screen_and_then_forgotten(tmp_path):
    from host_runtime.auth.new_keys import write_new_keys

    keys_file = tmp_path / "run" / "new-keys.json"
    write_new_keys(keys_file, {"owner": "ec-ThisIsTheOwnersKey"})
    assert keys_file.stat().st_mode & 0o777 == 0o600

    class Reader(FixedReader):
        config = StatusConfig(run_dir=tmp_path, new_keys_file=keys_file)

    async def drive():
        app = Dashboard(Reader(), tick_s=60)
        async with app.run_test(size=(120, 32)) as pilot:
            await _until(pilot, lambda: app.screen.__class__.__name__ == "NewKeys")
            assert "ec-ThisIsTheOwnersKey" in str(app.screen.query_one("#new-keys").render())
            await pilot.press("enter")
            await _until(pilot, lambda: app.screen.__class__.__name__ != "NewKeys")
        assert not keys_file.exists()
        # A second start shows nothing: the key is gone from the box.
        again = Dashboard(Reader(), tick_s=60)
        async with again.run_test(size=(120, 32)) as pilot:
            await pilot.pause(0.5)
            assert again.screen.__class__.__name__ != "NewKeys"

    import asyncio

    asyncio.run(drive())


def _console_on_a_pty(tmp_path):
    """`everycycle console` on a fresh pty that is not its controlling terminal (as under a tmux session killed
    or an SSH session dropped, where no SIGHUP may come): (process, the pty's master), once it has drawn."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen([str(BIN / "everycycle"), "console", "--run-dir", str(tmp_path / "run"), "--tick", "0.5",
                             "--provision-root", str(tmp_path / "root"), "--bundle-dir", str(tmp_path / "bundle")],
                            stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                            env={**os.environ, "TERM": "xterm-256color"})
    os.close(slave)
    drawn, deadline = b"", time.monotonic() + 60
    while len(drawn) < 2000 and time.monotonic() < deadline:
        if select.select([master], [], [], 1)[0]:
            drawn += os.read(master, 1 << 16)
    assert len(drawn) >= 2000, drawn[-500:]
    return proc, master


@pytest.mark.system
def test_the_console_exits_when_its_terminal_goes_away(tmp_path):
    """It was found spinning at 83% of a core three minutes after its pty was closed."""
    (tmp_path / "run").mkdir()
    proc, master = _console_on_a_pty(tmp_path)
    os.close(master)
    try:
        assert proc.wait(timeout=10) == 129
    finally:
        proc.kill()


@pytest.mark.system
def test_the_console_exits_on_sighup(tmp_path):
    import signal

    (tmp_path / "run").mkdir()
    proc, master = _console_on_a_pty(tmp_path)
    try:
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(timeout=10) == 129
    finally:
        proc.kill()
        os.close(master)


def test_the_connect_screen_says_how_to_trust_the_certificate_and_set_up_each_tool():
    """Node clients and Open WebUI in Docker each needed the certificate installed by hand, and nothing told the
    owner how (#37)."""
    import asyncio
    import dataclasses

    from host_runtime.console.connect import connect_lines

    from host_runtime.front.trust import TrustAnchor

    fp = "AB:CD:" + ":".join(["00"] * 30)
    anchor = TrustAnchor("local-ca", "http://box-1.local:8080/ca.crt")
    lines = "\n".join(connect_lines(["https://10.0.0.5:8443/v1", "https://box-1.local:8443/v1"], fp, anchor))
    assert "curl -fsSk -o everycycle-ca.crt http://box-1.local:8080/ca.crt" in lines
    assert f"SHA256 Fingerprint={fp}" in lines and "NODE_EXTRA_CA_CERTS" in lines and "SSL_CERT_FILE" in lines
    assert "update-ca-certificates" in lines and "also: https://box-1.local:8443" in lines
    # The status's URLs end in /v1: each tool gets the root it appends its own path to (not /v1/v1).
    assert "ANTHROPIC_BASE_URL=https://10.0.0.5:8443 " in lines and "base URL https://10.0.0.5:8443/v1," in lines
    assert "/v1/v1" not in lines
    legacy = "\n".join(connect_lines(["https://10.0.0.5:8443/v1"], fp,
                                     TrustAnchor("self-signed", "http://box-1.local:8080/everycycle.crt")))
    assert "curl -fsSk -o everycycle.crt http://box-1.local:8080/everycycle.crt" in legacy
    assert "curl" not in "\n".join(connect_lines(["http://127.0.0.1:8080/v1"], None))  # nothing to trust in clear
    assert connect_lines([], None)[0].startswith("no address yet")

    class HttpsReader(FixedReader):
        config = dataclasses.replace(FixedReader.config, tls_anchor=anchor)

        def read(self):
            return dataclasses.replace(super().read(), api_urls=["https://10.0.0.5:8443"], tls_fingerprint=fp)

    app = Dashboard(HttpsReader(), tick_s=60)

    async def drive():
        async with app.run_test(size=(140, 40)) as pilot:
            await pilot.pause(0.5)
            await pilot.press("c")
            await pilot.pause(0.3)
            assert app.screen.__class__.__name__ == "Connect"
            shown = str(app.screen.query_one("#connect").render())
            assert fp in shown and "NODE_EXTRA_CA_CERTS" in shown

    asyncio.run(drive())


def test_the_models_screen_pulls_switches_and_removes_models(tmp_path):
    """The console could not pull, switch or remove a model: the model serve starts with changed only by editing
    serving.toml over SSH (#37)."""
    import asyncio
    import threading

    from host_runtime.common import settings_file
    from host_runtime.models import pull as pulling
    from host_runtime.models.store import Store
    from host_runtime.serving.settings import ServingSettings
    from tests.file_server import Files
    from tests.tiny_gguf import write_tiny_llama

    files = tmp_path / "files"
    files.mkdir()
    write_tiny_llama(files / "tiny-pulled.gguf", n_ctx=256)
    server = Files(files)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    store = Store(tmp_path / "store")
    pulling.add(store, write_tiny_llama(tmp_path / "tiny-a.gguf", n_ctx=256), say=lambda line: None)
    settings = tmp_path / "serving.toml"
    settings_file.save(ServingSettings(context_length=2048), settings)
    config = StatusConfig(run_dir=tmp_path / "run", serving_url="http://127.0.0.1:9", bmc_url=None,
                           provision_root=tmp_path / "root", bundle_dir=tmp_path / "bundle",
                           model_store=store.root, serving_settings=settings)
    (tmp_path / "root/var/lib/everycycle").mkdir(parents=True)
    (tmp_path / "root/var/lib/everycycle/provisioned.json").write_text('{"provisioned": true}')
    app = Dashboard(StatusReader(config), tick_s=30)

    async def wait_for_status(pilot, screen, text):
        for _ in range(100):
            if text in str(screen.query_one("#models-status").render()):
                return
            await pilot.pause(0.1)
        raise AssertionError(str(screen.query_one("#models-status").render()))

    async def drive():
        async with app.run_test(size=(140, 40)) as pilot:
            await pilot.pause(0.3)
            await pilot.press("m")
            await pilot.pause(0.3)
            screen = app.screen
            assert screen.__class__.__name__ == "Models" and screen.names == ["tiny-a"]
            assert "built-in model" in str(screen.query_one("#models-status").render())
            for _ in range(100):  # the selected model's verdict, planned off the UI thread
                if "fits:" in str(screen.query_one("#models-verdict").render()):
                    break
                await pilot.pause(0.1)
            verdict = str(screen.query_one("#models-verdict").render())
            assert verdict.startswith("tiny-a: ") and "fits: 256-token context of 256 trained" in verdict
            await pilot.press("n")
            await wait_for_status(pilot, screen, "tiny-a pinned")
            assert store.get("tiny-a").pinned and "pinned" in str(screen.query_one("#models").get_option_at_index(0).prompt)
            await pilot.press("n")
            await wait_for_status(pilot, screen, "tiny-a unpinned")
            assert not store.get("tiny-a").pinned
            await pilot.press("p")
            await pilot.pause(0.2)  # the input line takes the focus
            await pilot.press(*f"{server.base}/tiny-pulled.gguf", "enter")
            await wait_for_status(pilot, screen, "pulled tiny-pulled")
            assert screen.names == ["tiny-a", "tiny-pulled"]
            screen.query_one("#models").highlighted = 1
            await pilot.press("d")
            await wait_for_status(pilot, screen, "default model: tiny-pulled")
            await pilot.press("x")
            await pilot.pause(0.2)
            await pilot.press(*"tiny-pulle", "enter")  # not its name: kept
            await wait_for_status(pilot, screen, "tiny-pulled kept")
            screen.query_one("#models").highlighted = 0
            await pilot.press("x")
            await pilot.pause(0.2)
            await pilot.press(*"tiny-a", "enter")
            await wait_for_status(pilot, screen, "removed tiny-a")
            assert screen.names == ["tiny-pulled"]

    try:
        asyncio.run(drive())
    finally:
        server.shutdown()
    serving = settings_file.load(ServingSettings, settings)
    assert serving.model == str(store.path_of(store.get("tiny-pulled")).resolve())
    assert serving.context_length == 2048  # every other setting kept


def test_the_top_users_come_from_the_per_key_usage_of_every_model():
    """Nobody could see who used the box from its console (#38): the keys that generated most, summed over every
    model's engine, on the dashboard and in `everycycle status`."""
    from host_runtime.box_status.rows import Serving, Source, top_users
    from host_runtime.console.status_text import users_line

    metrics = "\n".join([
        'everycycle_key_requests_total{model="a",key="alice"} 4', 'everycycle_key_generated_tokens_total{model="a",key="alice"} 900',
        'everycycle_key_requests_total{model="b",key="alice"} 1', 'everycycle_key_generated_tokens_total{model="b",key="alice"} 200',
        'everycycle_key_requests_total{model="a",key="nightly"} 40', 'everycycle_key_generated_tokens_total{model="a",key="nightly"} 5000',
        'everycycle_key_requests_total{model="a",key="bob"} 2', 'everycycle_key_generated_tokens_total{model="a",key="bob"} 10',
        'everycycle_key_requests_total{model="a",key="carol"} 1', 'everycycle_key_generated_tokens_total{model="a",key="carol"} 3',
    ]) + "\n"
    assert top_users(metrics) == [("nightly", 40, 5000), ("alice", 5, 1100), ("bob", 2, 10)]
    line = users_line(Serving(Source(True, ""), top_users=top_users(metrics)))
    assert line == "top users: nightly 5,000 tok (40 req), alice 1,100 tok (5 req), bob 10 tok (2 req)"
    assert users_line(Serving(Source(True, ""))) is None and top_users("") == []


def test_the_models_screen_snapshot(snap_compare, tmp_path):
    """The models panel as the owner sees it: the store's models, the default marked, a pinned one, and the
    selected model's verdict (a fixed topology: 16 GiB, no GPU)."""
    import json

    from host_runtime.common import settings_file
    from host_runtime.console.models_screen import Models
    from host_runtime.models import pull as pulling
    from host_runtime.models.store import Store
    from host_runtime.serving.settings import ServingSettings
    from tests.tiny_gguf import write_tiny_llama
    from textual.app import App

    store = Store(tmp_path / "store")
    for name, seed in (("tiny-chat", 0), ("tiny-code", 1)):
        pulling.add(store, write_tiny_llama(tmp_path / f"{name}.gguf", n_ctx=256, seed=seed), say=lambda line: None)
    store.set_pinned("tiny-code", True)
    settings = tmp_path / "serving.toml"
    settings_file.save(ServingSettings(model=str(store.path_of(store.get("tiny-chat")).resolve()),
                                       context_length=2048), settings)
    (tmp_path / "run" / "discovery").mkdir(parents=True)
    (tmp_path / "run" / "discovery" / "topology.json").write_text(json.dumps(
        {"gpus": {"llama_devices": []}, "memory": {"available_bytes": 12 << 30, "total_bytes": 16 << 30}}))

    class ModelsApp(App):
        def on_mount(self):
            self.push_screen(Models(store.root, settings, tmp_path / "run"))

    async def judged(pilot):
        for _ in range(100):
            if "fits:" in str(pilot.app.screen.query_one("#models-verdict").render()):
                return
            await pilot.pause(0.1)
        raise AssertionError("no verdict shown")

    assert snap_compare(ModelsApp(), terminal_size=(120, 16), run_before=judged)


def test_the_models_screen_searches_the_hub_and_shows_each_quantizations_fit(snap_compare, tmp_path, monkeypatch):
    """#59: `s` on the models screen asks the Hub (a loopback one at HF_ENDPOINT) for GGUF repositories and shows each
    quantization's size, its fit by size against the room discovery saw (16 GiB, no GPU: a tiny Q8_0 likely fits, a
    63 GB MXFP4 is too big) and the name `p` pulls it by; the snapshot is that screen."""
    import json

    from host_runtime.console.models_screen import Models
    from host_runtime.models.store import Store
    from tests.file_server import serve_files
    from tests.sparse_gguf import gpt_oss_120b
    from tests.tiny_gguf import write_tiny_llama
    from textual.app import App

    repo = tmp_path / "repo"
    repo.mkdir()
    gpt_oss_120b(repo / "big-model-MXFP4.gguf")
    write_tiny_llama(repo / "big-model-Q8_0.gguf", n_ctx=256)
    server = serve_files(repo)
    server.models = [{"id": "someone/big-model", "downloads": 10, "likes": 1, "tags": ["gguf"]}]
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    store = Store(tmp_path / "store")
    (tmp_path / "run" / "discovery").mkdir(parents=True)
    (tmp_path / "run" / "discovery" / "topology.json").write_text(json.dumps(
        {"gpus": {"llama_devices": []}, "memory": {"available_bytes": 12 << 30, "total_bytes": 16 << 30}}))

    class ModelsApp(App):
        def on_mount(self):
            self.push_screen(Models(store.root, None, tmp_path / "run"))

    async def searched(pilot):
        await pilot.pause(0.3)
        await pilot.press("s")
        await pilot.pause(0.2)
        await pilot.press(*"big", "enter")
        for _ in range(200):
            shown = str(pilot.app.screen.query_one("#models-verdict").render())
            if "someone/big-model" in shown:
                break
            await pilot.pause(0.1)
        assert "someone/big-model" in shown, shown
        assert re.search(r"Q8_0 +[\d.]+ MiB +likely fits +hf://someone/big-model:Q8_0", shown), shown
        assert re.search(r"MXFP4 +5\d\.\d GiB +too big", shown), shown
        assert "room here 12.0 GiB" in shown

    try:
        assert snap_compare(ModelsApp(), terminal_size=(120, 30), run_before=searched)
    finally:
        server.shutdown()
