"""The check that keeps a portable llama.cpp build from dying of an illegal instruction on an old CPU."""

from __future__ import annotations

from host_runtime.engine.cpu_support import check_this_machine, required_cpu_flags, unsupported_reason

HASWELL = "processor\t: 0\nflags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma f16c bmi1 bmi2\n"
IVY_BRIDGE = "processor\t: 0\nflags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c\n"


def test_the_flags_a_build_needs():
    assert required_cpu_flags("-DGGML_NATIVE=OFF -DLLAMA_CURL=OFF") == ["sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"]
    assert required_cpu_flags("-DGGML_NATIVE=OFF -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_BMI2=OFF") == \
        ["sse4_2", "avx", "f16c"]
    assert "avx512f" in required_cpu_flags("-DGGML_NATIVE=OFF -DGGML_AVX512=ON")
    # A native build (make run's) was made for the machine it runs on.
    assert required_cpu_flags("") == [] and required_cpu_flags("-DGGML_NATIVE=ON") == []


def test_an_older_cpu_gets_a_sentence_not_an_illegal_instruction():
    assert unsupported_reason("-DGGML_NATIVE=OFF", HASWELL) is None
    reason = unsupported_reason("-DGGML_NATIVE=OFF", IVY_BRIDGE)
    assert reason.startswith("this CPU lacks avx2, fma, bmi2") and "Haswell" in reason
    assert unsupported_reason("-DGGML_NATIVE=OFF", "processor : 0\n") is None  # no flags line: no grounds


def test_the_record_beside_the_venv(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(IVY_BRIDGE)
    assert check_this_machine(tmp_path, cpuinfo) is None  # no record: a native build
    (tmp_path / "llama-cmake-args").write_text("-DGGML_NATIVE=OFF -DLLAMA_CURL=OFF\n")
    assert "lacks avx2" in check_this_machine(tmp_path, cpuinfo)
    cpuinfo.write_text(HASWELL)
    assert check_this_machine(tmp_path, cpuinfo) is None
