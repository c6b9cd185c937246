#!/usr/bin/env bash
# Builds the box image with mkosi. Usage: image/build.sh disk|directory
#   disk:      a UEFI-bootable raw disk image (mkosi.conf + image/mkosi.disk.conf), for the box; with
#              NVIDIA=1 (make image's default) also image/mkosi.nvidia.conf: the NVIDIA driver and the
#              CUDA build of llama.cpp for CUDA_ARCHS (compiled once, about 25 minutes per architecture
#              on 2 cores, then cached)
#   directory: the same system as a directory tree, which systemd-nspawn boots (CI's boot test); no
#              kernel, so no NVIDIA pieces
# Prints the output's path, size, build time, version and (disk) sha256; a disk build also writes its update
# files to build/image/out/update (image/update_artifacts.py).
set -euo pipefail
cd "$(dirname "$0")/.."
format=${1:-disk}
case $format in disk|directory) ;; *) echo "usage: image/build.sh disk|directory" >&2; exit 2 ;; esac
# A disk is what an owner flashes, and its update files are what boxes trust: it is signed by the release key
# (UPDATE_KEY=FILE), or by a development key only when asked for by name (DEV_UPDATE_KEY=1: the image and update
# tests), never by default. Refused before anything is built.
if [ "$format" = disk ] && [ -z "${UPDATE_KEY:-}" ] && [ "${DEV_UPDATE_KEY:-}" != 1 ]; then
  echo "image/build.sh: a disk image needs UPDATE_KEY=FILE (the Ed25519 key, in PEM, that signs its updates:" \
       "openssl genpkey -algorithm ed25519 -out key.pem); DEV_UPDATE_KEY=1 signs with a development key instead," \
       "for tests only" >&2
  exit 2
fi
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

