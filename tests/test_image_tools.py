"""The image build's pure parts: the apt mirror reader and the boot check's bundle and parsing.

The image itself is built and booted by `make image-dir-test` (CI) and `make image-test-full`."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from provisioning.bundle import open_bundle
from provisioning.validate import validate

REPO = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "image" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


apt_sources = _load("apt_sources")
boot_check = _load("boot_check")


def _apt_root(tmp_path: Path, sources_list: str = "", deb822: dict[str, str] | None = None) -> Path:
    root = tmp_path / "apt"
    (root / "sources.list.d").mkdir(parents=True)
    (root / "sources.list").write_text(sources_list)
    for name, text in (deb822 or {}).items():
        (root / "sources.list.d" / name).write_text(text)
    return root


def test_mirrors_from_deb822_sources(tmp_path):
    root = _apt_root(tmp_path, deb822={
        "debian.sources": "Types: deb\n# a comment\nURIs: http://mirror.example/debian/\nSuites: bookworm bookworm-updates\n"
                          "Components: main\n\nTypes: deb\nURIs: http://mirror.example/debian-security\n"
                          "Suites: bookworm-security\nComponents: main\n",
        "off.sources": "Types: deb\nURIs: http://elsewhere.example/debian\nSuites: bookworm\nEnabled: no\n",
        "src.sources": "Types: deb-src\nURIs: http://src.example/debian\nSuites: bookworm\n",
    })
    found = apt_sources.mirrors(apt_sources.read_entries(str(root)))
    assert found == {"archive": "http://mirror.example/debian", "security": "http://mirror.example/debian-security"}


def test_mirrors_from_one_line_sources_with_options(tmp_path):
    root = _apt_root(tmp_path, "# old style\ndeb [arch=amd64 signed-by=/k.gpg] http://m.example/debian bookworm main\n"
                               "deb-src http://m.example/debian bookworm main\n")
    found = apt_sources.mirrors(apt_sources.read_entries(str(root)))
    # No security line: Debian's layout puts it beside the archive.
    assert found == {"archive": "http://m.example/debian", "security": "http://m.example/debian-security"}


def test_no_debian_archive_is_a_clear_error(tmp_path):
    root = _apt_root(tmp_path, deb822={"node.sources": "Types: deb\nURIs: https://n.example/node\nSuites: nodistro\n"})
    with pytest.raises(apt_sources.SourcesError, match="no Debian archive"):
        apt_sources.mirrors(apt_sources.read_entries(str(root)))


def test_this_machines_sources_give_the_image_its_mirror(tmp_path):
    # The image build and CI run this on the host itself: it must find the mirror apt already uses.
    out = subprocess.run([sys.executable, str(REPO / "image/apt_sources.py"), "image", "trixie", str(tmp_path)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    written = (tmp_path / "etc/apt/sources.list.d/mkosi.sources").read_text()
    found = apt_sources.mirrors(apt_sources.read_entries())
    assert f"URIs: {found['archive']}\nSuites: trixie trixie-updates\n" in written
    assert f"URIs: {found['security']}\nSuites: trixie-security\n" in written
    assert written.count("Components: main\n") == 2


def test_the_nvidia_image_gets_the_non_free_components(tmp_path):
    # image/build.sh with NVIDIA=1: the driver, CUDA and the GSP firmware are in contrib/non-free(-firmware).
    out = subprocess.run([sys.executable, str(REPO / "image/apt_sources.py"), "image", "trixie", str(tmp_path),
                          "main", "contrib", "non-free", "non-free-firmware"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    written = (tmp_path / "etc/apt/sources.list.d/mkosi.sources").read_text()
    assert written.count("Components: main contrib non-free non-free-firmware\n") == 2


def test_the_boot_checks_bundle_is_valid(tmp_path):
    box = boot_check.Box(tmp_path)
    box.write_bundle(tmp_path / "bundle", {"name": "eth0", "mode": "static", "address": "10.231.9.2/30"})
    bundle = open_bundle(tmp_path / "bundle")
    assert validate(bundle) == []
    assert bundle.box["api"]["keys"][0]["sha256"] != box.api_key  # only the hash travels
    # a box with a static address is a fleet member lending its devices there, which the check then reaches
    assert bundle.box["fleet"] == {"role": "member", "key_file": "files/fleet.key", "shard_listen": "10.231.9.2:50052"}
    box.write_bundle(tmp_path / "dhcp", {"name": "eth0", "mode": "dhcp"})
    assert validate(open_bundle(tmp_path / "dhcp")) == [] and "fleet" not in open_bundle(tmp_path / "dhcp").box


def test_supervisor_status_parsing_and_the_expected_programs():
    text = ("bmc                              RUNNING   pid 40, uptime 0:00:19\n"
            "serving                          FATAL     Exited too quickly (process log may have details)\n")
    assert boot_check.parse_supervisor_status(text) == {"bmc": "RUNNING", "serving": "FATAL"}
    # The check must expect exactly the programs supervisor.d defines.
    programs = {p.stem for p in (REPO / "supervisor.d/programs").glob("*.conf")}
    assert boot_check.EXPECTED_PROGRAMS == programs


def test_the_boot_check_reads_the_backend_the_box_chose():
    metrics = ('# TYPE everycycle_backend_info gauge\n'
               'everycycle_backend_info{backend="cpu",device="CPU",reason="no GPU found by the Vulkan backend"} 1\n')
    assert boot_check.backend_info(metrics) == {"backend": "cpu", "device": "CPU",
                                                "reason": "no GPU found by the Vulkan backend"}
    assert boot_check.backend_info("everycycle_model_info{model=\"x\"} 1\n") == {}


def test_the_boot_check_reads_which_user_each_service_runs_as():
    rows = boot_check.parse_service_processes(
        "root     /opt/everycycle/venv/bin/python3 /opt/everycycle/venv/bin/supervisord -c x\n"
        "everycycle nginx: master process /usr/sbin/nginx -e stderr\n"
        "everycycle /opt/everycycle/venv/bin/python3 /opt/everycycle/venv/bin/everycycle governor run --state y\n")
    assert [u for u, _ in rows] == ["root", "everycycle", "everycycle"]
    assert all(any(a in args for a in boot_check.ROOT_ALLOWED) for u, args in rows if u == "root")
    # Each program runs as its own service's user (#35 item 6): nginx as the front's, not everycycle.
    expected = {
        "/opt/everycycle/venv/bin/python3 /opt/everycycle/venv/bin/supervisord -c x": "root",
        "nginx: master process /usr/sbin/nginx -e stderr": "everycycle-front",
        "/opt/everycycle/venv/bin/python3 /opt/everycycle/venv/bin/everycycle front run --settings f": "everycycle-front",
        "/opt/everycycle/venv/bin/python3 /opt/everycycle/venv/bin/everycycle bmc --settings b": "everycycle-bmc",
        "/opt/everycycle/venv/bin/python3 /opt/everycycle/venv/bin/everycycle fleet gateway --if-gateway": "everycycle-fleet",
        "/opt/everycycle/venv/bin/python3 -m host_runtime.fleet.router_main --host 127.0.0.1": "everycycle-fleet",
        "/opt/everycycle/venv/bin/python3 /opt/everycycle/venv/bin/everycycle serve --settings s": "everycycle",
        "/opt/everycycle/venv/bin/python3 -m host_runtime.cli engine --socket e": "everycycle",
        "/opt/everycycle/venv/bin/python3 /opt/everycycle/venv/bin/everycycle governor run --state y": "everycycle",
    }
    assert {args: boot_check.expected_user(args) for args in expected} == expected
    mismatched = [args for u, args in rows if boot_check.expected_user(args) not in (None, u)]
    assert mismatched == ["nginx: master process /usr/sbin/nginx -e stderr"]
    assert boot_check.secret_owners("/etc/everycycle/tls/box.key everycycle-front 600\n"
                                    "/etc/everycycle/api_keys.json everycycle 600\n") == []
    assert boot_check.secret_owners("/etc/everycycle/tls/ca.key everycycle 600\n"
                                    "/etc/everycycle/bmc.password everycycle-bmc 640\n") == [
        "/etc/everycycle/tls/ca.key: everycycle 600, expected everycycle-front 600",
        "/etc/everycycle/bmc.password: everycycle-bmc 640, expected everycycle-bmc 600"]


class _StillBox:
    """A box that stays up and never shows what is waited for."""

    def alive(self) -> bool:
        return True

    def log_tail(self) -> str:
        return "console: last line"

    def stop(self) -> float:
        return 0.5


def test_a_timed_out_wait_says_what_the_box_showed_and_a_failed_run_ends_with_its_error(tmp_path, capsys):
    import time

    with pytest.raises(boot_check.CheckFailed) as err:
        boot_check.wait_until(_StillBox(), "version 2", time.monotonic() + 0.05, lambda: None,
                              explain=lambda: "last /health system {'version': '1'}")
    assert str(err.value).index("last /health system {'version': '1'}") < str(err.value).index("console: last line")

    def body():
        raise err.value

    assert boot_check.run_and_report(_StillBox(), tmp_path, {}, body) == 1
    out = capsys.readouterr()
    assert '"ok": false' in out.out
    last = out.err.strip().splitlines()[-1]   # a CI log's tail shows the cause, not only the summary's last keys
    assert "FAILED" in last and "timed out waiting for version 2" in last and str(tmp_path) in last


def test_a_disk_is_not_signed_with_the_development_key_unless_asked_for_by_name():
    """The third hardening review: `make image` signed a release with a development update key without refusing."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("UPDATE_KEY", "DEV_UPDATE_KEY")}
    out = subprocess.run(["bash", "image/build.sh", "disk"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 2 and "needs UPDATE_KEY=FILE" in out.stderr and "DEV_UPDATE_KEY=1" in out.stderr
    assert out.stdout == ""  # refused before anything was built


def _gate():
    spec = importlib.util.spec_from_file_location("update_test_gate", REPO / ".ci" / "update_test_gate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_update_tests_inputs_follow_the_update_codes_imports_and_no_further():
    inputs = _gate().input_files()
    assert "host_runtime/update/gate.py" in inputs and "image/update_check.py" in inputs
    assert "rootfs_overlay/etc/everycycle/defaults.env" in inputs and "mkosi.conf" in inputs
    # imported by the update code, at any depth (the signature check, the health gate's readiness reading)
    assert "host_runtime/common/ed25519.py" in inputs and "host_runtime/engine/readiness.py" in inputs
    # not reached from it: serving's and the scheduler's changes leave the recorded pass standing
    assert "host_runtime/serving/app.py" not in inputs and "host_runtime/engine/scheduler.py" not in inputs
    assert all(len(blob) == 40 for blob in inputs.values())


def test_ci_leans_on_a_recorded_pass_only_while_every_input_is_unchanged(tmp_path, monkeypatch, capsys):
    gate = _gate()
    monkeypatch.setattr(gate, "RECORD", tmp_path / "passed.json")
    assert gate.check() == 1 and "no passing run is recorded" in capsys.readouterr().out
    now = gate.input_files()
    record = {"commit": "abc", "date": "2026-12-03", "steps": ["tamper", "update"], "how": "a test", "inputs": now}
    gate.RECORD.write_text(json.dumps(record))
    assert gate.check() == 0 and "unchanged since it passed on abc" in capsys.readouterr().out
    changed = dict(now, **{"image/build.sh": "0" * 40})
    gate.RECORD.write_text(json.dumps(dict(record, inputs=changed)))
    assert gate.check() == 1 and "1 of its inputs changed" in capsys.readouterr().out
    fewer = {k: v for k, v in now.items() if k != "host_runtime/update/gate.py"}
    gate.RECORD.write_text(json.dumps(dict(record, inputs=fewer)))
    assert gate.check() == 1 and "host_runtime/update/gate.py" in capsys.readouterr().out
    gate.RECORD.write_text(json.dumps(dict(record, steps=["tamper"])))
    assert gate.check() == 1 and "lacks steps ['update']" in capsys.readouterr().out


def test_the_committed_record_matches_this_trees_update_inputs_or_ci_runs_the_test():
    # Not an assertion that it matches (a change to the update path is meant to make CI run the test): the check
    # must answer without error either way, and its record must name the steps CI needs.
    gate = _gate()
    record = json.loads(gate.RECORD.read_text())
    assert set(gate.CI_STEPS) <= set(record["steps"]) and record["inputs"]
    assert gate.check() in (0, 1)


def test_the_test_extras_are_not_an_input_of_the_update_test_but_the_dependencies_are(tmp_path, monkeypatch):
    gate = _gate()
    monkeypatch.setattr(gate, "REPO", tmp_path)
    base = ('[project]\nname = "x"\nversion = "1"\ndependencies = ["falcon==4.0.0"]\n'
            '[project.optional-dependencies]\ntest = ["pytest==8.4.2"]\n')
    (tmp_path / "pyproject.toml").write_text(base)
    first = gate._image_part_of_pyproject()
    (tmp_path / "pyproject.toml").write_text(base.replace('["pytest==8.4.2"]', '["pytest==8.4.2", "openai-agents"]'))
    assert gate._image_part_of_pyproject() == first
    (tmp_path / "pyproject.toml").write_text(base.replace("falcon==4.0.0", "falcon==4.0.1"))
    assert gate._image_part_of_pyproject() != first
