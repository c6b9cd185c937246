#!/usr/bin/env python3
"""Whether CI must run the A/B update test (qemu, two disk builds: about 20 of CI's 45 minutes) for this commit.

The test proves the update path: the image's build and partitions, its boot units, the signed update files,
`everycycle update` and its health gate. Its inputs are those files (INPUT_PATHS) and the modules the update code
(host_runtime/update) imports, followed to the end; what the test's own harness imports (provisioning, for the
first boot) is the nspawn boot stage's to check, every run. When they are byte for byte what the last passing run had (recorded in
RECORD by `make image-update-test`, with the commit it ran on and its steps), the result stands and CI says so;
any change to one of them, and CI runs the test. The rest of the code reaches the image too, and the nspawn boot
stage (every CI run) checks that the box it builds starts and serves.

  update_test_gate.py check           exit 0: inputs unchanged since a passing run (printed); 1: run the test
  update_test_gate.py record STEPS S  after a passing run of STEPS that took S seconds
  update_test_gate.py inputs          the input files, one per line
"""

from __future__ import annotations

import ast
import datetime
import json
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECORD = REPO / ".ci" / "update-test-passed.json"
# Whole trees the image and its update test are made of, and the update code's own package (pyproject.toml without
# its optional dependencies: _image_part_of_pyproject).
INPUT_PATHS = ("image", "mkosi.conf", "rootfs_overlay", "supervisor.d", "pyproject.toml", "host_runtime/update")
# The steps a passing run must have covered for CI to lean on it: CI's own (the power cut and the rollback are
# make image-update-test's, run when the update code changes).
CI_STEPS = ("tamper", "update")
UPDATE_CODE = REPO / "host_runtime" / "update"
PACKAGES = ("host_runtime", "agent_bmc", "provisioning")


def _module_file(name: str) -> Path | None:
    parts = name.split(".")
    if parts[0] not in PACKAGES:
        return None
    base = REPO.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: Path) -> set[str]:
    """Every module of ours that `path` imports, at any depth of its code (function-level imports too)."""
    names: set[str] = set()
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return names


def import_closure(roots: list[Path]) -> set[Path]:
    """The files of `roots` and of every module of ours they import, transitively (with each package's
    __init__.py, which Python runs on the way)."""
    seen: set[Path] = set()
    todo = list(roots)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _imports(path):
            parts = name.split(".")
            for depth in range(1, len(parts) + 1):
                found = _module_file(".".join(parts[:depth]))
                if found and found not in seen:
                    todo.append(found)
    return seen


def input_files() -> dict[str, str]:
    """path -> git blob id of each input, as the working tree has it (so an uncommitted edit counts)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--", *INPUT_PATHS], cwd=REPO, check=True,
                            capture_output=True).stdout.decode().split("\0")
    paths = {REPO / p for p in listed if p and (REPO / p).is_file()}
    paths |= import_closure(sorted(p for p in paths if p.suffix == ".py" and UPDATE_CODE in p.parents))
    relative = sorted(str(p.relative_to(REPO)) for p in paths)
    blobs = subprocess.run(["git", "hash-object", "--stdin-paths"], cwd=REPO, check=True, capture_output=True,
                           input="\n".join(relative).encode()).stdout.decode().split()
    found = dict(zip(relative, blobs))
    if "pyproject.toml" in found:
        found["pyproject.toml"] = _image_part_of_pyproject()
    return found


def _image_part_of_pyproject() -> str:
    """pyproject.toml as the image sees it: everything but the optional dependencies (the test and bench extras
    are not installed on the box), as the git blob id of its canonical JSON."""
    doc = tomllib.loads((REPO / "pyproject.toml").read_text())
    doc.get("project", {}).pop("optional-dependencies", None)
    return subprocess.run(["git", "hash-object", "--stdin"], cwd=REPO, check=True, capture_output=True,
                          input=json.dumps(doc, sort_keys=True).encode()).stdout.decode().strip()


def changes(recorded: dict[str, str], now: dict[str, str]) -> list[str]:
    """The inputs that differ: changed, added or gone."""
    return sorted(p for p in set(recorded) | set(now) if recorded.get(p) != now.get(p))


def check() -> int:
    try:
        record = json.loads(RECORD.read_text())
    except FileNotFoundError:
        print(f"update test: no passing run is recorded ({RECORD.name}): run it")
        return 1
    if missing := [s for s in CI_STEPS if s not in record.get("steps", [])]:
        print(f"update test: the recorded run lacks steps {missing}: run it")
        return 1
    differ = changes(record.get("inputs", {}), input_files())
    if differ:
        shown = ", ".join(differ[:8]) + (f" and {len(differ) - 8} more" if len(differ) > 8 else "")
        print(f"update test: {len(differ)} of its inputs changed since the passing run on {record['commit']} "
              f"({shown}): run it")
        return 1
    print(f"update test: its {len(record['inputs'])} inputs are unchanged since it passed on {record['commit']} "
          f"({record['date']}, steps {','.join(record['steps'])}, {record['how']}): not run again "
          f"(make image-update-test runs it)")
    return 0


def record(steps: str, seconds: str) -> int:
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "--", *INPUT_PATHS], cwd=REPO, capture_output=True,
                           text=True).stdout.strip()
    body = {"commit": commit + (" with uncommitted inputs" if dirty else ""),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "steps": [s for s in steps.split(",") if s], "how": f"make image-update-test, {int(float(seconds))} s",
            "inputs": input_files()}
    fd, tmp = tempfile.mkstemp(dir=RECORD.parent, prefix=".update-test-passed.")
    with os.fdopen(fd, "w") as f:
        json.dump(body, f, indent=1, sort_keys=True)
        f.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, RECORD)
    print(f"update test: recorded its pass on {body['commit']} ({len(body['inputs'])} inputs) in "
          f"{RECORD.relative_to(REPO)}: commit it, and CI leans on it until one of them changes")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["check"] and len(argv) == 1:
        return check()
    if argv[:1] == ["record"] and len(argv) == 3:
        return record(argv[1], argv[2])
    if argv[:1] == ["inputs"] and len(argv) == 1:
        print("\n".join(input_files()))
        return 0
    print("usage: update_test_gate.py check | record STEPS SECONDS | inputs", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
