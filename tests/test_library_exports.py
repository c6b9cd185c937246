"""The H200 engine's crash in the tokenizer's std::regex (#54), in its two halves: a llama.cpp library carrying
libstdc++ code of its own, and a process that loaded numpy (whose extension loads libstdc++ first) before
llama.cpp. Shown here without a GPU: a small library linked with a static libstdc++ stands in for that build's
libggml-cuda, and breaks the default model's vocabulary load (std::bad_cast) in the engine's old order only."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from host_runtime.gpu.library_exports import libraries_in, libstdcxx_definitions, main
from host_runtime.gpu.llama_build import cuda_build_dir

REPO = Path(__file__).resolve().parents[1]
# std::codecvt<char16_t, char, __mbstate_t>::do_unshift: the function the H200's crash frame named in libggml-cuda
CODECVT_UNSHIFT = "_ZNKSt7codecvtIDsc11__mbstate_tE10do_unshiftERS0_PcS3_RS3_"
PLANTED_SOURCE = r"""
#include <regex>
#include <string>
extern "C" int planted_match(const char *s) {
    std::regex r("[[:alpha:]]+", std::regex::icase);
    return std::regex_search(std::string(s), r) ? 1 : 0;
}
"""


def wheel_lib_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    return Path(list(spec.submodule_search_locations)[0]) / "lib"


def test_no_llama_cpp_library_the_box_ships_exports_libstdcxx_code():
    """The wheel's libraries, and the image's CUDA build where this machine has one."""
    folders = [wheel_lib_dir()]
    cuda, _ = cuda_build_dir()
    if cuda is not None:
        folders.append(cuda)
    libraries = libraries_in(folders)
    assert any(lib.name.startswith("libllama.so") for lib in libraries)
    assert any(lib.name.startswith("libggml-base.so") for lib in libraries)
    assert {lib.name: libstdcxx_definitions(lib)[:3] for lib in libraries} == {lib.name: [] for lib in libraries}


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    """A shared library with libstdc++ linked in statically, its code exported (as nothing hides it)."""
    folder = tmp_path_factory.mktemp("planted")
    (folder / "planted.cpp").write_text(PLANTED_SOURCE)
    lib = folder / "libplanted.so"
    subprocess.run([shutil.which("g++") or "c++", "-O1", "-shared", "-fPIC", "-static-libstdc++",
                    str(folder / "planted.cpp"), "-o", str(lib)], check=True, timeout=300)
    return lib


def test_the_check_finds_a_library_that_carries_its_own_libstdcxx(planted, capsys):
    names = libstdcxx_definitions(planted)
    assert CODECVT_UNSHIFT in names and len(names) > 100
    assert main([str(planted)]) == 1
    assert "libstdc++ code of its own" in capsys.readouterr().err


LOAD = """
import ctypes, sys
from host_runtime.engine.model import default_model_path
if sys.argv[1] == "numpy first":  # the engine before the fix: its modules import numpy, then llama.cpp loads
    import numpy
    ctypes.CDLL(sys.argv[2], mode=ctypes.RTLD_GLOBAL)
    import llama_cpp
else:  # the engine now: llama.cpp's libraries first (cli.main -> load_first), then the rest
    from host_runtime.gpu.llama_build import load_first
    load_first()
    ctypes.CDLL(sys.argv[2], mode=ctypes.RTLD_GLOBAL)
    import numpy, llama_cpp
model = llama_cpp.Llama(model_path=str(default_model_path()), n_ctx=256, verbose=True)
print("tokens", len(model.tokenize(b"Hello, world! Ca va? 123 the quick brown fox")))
"""


def load(order: str, planted: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("LLAMA_CPP_LIB_PATH", "EVERYCYCLE_LLAMA_BUILD")}
    return subprocess.run([sys.executable, "-c", LOAD, order, str(planted)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_library_carrying_libstdcxx_breaks_the_vocabulary_load_after_numpy_but_not_after_llama_cpp(planted):
    before = load("numpy first", planted)
    assert before.returncode != 0
    assert "error loading model vocabulary: std::bad_cast" in before.stderr
    after = load("llama.cpp first", planted)
    assert after.returncode == 0, after.stderr[-2000:]
    assert re.search(r"^tokens \d+$", after.stdout, re.M)


@pytest.mark.parametrize("command", [
    # the engine, given no options document: it imports its modules (numpy among them), then refuses the options
    ["engine", "--socket", "unused.sock", "--options-stdin"],
    ["plan", "--json", "--ctx-size", "1024"],
])
def test_the_commands_that_load_a_model_load_llama_cpp_before_numpy(command, tmp_path):
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "host_runtime.cli", *command], cwd=REPO,
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    imported = [line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")]
    assert "numpy" in imported, out.stderr[-2000:]
    assert "llama_cpp.llama_cpp" in imported and imported.index("llama_cpp.llama_cpp") < imported.index("numpy")


def test_the_gguf_reader_uses_the_ggml_base_llama_cpp_loaded_not_a_second_copy():
    """A wheel holds libggml-base.so and libggml-base.so.0 as two files; libllama asks for the .so.0."""
    code = ("import llama_cpp.llama_cpp\nfrom host_runtime.placement import gguf_c\ngguf_c._lib()\n"
            "import json\nprint(json.dumps(sorted({line.split()[-1] for line in open('/proc/self/maps') if 'libggml-base' in line})))")
    env = {k: v for k, v in os.environ.items() if k not in ("LLAMA_CPP_LIB_PATH", "EVERYCYCLE_LLAMA_BUILD")}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    (mapped,) = json.loads(out.stdout)  # one file, not two
    assert mapped.endswith("libggml-base.so.0")
