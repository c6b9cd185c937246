#!/usr/bin/env bash
# Installs what building and booting the image needs on a Debian 12 host: mkosi 24 from
# bookworm-backports (bookworm's mkosi 14 cannot build a disk without mounting vfat), and the
# tools it calls. The backports mirror is the one this machine's apt sources already use.
# Usage: image/host-tools.sh [--boot]   (--boot adds qemu and OVMF for the disk image's boot test)
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

want_boot=0
[ "${1:-}" = --boot ] && want_boot=1
build_pkgs=(bubblewrap python3-pefile dosfstools mtools squashfs-tools
  erofs-utils cpio zstd uidmap debian-archive-keyring apt)
boot_pkgs=(ovmf qemu-system-x86)

have_mkosi() { command -v mkosi >/dev/null && [ "$(mkosi --version 2>/dev/null | grep -oE '[0-9]+' | head -1)" -ge 24 ]; }
# mke2fs clamps every timestamp to SOURCE_DATE_EPOCH from 1.47.1 on (bookworm has 1.47.0).
have_e2fsprogs() { dpkg --compare-versions "$(dpkg-query -W -f='${Version}' e2fsprogs 2>/dev/null)" ge 1.47.1; }
missing=()
for p in "${build_pkgs[@]}" systemd-container systemd-boot; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ $want_boot = 1 ]; then
  for p in "${boot_pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
fi
if have_mkosi && have_e2fsprogs && [ ${#missing[@]} = 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "building the image needs root and: mkosi (>= 24, bookworm-backports) ${missing[*]}" >&2
  exit 1
fi

release=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
list=/etc/apt/sources.list.d/everycycle-backports.sources
if [ ! -f $list ]; then
  echo "==> adding $release-backports (from this machine's own apt mirror)"
  python3 image/apt_sources.py backports "$release" $list
fi
backports=(mkosi systemd systemd-container systemd-boot e2fsprogs)
echo "==> installing the image build tools: ${backports[*]} (backports) ${missing[*]}"
apt-get update -qq
apt-get install -y -qq -t "$release-backports" "${backports[@]}" >/dev/null
pkgs=("${build_pkgs[@]}")
[ $want_boot = 1 ] && pkgs+=("${boot_pkgs[@]}")
apt-get install -y -qq "${pkgs[@]}" >/dev/null
have_mkosi && have_e2fsprogs || { echo "mkosi >= 24 or e2fsprogs >= 1.47.1 did not install" >&2; exit 1; }
echo "    $(mkosi --version)"
