"""A Hugging Face repository's GGUF by its quantization (hf://OWNER/REPO:Q4_K_M, as llama-server's -hf takes it):
the repository's listing read through huggingface_hub (the HF_ENDPOINT the owner set, or the Hub), the file whose
name carries that quantization chosen, and the vision projector beside it (mmproj*.gguf) where there is one. Each
file's sha256 is the listing's own (its LFS object id), which the pull then checks."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from host_runtime.models.errors import SourceRefused, StoreError
from host_runtime.models.sources import hf_quant_parts
from host_runtime.placement.gguf_split import part_names, set_stem, split_of


@dataclass(frozen=True)
class Resolved:
    model: str                 # hf://OWNER/REPO/FILE.gguf[@REVISION]: the file, or a split GGUF's first part
    sha256: str | None         # the listing's, where the file is in LFS
    projector: str | None      # the projector's hf:// source, or None
    projector_sha256: str | None
    parts_sha256: tuple[str | None, ...] = ()  # a split GGUF's further parts' (their sources: part_sources)


def resolve(source: str) -> Resolved:
    """The file and projector a hf://OWNER/REPO:QUANT source names. SourceRefused where the repository has no
    GGUF of that quantization (the ones it has are said), holds several, or lacks a part of a split one."""
    repo, quant, revision = hf_quant_parts(source) or (None, None, None)
    if repo is None:
        raise SourceRefused(f"SOURCE: {source!r} is not hf://OWNER/REPO:QUANT")
    files = _listing(repo, revision, source)
    ggufs = [f for f in files if f.path.lower().endswith(".gguf")]
    projectors = sorted((f for f in ggufs if PurePosixPath(f.path).name.lower().startswith("mmproj")),
                        key=lambda f: ("f16" not in f.path.lower(), f.path))
    pattern = re.compile(rf"(^|[-_.]){re.escape(quant)}([-_.]|$)", re.IGNORECASE)
    models = [f for f in ggufs if f not in projectors]
    chosen = [f for f in models if pattern.search(set_stem(f.path))]
    if not chosen:
        have = sorted({q for f in models for q in re.findall(r"(?i)(?:^|[-_.])((?:I?Q\d[\w]*|F16|BF16|F32))",
                                                               PurePosixPath(f.path).name[:-len(".gguf")])})
        raise SourceRefused(f"{source}: {repo} has no GGUF quantized {quant}" +
                            (f" (it has {', '.join(have)})" if have else " (it has no GGUF file)"))
    firsts = [f for f in chosen if split_of(f.path) is None or split_of(f.path)[0] == 1]
    if len(firsts) != 1:
        raise SourceRefused(f"{source}: {repo} holds {quant} in {len(firsts)} models "
                            f"({', '.join(f.path for f in firsts[:4])}): name one as hf://OWNER/REPO/FILE.gguf")
    model = firsts[0]
    by_path = {f.path: f for f in chosen}
    parts = [by_path.get(name) for name in part_names(model.path)[1:]]
    if None in parts:
        missing = [name for name, f in zip(part_names(model.path)[1:], parts) if f is None]
        raise SourceRefused(f"{source}: {repo} lacks {', '.join(missing[:3])} of the split {model.path}")
    at = f"@{revision}" if revision else ""
    projector = projectors[0] if projectors else None
    return Resolved(f"hf://{repo}/{model.path}{at}", _sha(model),
                    f"hf://{repo}/{projector.path}{at}" if projector else None, _sha(projector) if projector else None,
                    tuple(_sha(f) for f in parts))


def _sha(f) -> str | None:
    return f.lfs.sha256 if getattr(f, "lfs", None) is not None else None


def _listing(repo: str, revision: str | None, source: str) -> list:
    try:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError
    except ImportError:
        raise StoreError("hf:// sources need huggingface_hub (pip install huggingface_hub)") from None
    try:
        return [f for f in HfApi().list_repo_tree(repo, recursive=True, revision=revision) if hasattr(f, "size")]
    except RepositoryNotFoundError:
        raise SourceRefused(f"{source}: no repository {repo} (or it is private)") from None
    except HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None) or 0
        raise (SourceRefused if 400 <= status < 500 else StoreError)(f"{source}: listing {repo}: {exc}") from None
    except (OSError, ValueError) as exc:
        raise StoreError(f"{source}: listing {repo}: {exc}") from None
