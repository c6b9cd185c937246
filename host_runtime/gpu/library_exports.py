"""Whether a llama.cpp library carries libstdc++'s own code and offers it to the whole process.

A library linked with a static libstdc++ (or one that picked up libstdc++ code some other way) exports
definitions such as `std::codecvt<char16_t, char, __mbstate_t>::do_unshift` and `std::__cxx11::collate<char>::id`.
Depending on which library loaded libstdc++ first, the process's references then bind to two copies of one
facet's code and data, and std::locale hands out the wrong facet: on the H200 the engine died in the tokenizer's
std::regex with a frame in libggml-cuda. A healthy build exports none of them (the CPU and Vulkan wheel: 0 in
every library). Template instances every C++ library has (weak, `W`/`V`) are not counted: they are the same
code everywhere. Read with binutils' nm.

    python -m host_runtime.gpu.library_exports DIR_OR_LIB...   exit 1 where a library exports any (listed)
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from host_runtime.common.errors import EveryCycleError

# Strong definitions (T text, B bss, D data, R read-only) whose mangled name is in namespace std. Mangled, not
# demangled: a function of ours returning std::string demangles to a line that mentions std:: too. GNU-unique
# ones (u) are left out: every C++ library has some (std::piecewise_construct, an inline variable; nvcc's host
# code too), while a static libstdc++ brings hundreds of strong ones (699 for a small library using std::regex).
_LIBSTDCXX_DEFINITION = re.compile(r"^\S+ [TBDR] ((?:_ZNSt|_ZNKSt|_ZTVSt|_ZTISt|_ZTSSt|_ZSt|_ZTTSt)\S*)$")


class ExportsUnreadable(EveryCycleError):
    """nm is missing or could not read the file."""


def libstdcxx_definitions(library: str | Path) -> list[str]:
    """The mangled names of the libstdc++ definitions `library` exports (healthy: none)."""
    try:
        out = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True,
                             timeout=60)
    except FileNotFoundError:
        raise ExportsUnreadable("nm is not installed (Debian's binutils)") from None
    if out.returncode != 0:
        raise ExportsUnreadable(f"nm could not read {library}: {out.stderr.strip()}")
    return [m.group(1) for m in map(_LIBSTDCXX_DEFINITION.match, out.stdout.splitlines()) if m]


def libraries_in(paths: list[str | Path]) -> list[Path]:
    """Each shared library named, or found directly in a folder named (links followed to one file each)."""
    found: dict[Path, Path] = {}
    for p in map(Path, paths):
        for lib in sorted(p.glob("lib*.so*")) if p.is_dir() else [p]:
            found.setdefault(lib.resolve(), lib)
    return list(found.values())


def main(argv: list[str] | None = None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    bad = 0
    for lib in libraries_in(paths):
        try:
            names = libstdcxx_definitions(lib)
        except ExportsUnreadable as exc:
            print(f"{lib}: {exc}", file=sys.stderr)
            return 2
        print(f"{lib}: exports {len(names)} libstdc++ definitions")
        for name in names[:5]:
            print(f"    {name}")
        bad += bool(names)
    if bad:
        print(f"{bad} of them carr{'ies' if bad == 1 else 'y'} libstdc++ code of its own: build with one "
              "compiler and the shared libstdc++ (no -static-libstdc++), and link with -Wl,--exclude-libs,ALL",
              file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
