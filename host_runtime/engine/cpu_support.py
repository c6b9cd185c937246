"""Whether this CPU can run the llama.cpp build installed beside us.

The image's llama.cpp is built with GGML_NATIVE=OFF, which on x86-64 turns on AVX, AVX2, FMA,
F16C and BMI2 (Intel Haswell, AMD Zen and newer). On an older CPU it would die with an illegal
instruction when the engine loads it; checked first, it is a sentence that says why.
The image build records the build's CMake arguments in the venv (sys.prefix/llama-cmake-args); a
build without that record (`make run` compiles natively, for the machine it runs on) needs nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

from host_runtime.discovery.cpu import cpuinfo_flags
from host_runtime.placement.llama_params import build_record, native_build

# What ggml enables on x86-64 when it is not built natively, and each option's /proc/cpuinfo flag.
DEFAULT_X86_OPTIONS = {"GGML_SSE42": "sse4_2", "GGML_AVX": "avx", "GGML_AVX2": "avx2", "GGML_FMA": "fma",
                       "GGML_F16C": "f16c", "GGML_BMI2": "bmi2"}
EXTRA_X86_OPTIONS = {"GGML_AVX512": "avx512f", "GGML_AVX512_VBMI": "avx512_vbmi", "GGML_AVX512_VNNI": "avx512_vnni",
                     "GGML_AVX512_BF16": "avx512_bf16", "GGML_AVX_VNNI": "avx_vnni", "GGML_AMX_TILE": "amx_tile",
                     "GGML_AMX_INT8": "amx_int8"}


def required_cpu_flags(cmake_args: str) -> list[str]:
    """The /proc/cpuinfo flags a build with these CMake arguments executes unconditionally."""
    if native_build(cmake_args):
        return []  # tuned to the machine that built it: nothing to say about another
    options = dict(re.findall(r"-D(GGML_[A-Z0-9_]+)=(\S+)", cmake_args))
    on = lambda v: v.upper() in ("ON", "1", "TRUE", "YES")  # noqa: E731
    flags = [flag for opt, flag in DEFAULT_X86_OPTIONS.items() if on(options.get(opt, "ON"))]
    flags += [flag for opt, flag in EXTRA_X86_OPTIONS.items() if on(options.get(opt, "OFF"))]
    return flags


def unsupported_reason(cmake_args: str, cpuinfo_text: str) -> str | None:
    have = cpuinfo_flags(cpuinfo_text)
    if not have:
        return None  # not x86 /proc/cpuinfo, or unreadable: no grounds to refuse
    missing = [f for f in required_cpu_flags(cmake_args) if f not in have]
    if not missing:
        return None
    why = f"this CPU lacks {', '.join(missing)}, which the installed llama.cpp build needs (built with {cmake_args.strip()})"
    if "avx2" in missing:
        why += ": it runs on x86-64 CPUs with AVX2, Intel Haswell (2013) / AMD Zen and newer"
    return why


def check_this_machine(prefix: Path | None = None, cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The reason this machine cannot run the installed build, or None."""
    cmake_args = build_record(prefix)
    if cmake_args is None:
        return None  # make run's native build: made for this machine
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    return unsupported_reason(cmake_args, text)
