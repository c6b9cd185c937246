#!/usr/bin/env bash
# Builds the box image with mkosi. Usage: image/build.sh disk|directory
#   disk:      a UEFI-bootable raw disk image (mkosi.conf + image/mkosi.disk.conf), for the box; with
#              NVIDIA=1 (make image's default) also image/mkosi.nvidia.conf: the NVIDIA driver and the
#              CUDA build of llama.cpp for CUDA_ARCHS (compiled once, about 25 minutes per architecture
#              on 2 cores, then cached)
#   directory: the same system as a directory tree, which systemd-nspawn boots (CI's boot test); no
#              kernel, so no NVIDIA pieces
# Prints the output's path, size, build time and (disk) sha256.
set -euo pipefail
cd "$(dirname "$0")/.."
format=${1:-disk}
case $format in disk|directory) ;; *) echo "usage: image/build.sh disk|directory" >&2; exit 2 ;; esac
work=build/image
start=$(date +%s)

bash image/host-tools.sh
bash image/build-wheels.sh $work/wheelhouse
# mkosi's package manager uses this machine's own Debian mirror (main, updates, security).
nvidia=${NVIDIA:-0}
[ "$format" = disk ] || nvidia=0
components=main
[ "$nvidia" = 1 ] && components="main contrib non-free non-free-firmware"
rm -rf $work/pkgmngr
python3 image/apt_sources.py image "$(sed -n 's/^Release=//p' mkosi.conf)" $work/pkgmngr $components
mirror=$(python3 image/apt_sources.py mirrors | sed -n 's/^archive=//p')
# Reproducible: every mtime in the image is clamped to the last commit's time.
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || echo 1700000000)
export SOURCE_DATE_EPOCH

args=(--force --format="$format" --package-manager-tree="$work/pkgmngr" --mirror="$mirror")
# BUNDLE_PUBKEY=FILE (make image BUNDLE_PUBKEY=...): the key first boot trusts; bundles it did not sign are refused.
rm -rf "$work/trust"
if [ -n "${BUNDLE_PUBKEY:-}" ]; then
  openssl pkey -pubin -in "$BUNDLE_PUBKEY" -noout 2>/dev/null || { echo "BUNDLE_PUBKEY: $BUNDLE_PUBKEY is not a" \
    "PEM public key (openssl genpkey -algorithm ed25519 -out key.pem; openssl pkey -in key.pem -pubout -out" \
    "pub.pem)" >&2; exit 2; }
  install -D -m 0644 "$BUNDLE_PUBKEY" "$work/trust/etc/everycycle/bundle-signing.pub"
  args+=(--extra-tree="$work/trust:/")
  echo "==> first boot will apply only bundles signed by $BUNDLE_PUBKEY"
fi
[ "$format" = disk ] && args+=(--include=image/mkosi.disk.conf)
# CUDA_ARCHS: Pascal (P40, 1080 Ti), Turing, Ampere (3090) and Ada as machine code, and Ada's PTX, which
# the driver compiles for newer cards (Hopper, Blackwell) on first load. Each architecture costs about 25
# minutes on 2 cores; a box of 3090s alone can be built with CUDA_ARCHS=86-real. Commas, not ';' (which
# ends a value in mkosi's settings); the build script turns them into CMake's list.
cuda_archs=${CUDA_ARCHS:-61-real,75-real,86-real,89}
[ "$nvidia" = 1 ] && args+=(--include=image/mkosi.nvidia.conf --environment="EVERYCYCLE_CUDA_ARCHS=$cuda_archs")
echo "==> mkosi build ($format$([ "$nvidia" = 1 ] && echo ", with the NVIDIA driver and CUDA"); log: $work/mkosi-$format.log)"
if ! mkosi "${args[@]}" build > "$work/mkosi-$format.log" 2>&1; then
  echo "mkosi failed; the end of $work/mkosi-$format.log:" >&2
  tail -40 "$work/mkosi-$format.log" >&2
  exit 1
fi
out=$work/out/everycycle
[ "$format" = disk ] && out=$out.raw
[ -e "$out" ] || { echo "mkosi finished but $out is missing" >&2; exit 1; }
echo "==> built in $(( $(date +%s) - start )) s"
echo "    image:  $PWD/$out"
echo "    size:   $(du -sh --apparent-size "$out" | cut -f1) ($(du -sh "$out" | cut -f1) on disk)"
if [ "$format" = disk ]; then
  sha256sum "$out" | tee "$out.sha256" | awk '{print "    sha256: " $1}'
fi
