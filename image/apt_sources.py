#!/usr/bin/env python3
"""The Debian mirrors this machine already uses, read from its own apt sources.

The repo never names a package registry's host: the image build and CI take the archive and
security mirrors from /etc/apt (deb822 .sources files and one-line .list files alike).

  apt_sources.py mirrors                 prints archive=URI and security=URI
  apt_sources.py backports RELEASE FILE  writes a deb822 source for RELEASE-backports
  apt_sources.py suite SUITE FILE        writes a deb822 source for SUITE (e.g. trixie) from the archive
  apt_sources.py image RELEASE DIR [COMPONENT ...]
                                         writes DIR/etc/apt/sources.list.d/mkosi.sources (which
                                         mkosi 24 reads in place of its own list): the release,
                                         its updates and security, with these components (main
                                         unless named; the NVIDIA image adds contrib non-free
                                         non-free-firmware)
Standard library only (and the project's stdlib-only atomic_write): it runs on the host's python3
before any venv exists.
"""
from __future__ import annotations

import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from host_runtime.common.atomic_file import atomic_write  # noqa: E402  (stdlib only)

KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


class SourcesError(Exception):
    pass


def _deb822_stanzas(text: str) -> list[dict[str, str]]:
    stanzas, cur, key = [], {}, None
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        if not line.strip():
            if cur:
                stanzas.append(cur)
            cur, key = {}, None
            continue
        if line[0] in " \t" and key:
            cur[key] += "\n" + line.strip()
            continue
        if ":" in line:
            key, value = line.split(":", 1)
            key = key.strip().lower()
            cur[key] = value.strip()
    if cur:
        stanzas.append(cur)
    return stanzas


def read_entries(root: str = "/etc/apt") -> list[tuple[str, list[str]]]:
    """(uri, suites) for every enabled binary source on this machine."""
    entries: list[tuple[str, list[str]]] = []
    lists = [os.path.join(root, "sources.list")] + sorted(glob.glob(os.path.join(root, "sources.list.d", "*.list")))
    for path in lists:
        if not os.path.isfile(path):
            continue
        for line in open(path, encoding="utf-8", errors="replace"):
            body = line.split("#", 1)[0].strip()
            if not body.startswith("deb "):
                continue
            rest = body[4:].strip()
            if rest.startswith("["):  # options: [arch=amd64 signed-by=...]
                rest = rest.split("]", 1)[1]
            words = rest.split()
            if len(words) >= 2:
                entries.append((words[0], [words[1]]))
    for path in sorted(glob.glob(os.path.join(root, "sources.list.d", "*.sources"))):
        for st in _deb822_stanzas(open(path, encoding="utf-8", errors="replace").read()):
            if st.get("enabled", "yes").lower() == "no" or "deb" not in st.get("types", "").split():
                continue
            for uri in st.get("uris", "").split():
                entries.append((uri, st.get("suites", "").split()))
    return entries


def mirrors(entries: list[tuple[str, list[str]]]) -> dict[str, str]:
    found: dict[str, str] = {}
    for uri, suites in entries:
        uri = uri.rstrip("/")
        for suite in suites:
            if suite.endswith("-security") or suite.endswith("/updates"):
                found.setdefault("security", uri)
            elif "-" not in suite and suite not in ("nodistro", "stable-updates"):
                found.setdefault("archive", uri)
    if "archive" not in found:
        raise SourcesError("no Debian archive found in this machine's apt sources (/etc/apt)")
    if "security" not in found:
        # A mirror without a separate security path: the archive's sibling directory, as Debian lays it out.
        found["security"] = found["archive"].rsplit("/", 1)[0] + "/debian-security"
    return found


def _stanza(uri: str, suites: str, components: tuple[str, ...] = ("main",)) -> str:
    return (f"Types: deb\nURIs: {uri}\nSuites: {suites}\nComponents: {' '.join(components)}\n"
            f"Signed-By: {KEYRING}\n")


def main(argv: list[str]) -> int:
    try:
        found = mirrors(read_entries())
        if argv[:1] == ["mirrors"]:
            for k, v in found.items():
                print(f"{k}={v}")
        elif argv[:1] == ["backports"] and len(argv) == 3:
            atomic_write(argv[2], _stanza(found["archive"], f"{argv[1]}-backports").encode())
        elif argv[:1] == ["suite"] and len(argv) == 3:
            atomic_write(argv[2], _stanza(found["archive"], argv[1]).encode())
        elif argv[:1] == ["image"] and len(argv) >= 3:
            release, root, components = argv[1], argv[2], tuple(argv[3:]) or ("main",)
            atomic_write(os.path.join(root, "etc/apt/sources.list.d/mkosi.sources"),
                         (_stanza(found["archive"], f"{release} {release}-updates", components) + "\n"
                          + _stanza(found["security"], f"{release}-security", components)).encode())
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except (OSError, SourcesError) as exc:
        print(f"apt_sources: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
