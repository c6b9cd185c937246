#!/usr/bin/env bash
# Builds the box image with mkosi. Usage: image/build.sh disk|directory
#   disk:      a UEFI-bootable raw disk image (mkosi.conf + image/mkosi.disk.conf), for the box
#   directory: the same system as a directory tree, which systemd-nspawn boots (CI's boot test)
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
rm -rf $work/pkgmngr
python3 image/apt_sources.py image "$(sed -n 's/^Release=//p' mkosi.conf)" $work/pkgmngr
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
echo "==> mkosi build ($format; log: $work/mkosi-$format.log)"
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
