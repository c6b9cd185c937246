"""Image versions: how a build is named, and how two versions compare.

A version is the project's version, the commit's UTC time and the commit: 0.1.0.202612010023.33e78d2, so
builds of later commits sort later. It names the update files (everycycle_<v>.efi, everycycle_<v>.root.raw.zst),
the root slot's GPT label (ec_<v>: a GPT label holds at most 36 characters) and IMAGE_VERSION in os-release.
The comparison is systemd's (strverscmp_improved, UAPI's version format) for the characters a version may hold,
so the box orders versions as systemd-sysupdate and systemd-boot do.
"""

from __future__ import annotations

import re
import time

from host_runtime.update.errors import UpdateError

UKI_PREFIX = "everycycle_"
LABEL_PREFIX = "ec_"
GPT_LABEL_MAX = 36
_ALLOWED = re.compile(r"[0-9A-Za-z][0-9A-Za-z.~^_-]*")


def compose(project_version: str, commit_time: int, commit: str) -> str:
    stamp = time.strftime("%Y%m%d%H%M", time.gmtime(commit_time))
    return check(f"{project_version}.{stamp}.{commit[:7]}")


def check(version: str) -> str:
    """The version, or UpdateError saying why it cannot name a slot."""
    if not _ALLOWED.fullmatch(version or ""):
        raise UpdateError(f"version {version!r}: only letters, digits and . ~ ^ _ - are allowed, starting with "
                          f"a letter or digit")
    if len(LABEL_PREFIX + version) > GPT_LABEL_MAX:
        raise UpdateError(f"version {version!r} is {len(version)} characters; the root slot's GPT label "
                          f"{LABEL_PREFIX}<version> holds at most {GPT_LABEL_MAX}")
    return version


def partition_label(version: str) -> str:
    return LABEL_PREFIX + check(version)


def version_of_label(label: str) -> str | None:
    return label[len(LABEL_PREFIX):] if label.startswith(LABEL_PREFIX) else None


def compare(a: str, b: str) -> int:
    """-1, 0 or 1 as a is older than, the same as, or newer than b (systemd's strverscmp_improved)."""
    i = j = 0
    while True:
        # Characters that are not part of a version are skipped.
        while i < len(a) and not (a[i].isalnum() or a[i] in "~-^."):
            i += 1
        while j < len(b) and not (b[j].isalnum() or b[j] in "~-^."):
            j += 1
        ca, cb = a[i:i + 1], b[j:j + 1]
        # '~' is older than anything, even the end of the string (a pre-release).
        if ca == "~" or cb == "~":
            if ca != "~":
                return 1
            if cb != "~":
                return -1
            i, j = i + 1, j + 1
            continue
        if not ca or not cb:
            return (not cb and bool(ca)) - (not ca and bool(cb))
        # '-' splits off a release part: the side that has it here is the older; with '^' (a patched
        # release) or '.' (one more component) it is the newer.
        for sep, newer in (("-", False), ("^", True), (".", True)):
            if ca == sep or cb == sep:
                if ca != sep:
                    return -1 if newer else 1
                if cb != sep:
                    return 1 if newer else -1
                i, j = i + 1, j + 1
                break
        else:
            if ca.isdigit() or cb.isdigit():
                if not ca.isdigit():
                    return -1
                if not cb.isdigit():
                    return 1
                ma = re.match(r"0*(\d*)", a[i:])
                mb = re.match(r"0*(\d*)", b[j:])
                na, nb = ma.group(1), mb.group(1)
                if len(na) != len(nb):
                    return 1 if len(na) > len(nb) else -1
                if na != nb:
                    return 1 if na > nb else -1
                i, j = i + ma.end(), j + mb.end()
            else:
                ma = re.match(r"[A-Za-z]+", a[i:])
                mb = re.match(r"[A-Za-z]+", b[j:])
                sa, sb = ma.group(0), mb.group(0)
                if sa != sb:
                    # The shorter run of letters is older where one is the other's start ("a" < "ab").
                    return 1 if sa > sb else -1
                i, j = i + ma.end(), j + mb.end()
            continue
