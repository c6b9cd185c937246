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
