"""Bringing a model into the store: from an http(s) URL on the LAN (resumable with a Range request), from a
Hugging Face file (`hf://owner/repo/path/file.gguf[@revision]`, through huggingface_hub, which honours
HF_ENDPOINT and resumes by itself), or from a local file. The file is hashed as it arrives, checked against
--sha256 when given, read as a GGUF, and only then admitted (store.admit)."""

from __future__ import annotations

import json
import os
import shutil
import urllib.parse
from pathlib import Path

from host_runtime.common import http_client
from host_runtime.common.atomic_file import atomic_write
from host_runtime.common.download import Progress, TooLarge, copy_hashing, file_sha256
from host_runtime.models.errors import SourceRefused, StoreError
from host_runtime.models.manifest import Manifest, check_name, name_for_file
from host_runtime.models.sources import check_sha256, hf_parts, source_file_name
from host_runtime.models.store import Store

HTTP_TIMEOUT_S = 30


def add(store: Store, file: Path, name: str | None = None, sha256: str | None = None, say=print) -> Manifest:
    """A local GGUF copied into the store (a USB stick, a file already on the box)."""
    expected = check_sha256(sha256)
    name = check_name(name or name_for_file(file.name))
    store.refuse_existing(name)
    if not file.is_file():
        raise StoreError(f"FILE: {file} is not a file")
    store.check_room(file.stat().st_size, name)
    say(f"hashing {file}")
    digest = file_sha256(file).hexdigest()
    if expected and digest != expected:
        raise StoreError(f"{file.name}: sha256 {digest} is not the {expected} given; nothing was added")
    return store.admit(file, name, digest, str(file.resolve()), move=False)


def pull(store: Store, source: str, name: str | None = None, sha256: str | None = None, say=print,
         observe=None) -> Manifest:
    """observe(download.Progress), if given, follows the download (the first-boot pull's status file)."""
    expected = check_sha256(sha256)
    scheme = urllib.parse.urlsplit(source).scheme
    if scheme not in ("http", "https", "hf"):
        raise SourceRefused(f"SOURCE: {source!r} is neither an http(s) URL nor hf://OWNER/REPO/FILE.gguf "
                         "(a file on the box: everycycle models add FILE)")
    name = check_name(name or name_for_file(source_file_name(source)))
    store.refuse_existing(name)
    if scheme == "hf":
        file, digest = _pull_hf(store, source, name, say, observe)
    else:
        file, digest = _pull_http(store, source, name, say, observe)
    if expected and digest != expected:
        _forget(store, name)
        raise SourceRefused(f"{source}: sha256 {digest} is not the {expected} given: the download was altered or is "
                         "another file; nothing was added")
    try:
        manifest = store.admit(file, name, digest, source, move=True)
    except StoreError as exc:
        _forget(store, name)
        raise SourceRefused(str(exc)) from None
    _forget(store, name)
    say(f"{name}: {manifest.size / 2**20:,.1f} MiB, {manifest.architecture} {manifest.quantization}, sha256 {digest}")
    return manifest


def _partial(store: Store, name: str) -> tuple[Path, Path]:
    d = store.partial_dir()
    return d / f"{name}.gguf.part", d / f"{name}.json"


def _forget(store: Store, name: str) -> None:
    part, meta = _partial(store, name)
    part.unlink(missing_ok=True)
    meta.unlink(missing_ok=True)
    shutil.rmtree(store.partial_dir() / f"hf-{name}", ignore_errors=True)


