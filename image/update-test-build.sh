#!/usr/bin/env bash
# Builds what image/update_check.py needs into WORK (make image-update-test):
#   v1.raw  the disk as `make image` builds it from this commit (its version: the commit's)
#   v2/     the update files of the same tree with a changed version string (<v1>.2)
#   v3/     the update files of <v1>.3, whose serving is broken on purpose (a model path that does not exist,
#           in the image's service environment), so it can never pass its health gate
# Usage: image/update-test-build.sh WORK [v2|v3 ...]   (default: v2 v3). NVIDIA=0 unless NVIDIA=1 is given:
# the CUDA build takes hours on 2 cores the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:?usage: image/update-test-build.sh WORK [v2|v3 ...]}
shift
wanted=("${@:-v2 v3}")
wanted=(${wanted[@]})
export NVIDIA=${NVIDIA:-0}
# The test releases are signed by the development key (image/build.sh refuses it unless asked for by name).
[ -n "${UPDATE_KEY:-}" ] || export DEV_UPDATE_KEY=1
out=build/image/out
rm -rf "$work"
mkdir -p "$work"
start=$(date +%s)

echo "==> v1: the disk of this commit"
IMAGE_VERSION= bash image/build.sh disk
cp --sparse=always "$out/everycycle.raw" "$work/v1.raw"
cp -r "$out/update" "$work/v1"
v1=$(sed -n 's/^ImageVersion=//p' build/image/version.conf)

for v in "${wanted[@]}"; do
  case $v in
    v2) echo "==> v2: the same tree as $v1.2"
        IMAGE_VERSION=$v1.2 bash image/build.sh disk ;;
    v3) echo "==> v3: $v1.3, serving broken on purpose"
        broken=$work/v3-tree
        mkdir -p "$broken/etc/everycycle"
        sed 's|^EVERYCYCLE_SERVE_ARGS=.*|EVERYCYCLE_SERVE_ARGS=--model /nonexistent/broken-on-purpose.gguf|' \
          rootfs_overlay/etc/everycycle/defaults.env > "$broken/etc/everycycle/defaults.env"
        IMAGE_VERSION=$v1.3 EXTRA_TREE=$PWD/$broken bash image/build.sh disk ;;
    *) echo "unknown release $v (v2, v3)" >&2; exit 2 ;;
  esac
  cp -r "$out/update" "$work/$v"
done
echo "==> built v1 ($v1) and ${wanted[*]} in $(( $(date +%s) - start )) s into $work"
