"""Which llama.cpp build a process loads (host_runtime/gpu/llama_build.py): the choice, and that a chosen
folder is the only one whose libraries end up mapped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from host_runtime.gpu.llama_build import LlamaBuild, choose, oldest_arch
from host_runtime.placement.planner import Placement
from host_runtime.placement.render import backend_choice

REPO = Path(__file__).resolve().parents[1]
CUDA = Path("/opt/everycycle/llama-cuda/lib")


def test_no_driver_keeps_the_wheels_build_and_says_why():
    b = choose("NVML Shared Library Not Found", CUDA)
    assert b == LlamaBuild("default", None, "no NVIDIA driver answered (NVML Shared Library Not Found)")
    assert choose({}, CUDA).name == "default"


def test_an_nvidia_card_and_the_cuda_build_choose_cuda():
    b = choose({"0000:65:00.0": (8, 6), "0000:b3:00.0": (6, 1)}, CUDA, oldest_arch=(6, 1))
    assert b.name == "cuda" and b.lib_dir == str(CUDA) and "2 NVIDIA cards" in b.reason


def test_an_nvidia_card_without_the_cuda_build_names_what_is_missing():
    b = choose({"0000:65:00.0": (8, 6)}, None, f"{CUDA}/libggml-cuda.so is missing")
    assert b.name == "default" and "libggml-cuda.so is missing" in b.reason and "Vulkan" in b.reason


def test_a_card_older_than_the_builds_code_is_not_sent_to_cuda():
    # Maxwell (5.2): the build's PTX is for 8.9, which no driver compiles down to an older card.
    b = choose({"0000:65:00.0": (8, 6), "0000:03:00.0": (5, 2)}, CUDA, oldest_arch=(6, 1))
    assert b.name == "default" and "0000:03:00.0 (compute 5.2)" in b.reason
    # An unreadable capability is not held against the card.
    assert choose({"0000:65:00.0": None}, CUDA, oldest_arch=(6, 1)).name == "cuda"


def test_oldest_arch_reads_cmake_architectures():
    assert oldest_arch("-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=61-real;75-real;86-real;89 -DX=1") == (6, 1)
    assert oldest_arch("-DCMAKE_CUDA_ARCHITECTURES=90") == (9, 0)
    assert oldest_arch("-DGGML_VULKAN=ON") is None


def test_the_backend_reason_says_why_not_cuda():
    p = Placement(model="m", n_layer=30, n_ctx_per_seq=512, n_parallel=1, max_waiting=4, kv_bytes_per_token=1,
                  shares=(), n_gpu_layers=0)
    backend, _, reason = backend_choice(p, ["Vulkan", "CPU"], [], False, "no NVIDIA driver answered (x)")
    assert backend == "cpu"
    assert reason == "no GPU found by the Vulkan backend; not CUDA: no NVIDIA driver answered (x)"


def _libs_folder(tmp_path: Path) -> Path:
    """A second llama.cpp build folder laid out as the image's CUDA build is (SONAME files, libX.so links):
    here the venv's own libraries, copied, since this machine has no CUDA build."""
    import llama_cpp

    wheel = Path(llama_cpp.__file__).parent / "lib"
    d = tmp_path / "llama-alt" / "lib"
    d.mkdir(parents=True)
    for f in wheel.glob("lib*.so.0"):
        (d / f.name).write_bytes(f.read_bytes())
        (d / f.name[:-2]).symlink_to(f.name)
    return d


@pytest.mark.system
def test_a_chosen_folder_is_the_only_llama_build_mapped(tmp_path):
    d = _libs_folder(tmp_path)
    code = ("import json; from host_runtime.gpu.llama_build import select; b = select(); "
            "from host_runtime.gpu.llama_devices import compiled_backends; backends = compiled_backends(); "
            "maps = sorted({l.split()[-1] for l in open('/proc/self/maps') if '/lib' in l and "
            "('libggml' in l or 'libllama' in l)}); "
            "print(json.dumps({'build': b.to_json(), 'backends': backends, 'maps': maps}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, LLAMA_CPP_LIB_PATH=str(d)))
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    assert doc["build"] == {"name": "default", "lib_dir": str(d), "reason": f"LLAMA_CPP_LIB_PATH={d}"}
    assert "CPU" in doc["backends"]
    assert doc["maps"] and all(m.startswith(str(d)) for m in doc["maps"]), doc["maps"]
    assert any(m.endswith("libggml.so.0") for m in doc["maps"]) and any("libllama" in m for m in doc["maps"])


@pytest.mark.system
def test_select_takes_the_cuda_folder_only_where_a_driver_answers(tmp_path):
    """On a machine without an NVIDIA driver (CI, here) the wheel's build stays, though a CUDA folder is there,
    and LLAMA_CPP_LIB_PATH is left unset; where NVML answers (a lent GPU machine) the folder is taken."""
    from tests.conftest import _nvml_works

    d = _libs_folder(tmp_path)
    (d / "libggml-cuda.so").symlink_to("libggml.so.0")  # laid out as a CUDA build is
    code = ("import json, os; from host_runtime.gpu.llama_build import select; b = select(); "
            "print(json.dumps({'build': b.to_json(), 'env': os.environ.get('LLAMA_CPP_LIB_PATH'), "
            "'exported': os.environ.get('EVERYCYCLE_LLAMA_BUILD')}))")
    env = {k: v for k, v in os.environ.items() if k not in ("LLAMA_CPP_LIB_PATH", "EVERYCYCLE_LLAMA_BUILD")}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env=dict(env, EVERYCYCLE_LLAMA_CUDA_LIB=str(d)))
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    if _nvml_works():
        assert doc["build"]["name"] == "cuda" and doc["env"] == str(d)
    else:
        assert doc["build"]["name"] == "default" and doc["env"] is None
        assert doc["build"]["reason"].startswith("no NVIDIA driver answered")
    # Exported for the engines this process starts, which take it without asking NVML again.
    assert json.loads(doc["exported"]) == doc["build"]
    parents = dict(doc["build"], reason="chosen by the serving process")
    child = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                           env=dict(env, EVERYCYCLE_LLAMA_BUILD=json.dumps(parents),
                                    **({"LLAMA_CPP_LIB_PATH": doc["env"]} if doc["env"] else {}),
                                    PYTHONPATH=str(REPO), EVERYCYCLE_LLAMA_CUDA_LIB="/nonexistent"))
    assert json.loads(child.stdout)["build"] == parents
