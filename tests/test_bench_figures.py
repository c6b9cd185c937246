"""The serving benchmark's own arithmetic (pure): a ratio's spread over repeats, paired repeat by repeat, and what
it records about the CPU, so that a ratio on a noisy machine can be told from noise (#40)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("bench_serving", Path(__file__).parents[1] / "bench" / "serving.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_ratios_are_paired_repeat_by_repeat_with_their_spread():
    ours = [{"tok_s": 50.0, "ttft_p50_s": 0.2}, {"tok_s": 63.0, "ttft_p50_s": 0.3}, {"tok_s": 60.0, "ttft_p50_s": None}]
    theirs = [{"tok_s": 64.0, "ttft_p50_s": 0.4}, {"tok_s": 70.0, "ttft_p50_s": 0.3}, {"tok_s": 80.0, "ttft_p50_s": 0.5}]
    assert bench.paired_ratio(ours, theirs, "tok_s") == {"median": 0.7812, "min": 0.75, "max": 0.9, "n": 3}
    assert bench.paired_ratio(ours, theirs, "ttft_p50_s") == {"median": 0.75, "min": 0.5, "max": 1.0, "n": 2}
    spreads = bench.ratio_spreads({"everycycle": ours, "llama-server": theirs, "other": theirs})
    assert set(spreads) == {"everycycle_tok_s_vs_llama_server", "everycycle_ttft_p50_vs_llama_server"}
    assert bench.spread([]) is None


def test_the_cpus_instruction_sets_and_repacking_are_recorded():
    x86 = "processor : 0\nflags\t\t: fpu sse avx avx2 fma f16c avx512f avx512bw amx_tile amx_int8 other\n"
    assert bench.cpu_flags(x86) == ["avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "amx_tile", "amx_int8"]
    arm = "processor\t: 0\nFeatures\t: fp asimd evtstrm asimddp i8mm sve\n"
    assert bench.cpu_flags(arm) == ["asimd", "asimddp", "i8mm", "sve"]
    assert bench.cpu_flags("") == []
    assert bench.repacked("load_tensors:   CPU_REPACK model buffer size =  40.00 MiB")
    assert bench.repacked("load_tensors:   CPU_Mapped model buffer size =  40.00 MiB") is False
    # A llama-server whose default verbosity prints no buffer lines: unknown, not "not repacked".
    assert bench.repacked("srv    load_model: loading model 'm.gguf'\nsrv  llama_server: model loaded") is None
    assert bench.repacked("m.gguf: weights repacked for this CPU")
    assert not bench.repacked("m.gguf: weights not repacked for this CPU")


def test_the_team_workload_marks_only_the_batch_as_batch_and_counts_each_side_apart():
    """bench/team_workload.py (#38): the flood's requests lower their own class (EveryCycle's `priority` field),
    the people's never; with classes off none does; the floor run sends no flood."""
    import threading

    from bench.team_workload import run_team

    seen, lock = [], threading.Lock()

    def fake_stream(port, body):
        with lock:
            seen.append(body)
        batch = "Document" in body["messages"][0]["content"]
        now = bench.time.perf_counter()
        return {"start": now, "end": now + (0.5 if batch else 0.05), "ttft": 0.3 if batch else 0.02,
                "tokens": body["max_tokens"], "gaps": []}

    # The flood (instant here) is over before the people start: they send their turns and no more.
    r = run_team(fake_stream, bench.percentile, 0, "m", batch=6, users=2, turns=3, batch_tokens=40, chat_tokens=5,
                 bias={}, tag="t", head_start_s=0.2, think_s=0.0)
    batch = [b for b in seen if "Document" in b["messages"][0]["content"]]
    chats = [b for b in seen if b not in batch]
    assert len(batch) == 6 and all(b["priority"] == "batch" for b in batch)
    assert len(chats) == 6 and not any("priority" in b for b in chats)
    assert r["interactive_requests"] == 6 and r["batch_requests"] == 6 and r["batch_tokens"] == 240
    assert r["interactive_ttft_p50_s"] == 0.02 and r["errors"] == 0 and r["batch_tok_s"] > 0
    seen.clear()
    run_team(fake_stream, bench.percentile, 0, "m", batch=6, users=2, turns=1, batch_tokens=40, chat_tokens=5,
             bias={}, tag="t", classes=False, head_start_s=0.2, think_s=0.0)
    assert not any("priority" in b for b in seen) and len(seen) == 8
    seen.clear()
    floor = run_team(fake_stream, bench.percentile, 0, "m", batch=6, users=2, turns=1, batch_tokens=40,
                     chat_tokens=5, bias={}, tag="t", flood=False, think_s=0.0)
    assert len(seen) == 2 and floor["batch_tok_s"] is None and floor["batch_requests"] == 0


def test_the_fleet_benchs_goals_are_met_only_where_the_spread_over_repeats_does_not_cross_them(monkeypatch):
    """#62: bench/fleet.py runs every policy --repeats times, pairs the gateway's run with each other policy's run
    of the same repeat, and says a goal is met only where the whole spread of the ratio is on its side."""
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "bench"))  # its sibling modules
    spec = importlib.util.spec_from_file_location("bench_fleet", Path(__file__).parents[1] / "bench" / "fleet.py")
    fleet = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fleet)

    def run(tok_s, p95):
        return {"tok_s": tok_s, "common_model_tok_s": tok_s, "ttft_p50_s": 1.0, "ttft_p95_s": p95,
                "prefix_hit_ratio": 0.5}

    runs = {"gateway": [run(6.0, 10.0), run(6.6, 12.0), run(6.2, 9.0)],
            "round_robin": [run(3.0, 30.0), run(3.0, 20.0), run(2.9, 30.0)],
            "litellm": [run(5.0, 10.0), run(6.0, 10.0), run(5.0, 10.0)]}
    table = {**fleet.ratios(runs, "gateway", "round_robin"), **fleet.ratios(runs, "gateway", "litellm")}
    assert table["tok_s_vs_round_robin"] == {"median": 2.1379, "min": 2.0, "max": 2.2, "n": 3}
    met = {g["ratio"]: g["met"] for g in fleet.goals(table)}
    # 2.0-2.2x round robin: met; p95 0.33-0.6x: crosses 0.5; 1.1-1.24x LiteLLM: crosses 1.2
    assert met == {"tok_s_vs_round_robin": True, "ttft_p95_s_vs_round_robin": False, "tok_s_vs_litellm": False}
    # The other model's box bounds the wall: the gateway's runs could have reached at most these tok/s
    for r, bound in zip(runs["gateway"], (6.5, 7.0, 5.5)):
        r["tok_s_bound"] = bound
    assert fleet.bound_ratio(runs["gateway"], runs["litellm"]) == {"median": 1.1667, "min": 1.1, "max": 1.3, "n": 3}
    assert fleet.bound_ratio(runs["gateway"], runs["litellm"][:1]) == {"median": 1.3, "min": 1.3, "max": 1.3, "n": 1}
    assert fleet.bound_ratio(runs["round_robin"], runs["litellm"]) is None  # no bound recorded (an equal fleet)