def _pull_http(store: Store, url: str, name: str, say, observe=None) -> tuple[Path, str]:
    part, meta = _partial(store, name)
    try:
        kept = json.loads(meta.read_text()) if meta.exists() else {}
    except ValueError:
        kept = {}
    already = part.stat().st_size if part.exists() and kept.get("source") == url else 0
    if not already:
        part.unlink(missing_ok=True)
    try:
        # A server on the LAN or beyond it (through the environment's proxy, as a download may need).
        resp = http_client.open_stream(url, headers={"Range": f"bytes={already}-"} if already else {},
                                       timeout=HTTP_TIMEOUT_S, trust_env=True)
    except http_client.HTTPFailure as exc:
        raise StoreError(f"{url}: {exc.why}") from None
    if resp.status >= 300:
        resp.close()
        if resp.status == 416 and already:  # the part is already whole
            return part, file_sha256(part).hexdigest()
        raise _http_error(resp.status)(f"{url}: HTTP {resp.status} {resp.reason}")
    resumed = resp.status == 206
    if already and not resumed:
        say(f"{url} does not resume downloads: starting again")
        already = 0
    length = resp.headers.get("Content-Length")
    total = (already + int(length)) if length and length.isdigit() else None
    store.check_room(None if total is None else total - already, name)
    atomic_write(meta, json.dumps({"source": url, "total": total}).encode(), mode=0o600)
    if already:
        say(f"resuming {name} at {already / 2**20:,.1f} MiB")
    progress = Progress(f"pulling {name}", total, say, already=already, observe=observe)
    digest = file_sha256(part) if already else None
    try:
        # At most what the server declared (or, declaring nothing, the room the store keeps free).
        sha = copy_hashing(resp, part, progress, append=already > 0, digest=digest,
                           limit=store.room() if total is None else total - already)
    except TooLarge as exc:
        part.unlink(missing_ok=True)
        bound = "the size it declared" if total is not None else f"the room {store.root} has, keeping the reserve"
        raise StoreError(f"{url}: {exc} ({bound}); nothing was kept") from None
    except OSError as exc:
        raise StoreError(f"{url}: the download stopped at {progress.done / 2**20:,.1f} MiB ({exc}); run the same "
                         "pull again to resume") from None
    if total is not None and part.stat().st_size != total:
        raise StoreError(f"{url}: the download stopped at {part.stat().st_size / 2**20:,.1f} of "
                         f"{total / 2**20:,.1f} MiB; run the same pull again to resume")
    say(progress.line())
    return part, sha


def _pull_hf(store: Store, source: str, name: str, say, observe=None) -> tuple[Path, str]:
    try:
        from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError:
        raise StoreError("hf:// sources need huggingface_hub (pip install huggingface_hub)") from None
    repo, path, revision = hf_parts(source)
    local = store.partial_dir() / f"hf-{name}"
    try:
        meta = get_hf_file_metadata(hf_hub_url(repo, path, revision=revision))
        store.check_room(meta.size, name)
        say(f"pulling {name} from {repo} ({(meta.size or 0) / 2**20:,.1f} MiB) through huggingface_hub")
        progress = Progress(f"pulling {name}", meta.size, say, observe=observe)
        file = Path(hf_hub_download(repo, path, revision=revision, local_dir=local,
                                    tqdm_class=_progress_bar(progress)))
    except HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None) or 0
        raise _http_error(status)(f"{source}: {exc}; run the same pull again to resume") from None
    except (LocalEntryNotFoundError, OSError, ValueError) as exc:
        raise StoreError(f"{source}: {exc}; run the same pull again to resume") from None
    part, _ = _partial(store, name)
    os.replace(file, part)
    shutil.rmtree(local, ignore_errors=True)
    say(f"hashing {name}")
    return part, file_sha256(part).hexdigest()



def _http_error(status: int) -> type[StoreError]:
    """A client error (no such file, no access) stays one: SourceRefused; a server's or a proxy's may pass."""
    return SourceRefused if 400 <= status < 500 and status not in (408, 425, 429) else StoreError


def _progress_bar(progress: Progress):
    """huggingface_hub's progress bar class (its tqdm_class), reporting into our Progress instead of drawing, so
    that the CLI's lines and the first-boot status are the same for every source."""
    from tqdm import tqdm  # huggingface_hub's own dependency

    class ProgressBar(tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "disable": True})
            resumed = int(kwargs.get("initial") or 0)
            progress.done += resumed  # already on disk: not part of this run's rate
            progress._resumed_from += resumed

        def update(self, n=1):
            progress(int(n or 0))
            return super().update(n)

    return ProgressBar
