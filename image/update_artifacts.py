"""The update files of one disk build (run by image/build.sh after mkosi):

  update_artifacts.py DISK.raw UKI.efi VERSION PRIVATE_KEY.pem OUT_DIR

writes OUT_DIR/everycycle_<v>.root.raw.zst (root slot A's partition, as the disk holds it, zstd-compressed),
OUT_DIR/everycycle_<v>.efi, SHA256SUMS and SHA256SUMS.sig (host_runtime/update/release.py: the format the box
checks). Deterministic: the same disk and key give the same files (zstd at a fixed level, one thread; Ed25519).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from host_runtime.update import release, versioning  # noqa: E402


def partition_range(disk: Path, label: str) -> tuple[int, int]:
    table = json.loads(subprocess.run(["sfdisk", "--json", str(disk)], check=True, capture_output=True,
                                      text=True).stdout)["partitiontable"]
    sector = table.get("sectorsize", 512)
    for part in table["partitions"]:
        if part.get("name") == label:
            return part["start"] * sector, part["size"] * sector
    raise SystemExit(f"update_artifacts: {disk} has no partition labelled {label}")


def main(argv: list[str]) -> int:
    if len(argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    disk, uki, version, key, out = Path(argv[0]), Path(argv[1]), argv[2], Path(argv[3]), Path(argv[4])
    rel = release.Release(versioning.check(version), {})
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    offset, size = partition_range(disk, versioning.partition_label(version))
    with open(disk, "rb") as src, open(out / rel.root_file, "wb") as dst:
        zstd = subprocess.Popen(["zstd", "-q", "-3", "-T1", "--no-progress", "-c"], stdin=subprocess.PIPE,
                                stdout=dst)
        src.seek(offset)
        left = size
        while left:
            block = src.read(min(left, 16 << 20))
            if not block:
                raise SystemExit(f"update_artifacts: {disk} ends inside the root partition")
            zstd.stdin.write(block)
            left -= len(block)
        zstd.stdin.close()
        if zstd.wait() != 0:
            raise SystemExit("update_artifacts: zstd failed")
    shutil.copyfile(uki, out / rel.uki_file)
    written = release.write(out, version, key.read_bytes())
    for name in (*written.files, release.SUMS, release.SIGNATURE):
        print(f"    {(out / name).stat().st_size:>14,}  {out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
