"""Which llama.cpp build this process loads: the venv's own (CPU and Vulkan) or the CUDA build.

The box image carries two builds of the same llama.cpp source: the wheel's, with the CPU and Vulkan backends,
and a CUDA build (CPU and CUDA) in /opt/everycycle/llama-cuda/lib, compiled with Debian's CUDA toolkit. The
CUDA libraries link to the NVIDIA driver's libcuda, so they load only where the driver is installed, and they
serve tokens only where it answers; so the choice is made once per process, before llama_cpp is first
imported: CUDA where NVML finds an NVIDIA card and the CUDA build is there, else the wheel's build (Vulkan
where a GPU is found, else the CPU). llama-cpp-python reads LLAMA_CPP_LIB_PATH when it is imported; setting
it here reaches this process and every engine process it starts.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from host_runtime.common.readings import is_unavailable
from host_runtime.gpu.nvml import Nvml, NvmlUnavailable, read

CUDA_LIB_DIR = Path("/opt/everycycle/llama-cuda/lib")
LIB_PATH_ENV = "LLAMA_CPP_LIB_PATH"      # llama-cpp-python's own override
CUDA_DIR_ENV = "EVERYCYCLE_LLAMA_CUDA_LIB"  # where the CUDA build lives, if not at CUDA_LIB_DIR
CHOICE_ENV = "EVERYCYCLE_LLAMA_BUILD"     # the choice, as JSON, for the processes this one starts


@dataclass(frozen=True)
class LlamaBuild:
    name: str             # "cuda" or "default" (the venv's wheel: CPU and Vulkan)
    lib_dir: str | None   # None: the wheel's own llama_cpp/lib
    reason: str

    def to_json(self) -> dict:
        return asdict(self)


def choose(cards: dict[str, tuple[int, int] | None] | str, cuda_dir: Path | None, cuda_dir_why: str = "",
           oldest_arch: tuple[int, int] | None = None) -> LlamaBuild:
    """Pure: the build for a machine whose NVIDIA cards NVML lists as {PCI address: compute capability or None
    if unreadable} (or a string: why NVML does not answer), where the CUDA build is at cuda_dir (None: absent,
    cuda_dir_why says why) with machine code from oldest_arch up (PTX reaches only newer cards, never older)."""
    if isinstance(cards, str) or not cards:
        why = cards if isinstance(cards, str) else "NVML answers but lists no card"
        return LlamaBuild("default", None, f"no NVIDIA driver answered ({why})")
    n = f"{len(cards)} NVIDIA card{'s' if len(cards) != 1 else ''}"
    if cuda_dir is None:
        return LlamaBuild("default", None, f"{n} found, but no CUDA build of llama.cpp ({cuda_dir_why}); "
                                           "the cards serve through Vulkan where the driver has a Vulkan ICD")
    if oldest_arch is not None:
        old = {pci: cc for pci, cc in cards.items() if cc is not None and cc < oldest_arch}
        if old:
            listed = ", ".join(f"{pci} (compute {cc[0]}.{cc[1]})" for pci, cc in sorted(old.items()))
            return LlamaBuild("default", None, f"the CUDA build has code for compute {oldest_arch[0]}.{oldest_arch[1]} "
                                               f"and newer, older than {listed}: serving through Vulkan instead")
    return LlamaBuild("cuda", str(cuda_dir), f"{n} found and the CUDA build is at {cuda_dir}")


def oldest_arch(cmake_args: str) -> tuple[int, int] | None:
    """Pure: the oldest compute capability in -DCMAKE_CUDA_ARCHITECTURES=61-real;75-real;... (None: unknown)."""
    m = re.search(r"CMAKE_CUDA_ARCHITECTURES=([0-9a-z;\-]+)", cmake_args)
    archs = [int(a) for a in re.findall(r"(\d+)", m.group(1))] if m else []
    return (min(archs) // 10, min(archs) % 10) if archs else None


def cuda_build_dir() -> tuple[Path | None, str]:
    """The CUDA build's library folder, or None and why not."""
    d = Path(os.environ.get(CUDA_DIR_ENV) or CUDA_LIB_DIR)
    for name in ("libllama.so", "libggml.so", "libggml-cuda.so"):
        if not (d / name).exists():
            return None, f"{d / name} is missing"
    return d, ""


def nvidia_cards() -> dict[str, tuple[int, int] | None] | str:
    """Every card NVML lists, by PCI address, with its compute capability; or why NVML does not answer."""
    try:
        with Nvml() as nvml:
            out = {}
            for pci, handle in nvml.handles.items():
                cc = read(nvml.lib.nvmlDeviceGetCudaComputeCapability, handle)
                out[pci] = None if is_unavailable(cc) else tuple(cc)
            return out
    except NvmlUnavailable as exc:
        return str(exc) or "NVML did not answer"


_chosen: LlamaBuild | None = None


def select() -> LlamaBuild:
    """Choose this process's build (once) and point llama-cpp-python at it. The engines take the choice their
    serving process made (CHOICE_ENV), without asking NVML again; an explicit LLAMA_CPP_LIB_PATH wins."""
    global _chosen
    if _chosen is not None:
        return _chosen
    inherited = os.environ.get(CHOICE_ENV)
    if inherited:
        try:
            _chosen = LlamaBuild(**json.loads(inherited))
        except (ValueError, TypeError):
            _chosen = None  # not ours: choose afresh
        if _chosen is not None and (_chosen.lib_dir or None) == (os.environ.get(LIB_PATH_ENV) or None):
            return _chosen
        _chosen = None
    if os.environ.get(LIB_PATH_ENV):
        d = os.environ[LIB_PATH_ENV]
        name = "cuda" if (Path(d) / "libggml-cuda.so").exists() else "default"
        _chosen = LlamaBuild(name, d, f"{LIB_PATH_ENV}={d}")
        return _chosen
    if "llama_cpp" in sys.modules:
        # Too late to switch: the wheel's libraries are loaded already.
        _chosen = LlamaBuild("default", None, "llama_cpp was imported before the build was chosen")
        return _chosen
    cuda_dir, why = cuda_build_dir()
    args = cuda_dir.parent / "cmake-args" if cuda_dir else None
    _chosen = choose(nvidia_cards(), cuda_dir, why,
                     oldest_arch(args.read_text()) if args and args.exists() else None)
    if _chosen.lib_dir:
        os.environ[LIB_PATH_ENV] = _chosen.lib_dir
    os.environ[CHOICE_ENV] = json.dumps(_chosen.to_json())
    return _chosen


def load_first() -> None:
    """Load the chosen build's libraries now, before anything in this process imports numpy (for a process that
    loads a model: the engine, `plan`). Whichever library loads libstdc++ first decides where libstdc++'s own
    references bind: a numpy wheel exports some libstdc++ code of its own (libstdc++_nonshared), and on the H200
    the engine, which imported numpy first, died in the tokenizer's std::regex (a std::locale facet taken from
    the wrong copy) while `plan` and a bare llama-cpp-python load, which loaded llama.cpp first, passed.
    llama_cpp's package loads libllama before its own numpy-using modules."""
    select()
    import llama_cpp.llama_cpp  # noqa: F401  (loaded for its side effect: the libraries, first)


def lib_dir() -> Path:
    """The folder llama-cpp-python loads its libraries from in this process."""
    import llama_cpp.llama_cpp as bindings

    return Path(bindings._base_path)
