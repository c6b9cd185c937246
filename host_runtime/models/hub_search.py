"""`everycycle models search TEXT`: GGUF repositories on the Hub (huggingface_hub's search, at the HF_ENDPOINT the
owner set, or the Hub), each with its quantizations' sizes and whether each is likely to fit this box by size, and
the name that pulls it (hf://OWNER/REPO:QUANT, which reads the file's header and asks the planner before the
download). The grouping and the size check are pure (`quantizations`, `by_size`); the listing calls the Hub."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from host_runtime.models.errors import SourceRefused, StoreError
from host_runtime.placement.gguf_split import set_stem

QUANT = re.compile(r"(?i)(?:^|[-_.])((?:I?Q\d[\w]*|F16|BF16|F32|MXFP4))(?=$|[-_.])")
LIKELY_FITS = "likely fits"
OVERHEAD = 1.15  # weights to what a loaded model holds at a modest context (KV and compute buffers), as a rule


@dataclass(frozen=True)
class Quantization:
    repo: str
    quant: str
    size_bytes: int
    parts: int        # files it is split into (1: one file)
    projector: bool   # the repository has a projector (mmproj*.gguf) the pull brings along

    @property
    def source(self) -> str:
        return f"hf://{self.repo}:{self.quant}"

    def row(self, room_bytes: int) -> tuple[str, str, str]:
        """(its size, a first word on fitting, what pulls it) as the CLI's and the console's search show them."""
        size = (f"{self.size_bytes / 2**30:.1f} GiB" if self.size_bytes >= 2**30
                else f"{self.size_bytes / 2**20:.1f} MiB")
        return (size, by_size(self.size_bytes, room_bytes),
                self.source + (f" ({self.parts} parts)" if self.parts > 1 else ""))


def quantizations(repo: str, files: list[tuple[str, int]]) -> list[Quantization]:
    """Pure: a repository's GGUF files (path, size) grouped by quantization, smallest first."""
    ggufs = [(p, n) for p, n in files if p.lower().endswith(".gguf")]
    projector = any(PurePosixPath(p).name.lower().startswith("mmproj") for p, _ in ggufs)
    sizes: dict[str, list[int]] = {}
    for path, size in ggufs:
        name = PurePosixPath(path).name
        if name.lower().startswith("mmproj"):
            continue
        found = QUANT.findall(set_stem(name))
        if found:
            sizes.setdefault(found[-1].upper(), []).append(size)
    return sorted((Quantization(repo, q, sum(s), len(s), projector) for q, s in sizes.items()),
                  key=lambda q: q.size_bytes)


def by_size(size_bytes: int, room_bytes: int) -> str:
    """Pure: a first word on fitting from the file's size alone (the pull's planner verdict is the real one)."""
    need = size_bytes * OVERHEAD
    if need <= room_bytes:
        return LIKELY_FITS
    return "too big" if size_bytes > room_bytes else "tight"


def search(text: str, limit: int) -> list[tuple[str, list[Quantization]]]:
    """(repository, its quantizations) for the Hub's GGUF repositories matching `text`, most downloaded first."""
    try:
        from huggingface_hub.errors import HfHubHTTPError
    except ImportError:
        raise StoreError("searching the Hub needs huggingface_hub") from None
    api = _api()
    try:
        repos = [m.id for m in api.list_models(search=text, filter="gguf", sort="downloads", limit=limit)]
        return [(repo, quantizations(repo, listing_sizes(repo, api))) for repo in repos]
    except HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None) or 0
        raise (SourceRefused if 400 <= status < 500 else StoreError)(f"searching the Hub for {text!r}: {exc}") \
            from None
    except (OSError, ValueError) as exc:
        raise StoreError(f"searching the Hub for {text!r}: {exc}") from None


def listing_sizes(repo: str, api=None) -> list[tuple[str, int]]:
    """(path, size) of every file in a repository's listing."""
    try:
        from huggingface_hub.errors import HfHubHTTPError
    except ImportError:
        raise StoreError("reading the Hub needs huggingface_hub") from None
    try:
        return [(f.path, int(f.size)) for f in (api or _api()).list_repo_tree(repo, recursive=True)
                if hasattr(f, "size")]
    except HfHubHTTPError as exc:
        raise StoreError(f"listing {repo}: {exc}") from None
    except ValueError as exc:
        raise StoreError(f"listing {repo}: {exc}") from None


def _api():
    """The Hub's client at HF_ENDPOINT as the environment says it now (huggingface_hub reads it once, at import: a
    console that lives for days, or a test, may set it later)."""
    import os

    from huggingface_hub import HfApi

    return HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)
