#!/usr/bin/env bash
# Builds the project's virtual environment: used by `make run`, `make test`, CI, and the image build.
# Usage: image/install-venv.sh VENV_DIR LOG_DIR
set -euo pipefail
venv=${1:-.venv}
logdir=${2:-var/log}
llama_pin=$(grep -oE 'llama-cpp-python==[0-9.]+' pyproject.toml)
mkdir -p "$logdir"

need_apt=()
command -v python3 >/dev/null || need_apt+=(python3)
python3 -c 'import ensurepip, venv' 2>/dev/null || need_apt+=(python3-venv)
command -v cc >/dev/null && command -v c++ >/dev/null || need_apt+=(build-essential)
python3 -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  2>/dev/null || need_apt+=(python3-dev)
# The front (TLS and slow-client limits before the API) is Debian's nginx, run by supervisord, not by systemd.
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need_apt+=(nginx)
# stunnel: the TLS around llama.cpp's RPC wire when boxes share one model (host_runtime/shard).
command -v stunnel >/dev/null || [ -x /usr/bin/stunnel ] || need_apt+=(stunnel4)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "==> installing system packages: ${need_apt[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    echo "missing system packages: ${need_apt[*]}" >&2
    echo "install them with: sudo apt-get install -y ${need_apt[*]}" >&2
    exit 1
  fi
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "==> creating $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
fi

# The GPU backends llama.cpp is built with: Vulkan wherever its build dependencies can be had (one build
# serves AMD, Intel and NVIDIA cards, and Mesa's lavapipe in the tests), else the CPU alone, said aloud.
# EVERYCYCLE_LLAMA_BACKENDS=cpu skips Vulkan.
cache=${EVERYCYCLE_CACHE:-$HOME/.cache/everycycle}
# GGML_RPC: a box lends its devices to a model held by another box of the fleet (host_runtime/shard); the
# transport is plain TCP (RDMA off: no verbs library on these boxes, and one build everywhere).
llama_flags="-DLLAMA_CURL=OFF -DGGML_RPC=ON -DGGML_RPC_RDMA=OFF"
if [ "${EVERYCYCLE_LLAMA_BACKENDS:-vulkan}" = vulkan ]; then
  vulkan_flags=$(bash image/vulkan-build-deps.sh "$cache")
  if [ -n "$vulkan_flags" ]; then
    llama_flags="$llama_flags $vulkan_flags"
  else
    echo "==> llama.cpp will be built for the CPU only (see the reason above)"
  fi
fi
stamp="$venv/.llama-cmake-args"
if ! "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('llama-cpp-python') != '${llama_pin#*==}')" 2>/dev/null \
    || [ "$(cat "$stamp" 2>/dev/null)" != "$llama_flags" ]; then
  # The wheel is kept in the cache, keyed by everything its build reads: the pin, the CMake arguments (and the
  # Vulkan headers they name), Python's version, the compiler, and this CPU's flags (llama.cpp is built with
  # -march=native here, so a wheel from another CPU could die of an illegal instruction). A clean clone on the
  # same machine (CI's) then installs it in seconds instead of compiling for 7 minutes.
  build_key=$({ echo "$llama_pin $llama_flags"; "$venv/bin/python" -VV; cc --version | head -1
                sed -n 's/^#define VK_HEADER_VERSION //p' $(echo "$llama_flags" | sed -n 's/.*-DVulkan_INCLUDE_DIR=\([^ ]*\).*/\1/p')/vulkan/vulkan_core.h 2>/dev/null
                grep -m1 '^flags' /proc/cpuinfo; uname -m; } | sha256sum | cut -c1-16)
  wheels="$cache/llama-wheels/${llama_pin#*==}-$build_key"
  if ! ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    echo "==> building llama.cpp ($llama_pin, CMAKE_ARGS=\"$llama_flags\") from source:"
    echo "    several minutes on 2 cores, about 7 with Vulkan (full log: $logdir/llama-build.log)"
    # ninja prints [done/total] per compiled file; show every tenth so the wait has a visible end.
    # --no-cache-dir: pip's cache keys a wheel built from an sdist by version alone, not by CMAKE_ARGS.
    rm -rf "$wheels.tmp" && mkdir -p "$wheels.tmp"
    if ! CMAKE_ARGS="$llama_flags" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$venv/bin/pip" wheel -v --no-cache-dir \
        --no-deps -w "$wheels.tmp" "$llama_pin" 2>&1 \
        | tee "$logdir/llama-build.log" \
        | awk 'match($0, /^ *\[[0-9]+\/[0-9]+\]/) { s = substr($0, RSTART, RLENGTH); gsub(/[ \[\]]/, "", s);
                 split(s, p, "/"); if (p[1] % 10 == 0 || p[1] == p[2]) { printf "    compiled %s of %s files\n", p[1], p[2]; fflush() } }' \
        || ! ls "$wheels.tmp"/llama_cpp_python-*.whl >/dev/null 2>&1; then
      echo "llama-cpp-python failed to build; the end of $logdir/llama-build.log:" >&2
      tail -30 "$logdir/llama-build.log" >&2
      rm -rf "$wheels.tmp"
      exit 1
    fi
    rm -rf "$wheels" && mv "$wheels.tmp" "$wheels"
  else
    echo "==> llama.cpp ($llama_pin) already built for this machine: $wheels"
  fi
  "$venv/bin/pip" install -q --force-reinstall --no-deps "$wheels"/llama_cpp_python-*.whl
  printf '%s' "$llama_flags" > "$stamp"
fi

echo "==> installing the project and its pinned dependencies"
"$venv/bin/pip" install -q -e '.[test]' 2>&1 | grep -vE '^(WARNING: Location|  |!!|$)' || true
"$venv/bin/python" -c 'import host_runtime, llama_cpp, falcon, gunicorn, supervisor, openai, sglang_router' \
  || { echo "the virtual environment is incomplete" >&2; exit 1; }
# The fleet router's one offline data file (host_runtime/fleet/router_vocab.py says why), under the venv.
"$venv/bin/python" -m host_runtime.fleet.router_vocab
