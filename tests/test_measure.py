"""`everycycle measure`: the requirement's parser, the document's check, and a real run against a real box whose
document cites only labels that exist, with the JSON's figures."""

from __future__ import annotations

import json
import subprocess

import pytest

from host_runtime.common.settings_file import SettingsError
from host_runtime.measure.report import Report, check, fmt, render
from host_runtime.measure.requirement import Requirement, load
from tests.servers import everycycle

SMALL = "[requirement]\nttft_p50_s = 5.0\ntime_per_token_s = 0.5\nconcurrent_users = 2\nprompt_tokens = 96\n" \
        "answer_tokens = 12\n"


def test_the_requirement_comes_from_box_toml_and_bad_fields_are_named(tmp_path):
    box = tmp_path / "box.toml"
    box.write_text('hostname = "b"\n' + SMALL)
    assert load(box) == Requirement(5.0, 0.5, 2, 96, 12)
    assert load(tmp_path / "absent.toml") == Requirement()
    for text, field in [("[requirement]\nconcurrent_users = 0\n", "requirement.concurrent_users"),
                        ("[requirement]\nprompt_tokens = 1.5\n", "requirement.prompt_tokens"),
                        ("[requirement]\nttft_p50_s = \"fast\"\n", "requirement.ttft_p50_s"),
                        ("[requirement]\nlatency = 1\n", "requirement.latency")]:
        box.write_text(text)
        with pytest.raises(SettingsError) as err:
            load(box)
        assert err.value.field == field


def small_report() -> dict:
    r = Report("box", Requirement(2.0, 0.1, 4, 512, 128))
    r.stated()
    r.measured("box0.prefill_s", 0.8123, "s", "test")
    r.measured("box0.prefill_tokens", 530, "tokens", "test")
    r.measured("box0.kv_bytes_per_token", 9216, "bytes", "test")
    r.derived("box0.kv_bytes_per_request", "{box0.kv_bytes_per_token} * {requirement.prompt_tokens}", "bytes", "t")
    r.measured("load.ttft_p50_s", 1.5, "s", "t")
    r.measured("load.time_per_token_p50_s", 0.05, "s", "t")
    r.measured("load.tokens_per_s", 40.2, "tokens/s", "t")
    r.decisions.append({"text": "Fine.", "labels": ["box0.prefill_s", "box0.kv_bytes_per_request"]})
    return r.to_json()


def test_a_rendered_document_passes_its_check_and_a_changed_figure_or_label_does_not():
    doc = small_report()
    assert doc["figures"]["box0.kv_bytes_per_request"]["value"] == 9216 * 512
    text = render(doc)
    assert check(text, doc) == []
    assert f"**{fmt(0.8123)} s** [`box0.prefill_s`]" in text
    assert check(text.replace(f"**{fmt(0.8123)} s**", "**0.5 s**"), doc)            # a figure edited by hand
    assert check(text.replace("[`box0.prefill_s`]", "[`box0.prefil_s`]"), doc)      # a label that does not exist
    doc["figures"]["box0.kv_bytes_per_request"]["value"] += 1                        # arithmetic that does not add up
    assert any("kv_bytes_per_request" in p for p in check(render(doc), doc))