def test_the_cpu_per_token_is_split_by_process_and_by_the_decode_calls():
    """bench/serving.py's CPU count (#61): each role's CPU per generated token, and for a server that says how long
    its decode calls took, the part outside them (threads x the calls' time is inside)."""
    before = {"server": 1.0, "workers": 2.0, "engine": 10.0}
    after = {"server": 1.1, "workers": 2.5, "engine": 14.0, "stunnel": 0.2}
    figures = bench.cpu_per_token(before, after, 1000, decode_s=1.5, threads=2)
    assert {k: round(v, 9) for k, v in figures["cpu_ms_per_token"].items()} == \
        {"server": 0.1, "workers": 0.5, "engine": 4.0, "stunnel": 0.2}
    assert abs(figures["total_cpu_ms_per_token"] - 4.8) < 1e-9
    assert figures["decode_cpu_ms_per_token"] == 3.0
    assert abs(figures["outside_decode_cpu_ms_per_token"] - 1.8) < 1e-9
    theirs = bench.cpu_per_token({"server": 5.0}, {"server": 8.0}, 1000, decode_s=None, threads=2)
    assert theirs == {"cpu_ms_per_token": {"server": 3.0}, "total_cpu_ms_per_token": 3.0}
    assert bench.cpu_per_token(before, after, 0, 1.5, 2) == {}  # nothing generated: nothing to divide by
    runs = [theirs, bench.cpu_per_token({"server": 5.0}, {"server": 10.0}, 1000, None, 2), {}]
    assert bench.median_cpu(runs) == {"cpu_ms_per_token": {"server": 4.0}, "total_cpu_ms_per_token": 4.0}


def test_a_servers_processes_are_told_apart_by_role():
    import subprocess
    import sys
    import time

    # a "server" that forks a worker (its own command line) and starts an engine, as gunicorn and serve do
    code = ("import os, subprocess, sys, time\n"
            "engine = subprocess.Popen([sys.executable, '-c', 'while True: pass', 'engine'])\n"
            "if os.fork() == 0:\n    time.sleep(30)\n    os._exit(0)\n"
            "time.sleep(30)\n")
    server = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            used = bench.cpu_by_process(server.pid)
            if used.get("engine", 0) > 0.2 and "workers" in used:
                break
            time.sleep(0.2)
        assert set(used) == {"server", "workers", "engine"}
        assert used["engine"] > used["server"] + used["workers"]  # the engine spins; the others sleep
    finally:
        import os
        import signal

        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
