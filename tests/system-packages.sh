#!/usr/bin/env bash
# The Debian packages the test suite runs beside the venv (image/install-venv.sh brings the compiler, Python's
# headers, nginx and llama.cpp's build dependencies): installed here when run as root, as `make run` installs
# its own; otherwise named in one line, with the command, before any test runs.
# Usage: tests/system-packages.sh [--check]   (--check: only say what is missing, exit 1 if anything is)
set -euo pipefail
# curl: make run's readiness wait; procps: pgrep; iproute2: the network namespaces of the discovery, front and
# fleet tests; libudev1: pyudev; openipmi/ipmitool/libopenipmi-dev: the BMC agent's tests (ipmi_sim, its DCMI
# test plugin, the cross-check); mesa-vulkan-drivers: lavapipe, the Vulkan device of the placement and backend
# tests; nginx: the front, run for real; zstd: update releases; fdisk: sfdisk, which the update tests' small GPT
# disk is made with (a fresh Debian 12 lacks it); keepalived: the fleet gateways' virtual address (VRRP); stunnel4:
# the TLS around llama.cpp's RPC wire between a model's boxes (host_runtime/shard).
packages=(curl procps iproute2 libudev1 openipmi ipmitool libopenipmi-dev mesa-vulkan-drivers nginx zstd fdisk
          keepalived stunnel4)
# npm: the coding agents' tests install Codex CLI and opencode from the npm registry (Debian's nodejs and npm, unless
# a Node.js with npm is already here, as NodeSource's).
command -v npm >/dev/null || packages+=(nodejs npm)

if ! command -v dpkg-query >/dev/null; then
  echo "make test expects Debian 12 or 13 (no dpkg-query here); the suite needs these packages: ${packages[*]}" >&2
  exit 1
fi
missing=()
for p in "${packages[@]}"; do
  [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "${1:-}" = --check ] || [ "$(id -u)" != 0 ]; then
  echo "make test needs these Debian packages: ${missing[*]}; install them with:" >&2
  echo "  sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "==> installing the Debian packages the tests need: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# An old package list may lack them: update first, once.
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