@pytest.mark.system
def test_measure_on_a_real_box_writes_figures_and_a_document_that_cites_them(tmp_path, server, api_key):
    box = tmp_path / "box.toml"
    box.write_text(SMALL)
    key = tmp_path / "key"
    key.write_text(api_key[1] + "\n")
    out, doc_path = tmp_path / "measurements.json", tmp_path / "architecture.md"
    run = subprocess.run(everycycle("measure", "--url", server, "--key-file", str(key), "--box-toml", str(box),
                                    "--json", str(out), "--doc", str(doc_path)),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    doc = json.loads(out.read_text())
    text = doc_path.read_text()
    assert check(text, doc) == []
    f = doc["figures"]
    assert f["requirement.prompt_tokens"]["value"] == 96 and f["requirement.concurrent_users"]["value"] == 2
    assert 0 < f["box0.prefill_s"]["value"] < 120 and f["box0.prefill_tokens"]["value"] >= 48
    assert f["link.box0.mbytes_per_s"]["value"] > 0 and f["link.box0.rtt_ms"]["value"] > 0
    assert f["box0.kv_bytes_per_token"]["value"] > 0
    assert f["box0.kv_bytes_per_request"]["value"] == f["box0.kv_bytes_per_token"]["value"] * 96
    assert f["cache.box0.cached_tokens"]["value"] > 0   # later turns reuse the earlier ones' prefixes
    assert 0 < f["cache.box0.hit_ratio"]["value"] < 1
    assert "## Not measured" in text and "## Decisions" in text
    assert {r["role"] for r in doc["machines"][0]["roles"]} >= {"prefill and decode", "storage", "cache"}


@pytest.mark.system
def test_measure_refuses_bad_input_naming_the_field(tmp_path, server):
    box = tmp_path / "box.toml"
    box.write_text("[requirement]\nconcurrent_users = -1\n")
    key = tmp_path / "key"
    key.write_text("x\n")
    run = subprocess.run(everycycle("measure", "--url", server, "--key-file", str(key), "--box-toml", str(box),
                                    "--json", str(tmp_path / "m.json")), capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "requirement.concurrent_users" in run.stderr and "Traceback" not in run.stderr
    box.write_text(SMALL)
    run = subprocess.run(everycycle("measure", "--url", server, "--key-file", str(key), "--box-toml", str(box),
                                    "--json", str(tmp_path / "m.json")), capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "HTTP 401" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "m.json").exists()


BENCH = {"bench": "fleet", "when": "2026-11-30T10:00:00Z", "workload": {"boxes": 3, "conversations": 9, "turns": 5},
         "gateway": {"policy": "cache_aware", "prefix_hit_ratio": 0.685, "ttft_p50_s": 6.46, "tok_s": 10.34},
         "round_robin": {"policy": "round_robin", "prefix_hit_ratio": 0.336, "ttft_p50_s": 9.59, "tok_s": 6.10}}


def test_the_router_benchmark_is_cited_with_its_ratios_as_arithmetic():
    r = Report("fleet", Requirement())
    r.stated()
    for label in ("load.ttft_p50_s", "load.time_per_token_p50_s", "load.tokens_per_s"):
        r.measured(label, 1.0, "s", "t")
    r.add_router_bench(BENCH, "fleet.json")
    doc = r.to_json()
    assert abs(doc["figures"]["router.prefix_hit_ratio_vs_round_robin"]["value"] - 0.685 / 0.336) < 1e-12
    text = render(doc)
    assert "## The router" in text and "`fleet.json`" in text
    assert check(text, doc) == []
    assert "router.ttft_p50_s_vs_round_robin" in doc["decisions"][-1]["labels"]
    with_litellm = Report("fleet", Requirement())
    with_litellm.add_router_bench({**BENCH, "litellm": {"policy": "litellm least-busy", "prefix_hit_ratio": 0.3,
                                                          "ttft_p50_s": 9.0, "tok_s": 6.0}}, "fleet.json")
    assert "router.prefix_hit_ratio_vs_litellm" in with_litellm.router["ratios"]
    with pytest.raises(ValueError, match="round_robin"):
        Report("fleet", Requirement()).add_router_bench({"gateway": BENCH["gateway"]}, "x")


@pytest.mark.system
def test_the_link_probe_sends_the_bytes_asked_for_and_refuses_bad_counts(server, api_key):
    from tests.servers import http_get

    status, body = http_get(server + "/v1/everycycle/probe?bytes=1000", key=api_key[1])
    assert status == 200 and body == bytes(1000)
    for bad in ("0", "lots", str((16 << 20) + 1)):  # 16 MiB at most (it was 64, spooled into /run by the front)
        status, body = http_get(server + f"/v1/everycycle/probe?bytes={bad}", key=api_key[1])
        assert status == 400 and json.loads(body)["error"]["param"] == "bytes"
    assert http_get(server + "/v1/everycycle/probe?bytes=10")[0] == 401