py=${PYTHON:-.venv/bin/python}
# The image's version: the project's, the commit's UTC time and the commit (host_runtime/update/versioning.py).
# IMAGE_VERSION=... overrides it (the update test builds one tree as two versions).
version=${IMAGE_VERSION:-$($py -c 'import sys, tomllib; from host_runtime.update.versioning import compose
print(compose(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"], int(sys.argv[1]), sys.argv[2]))' \
  "$SOURCE_DATE_EPOCH" "$(git rev-parse HEAD 2>/dev/null || echo 0000000)")}
$py -c 'import sys; from host_runtime.update.versioning import check; check(sys.argv[1])' "$version" || exit 2

# The llama.cpp wheels the build overlay compiled are kept outside the clone too, so that CI's fresh clone on the
# same machine reuses them (image/mkosi.build.chroot keys each by the sdist, its flags and the overlay's compiler
# and Python, so a reused one is what a new compile would give). mkosi keeps its package downloads by itself
# (/var/cache/mkosi for root: 393 MiB after one build).
keep=${EVERYCYCLE_CACHE:-$HOME/.cache/everycycle}/image
mkdir -p "$keep/llama-cache" "$work/llama-cache"
copy_new() {  # copy_new FROM TO: every finished cache entry of FROM that TO lacks
  local d
  for d in "$1"/*/; do
    d=${d%/}
    case $d in *.tmp|*/\*) continue ;; esac
    [ -e "$2/${d##*/}" ] || cp -a "$d" "$2/"
  done
}
copy_new "$keep/llama-cache" "$work/llama-cache"
args=(--force --format="$format" --package-manager-tree="$work/pkgmngr" --mirror="$mirror")
mkdir -p "$work"
printf '[Output]\nImageVersion=%s\nOutput=everycycle\n' "$version" > "$work/version.conf"
args+=(--include="$PWD/$work/version.conf")
rm -rf "$work/trust"
# UPDATE_KEY=FILE (make image UPDATE_KEY=...): the Ed25519 private key (PEM) that signs the update files; the
# image trusts its public half. Without one, a development key made once in build/image/update-key signs.
update_key=${UPDATE_KEY:-}
if [ -z "$update_key" ]; then
  update_key=$work/update-key/development.pem
  if [ ! -f "$update_key" ]; then
    mkdir -p -m 0700 "$work/update-key"
    (umask 077; openssl genpkey -algorithm ed25519 -out "$update_key")
  fi
  echo "==> update files signed by the development key $update_key (UPDATE_KEY=FILE for a release)"
fi
openssl pkey -in "$update_key" -noout 2>/dev/null && [ "$(openssl pkey -in "$update_key" -noout -text 2>/dev/null |
  head -1)" = "ED25519 Private-Key:" ] || { echo "UPDATE_KEY: $update_key is not an Ed25519 private key in PEM" \
  "(openssl genpkey -algorithm ed25519 -out key.pem)" >&2; exit 2; }
mkdir -p "$work/trust/usr/share/everycycle"
openssl pkey -in "$update_key" -pubout -out "$work/trust/usr/share/everycycle/update-signing.pub"
chmod 0644 "$work/trust/usr/share/everycycle/update-signing.pub"
args+=(--extra-tree="$work/trust:/")
# BUNDLE_PUBKEY=FILE (make image BUNDLE_PUBKEY=...): the key first boot trusts; bundles it did not sign are refused.
if [ -n "${BUNDLE_PUBKEY:-}" ]; then
  openssl pkey -pubin -in "$BUNDLE_PUBKEY" -noout 2>/dev/null || { echo "BUNDLE_PUBKEY: $BUNDLE_PUBKEY is not a" \
    "PEM public key (openssl genpkey -algorithm ed25519 -out key.pem; openssl pkey -in key.pem -pubout -out" \
    "pub.pem)" >&2; exit 2; }
  install -D -m 0644 "$BUNDLE_PUBKEY" "$work/trust/etc/everycycle/bundle-signing.pub"
  echo "==> first boot will apply only bundles signed by $BUNDLE_PUBKEY"
fi
# The disk: root slots A and B of ROOT_SLOT_SIZE each (every update's root image must fit one: room for the
# NVIDIA driver and CUDA build where they are in), the ESP, and the data partition on /var. This version's kernel
# image mounts its own slot (root=PARTLABEL=ec_<version>).
slot_size=${ROOT_SLOT_SIZE:-$([ "$nvidia" = 1 ] && echo 6G || echo 3G)}
if [ "$format" = disk ]; then
  rm -rf "$work/repart.d" "$work/disk-tree"
  cp -r image/repart.d "$work/repart.d"
  cp -r image/disk-tree "$work/disk-tree"
  find "$work/repart.d" "$work/disk-tree/etc/repart.d" -name '*.conf' -exec \
    sed -i -e "s/@VERSION@/$version/g" -e "s/@SLOT_SIZE@/$slot_size/g" {} +
  printf '[Output]\nRepartDirectories=%s\n[Content]\nKernelCommandLine=root=PARTLABEL=ec_%s rw\n' \
    "$PWD/$work/repart.d" "$version" > "$work/disk-version.conf"
  printf 'UnifiedKernelImageFormat=everycycle_%s\nExtraTrees=%s:/\n' "$version" "$PWD/$work/disk-tree" \
    >> "$work/disk-version.conf"
  args+=(--include=image/mkosi.disk.conf --include="$PWD/$work/disk-version.conf")
fi
# CUDA_ARCHS: Pascal (P40, 1080 Ti), Turing, Ampere (3090) and Ada as machine code, and Ada's PTX, which
# the driver compiles for newer cards (Hopper, Blackwell) on first load. Each architecture costs about 25
# minutes on 2 cores; a box of 3090s alone can be built with CUDA_ARCHS=86-real. Commas, not ';' (which
# ends a value in mkosi's settings); the build script turns them into CMake's list.
cuda_archs=${CUDA_ARCHS:-61-real,75-real,86-real,89}
# EXTRA_TREE=DIR: files laid over the image last (the update test's deliberately broken release).
[ -n "${EXTRA_TREE:-}" ] && args+=(--extra-tree="$EXTRA_TREE:/")
[ "$nvidia" = 1 ] && args+=(--include=image/mkosi.nvidia.conf --environment="EVERYCYCLE_CUDA_ARCHS=$cuda_archs")
echo "==> mkosi build ($format$([ "$nvidia" = 1 ] && echo ", with the NVIDIA driver and CUDA"); log: $work/mkosi-$format.log)"
if ! mkosi "${args[@]}" build > "$work/mkosi-$format.log" 2>&1; then
  echo "mkosi failed; the end of $work/mkosi-$format.log:" >&2
  tail -40 "$work/mkosi-$format.log" >&2
  exit 1
fi
copy_new "$work/llama-cache" "$keep/llama-cache"
out=$work/out/everycycle
[ "$format" = disk ] && out=$out.raw
[ -e "$out" ] || { echo "mkosi finished but $out is missing" >&2; exit 1; }
echo "==> built in $(( $(date +%s) - start )) s"
echo "    image:  $PWD/$out"
echo "    size:   $(du -sh --apparent-size "$out" | cut -f1) ($(du -sh "$out" | cut -f1) on disk)"
echo "    version: $version"
if [ "$format" = disk ]; then
  sha256sum "$out" | tee "$out.sha256" | awk '{print "    sha256: " $1}'
  # The update files of this version (everycycle update apply --from DIR-or-URL takes the folder).
  echo "==> update files (root slot image, kernel image, SHA256SUMS, its signature):"
  $py image/update_artifacts.py "$out" "$work/out/everycycle.efi" "$version" "$update_key" "$work/out/update"
fi
