#!/usr/bin/env bash
# What llama.cpp's Vulkan backend needs to build: glslc, SPIR-V headers, and Vulkan headers new enough
# for it (1.3.275+: Debian 12's 1.3.239 lacks VK_EXT_layer_settings). Prints the CMake arguments that
# enable Vulkan, or nothing (with the reason on stderr) where it cannot be had; never fails the install.
# On Debian 12, the headers alone come from Debian 13's libvulkan-dev, fetched from this machine's own
# mirror into a cache and unpacked there (nothing is installed system-wide; the runtime loader stays
# Debian 12's, which the newer headers work with: they only add declarations).
# Usage: image/vulkan-build-deps.sh CACHE_DIR
set -uo pipefail
cache=${1:?usage: image/vulkan-build-deps.sh CACHE_DIR}
here=$(cd "$(dirname "$0")" && pwd)
min_header=275

say() { echo "    vulkan: $*" >&2; }

need=()
command -v glslc >/dev/null || need+=(glslc)
[ -f /usr/include/vulkan/vulkan_core.h ] || need+=(libvulkan-dev)
[ -f /usr/share/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake ] || need+=(spirv-headers)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    say "not built: needs ${need[*]} (sudo apt-get install -y ${need[*]})"
    exit 0
  fi
  say "installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null 2>&1 \
    || { DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1
         DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null 2>&1; } \
    || { say "not built: apt could not install ${need[*]}"; exit 0; }
fi

header_version() { sed -n 's/^#define VK_HEADER_VERSION \([0-9]*\).*/\1/p' "$1/vulkan/vulkan_core.h" 2>/dev/null; }
include=/usr/include
if [ "$(header_version $include || echo 0)" -lt "$min_header" ]; then
  include=$cache/vulkan-headers/usr/include
  if [ "$(header_version "$include" || echo 0)" -lt "$min_header" ]; then
    say "Debian 12's Vulkan headers are too old for llama.cpp; fetching Debian 13's libvulkan-dev (headers only)"
    work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
    mkdir -p "$work/parts" "$work/lists/partial"
    python3 "$here/apt_sources.py" suite trixie "$work/parts/trixie.sources" \
      || { say "not built: no Debian mirror in this machine's apt sources to fetch newer headers from"; exit 0; }
    o=(-oDir::Etc::SourceList=/dev/null "-oDir::Etc::SourceParts=$work/parts" "-oDir::State::Lists=$work/lists"
       -oAPT::Sandbox::User=root -oDebug::NoLocking=1)
    if ! { apt-get "${o[@]}" update -qq && (cd "$work" && apt-get "${o[@]}" download libvulkan-dev); } >/dev/null 2>&1; then
      say "not built: could not fetch Debian 13's libvulkan-dev"
      exit 0
    fi
    rm -rf "$cache/vulkan-headers" && mkdir -p "$cache" && dpkg -x "$work"/libvulkan-dev_*.deb "$cache/vulkan-headers"
  fi
fi
say "headers $(header_version "$include") in $include"
echo "-DGGML_VULKAN=ON -DVulkan_INCLUDE_DIR=$include"
