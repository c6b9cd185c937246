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
from host_runtime.common.download import Progress, TooLarge, copy_hashing, file_sha256
from host_runtime.models.errors import SourceRefused, StoreError
from host_runtime.models.manifest import Manifest, check_name, name_for_file
from host_runtime.models.pull_hosts import PullHosts
from host_runtime.models.pull_slots import PullSlot
from host_runtime.models import catalog, hf_names
from host_runtime.models.sources import check_sha256, hf_parts, hf_quant_parts, part_sources, source_file_name
from host_runtime.placement.gguf_split import part_names
from host_runtime.models.store import Store, check_projector

HTTP_TIMEOUT_S = 30
MAX_REDIRECTS = 5  # a download's link to its mirror and the mirror's to its CDN, with room to spare


def add(store: Store, file: Path, name: str | None = None, sha256: str | None = None, say=print,
        projector: Path | None = None) -> Manifest:
    """A local GGUF copied into the store (a USB stick, a file already on the box), with its vision projector
    where one is given (checked before anything is copied; the model removed again if it cannot be kept). A split
    GGUF is added by its first part (FILE-00001-of-0000N.gguf), the others beside it; sha256 is the first part's."""
    expected = check_sha256(sha256)
    if projector is not None:
        check_projector(projector)
    name = check_name(name or name_for_file(file.name))
    store.refuse_existing(name)
    if not file.is_file():
        raise StoreError(f"FILE: {file} is not a file")
    parts = [Path(each) for each in part_names(str(file))[1:]]
    for number, part in enumerate(parts, start=2):
        if not part.is_file():
            raise StoreError(f"FILE: {file.name} is part 1 of {len(parts) + 1} of a split GGUF, and part {number} "
                             f"({part.name}) is not beside it")
    store.check_room(sum(f.stat().st_size for f in (file, *parts)), name)
    say(f"hashing {file}" + (f" and its {len(parts)} further parts" if parts else ""))
    digest = file_sha256(file).hexdigest()
    if expected and digest != expected:
        raise StoreError(f"{file.name}: sha256 {digest} is not the {expected} given; nothing was added")
    manifest = store.admit(file, name, digest, str(file.resolve()), move=False,
                           parts=tuple((part, file_sha256(part).hexdigest()) for part in parts))
    if projector is None:
        return manifest
    try:
        say(f"copying the projector {projector}")
        return store.attach_projector(name, projector)
    except (StoreError, OSError):
        store.remove(name)  # nothing half-added
        raise


class DoesNotFit(SourceRefused):
    """The planner's verdict, from the model's header, says this box cannot run it: nothing was downloaded."""


def pull(store: Store, source: str, name: str | None = None, sha256: str | None = None, say=print,
         observe=None, hosts: PullHosts | None = None, slot: PullSlot | None = None, fits=None) -> Manifest:
    """observe(download.Progress), if given, follows the download (the first-boot pull's status file). hosts:
    the hosts a pull asked for through the API may reach (models/pull_hosts.py); None: anywhere (the owner's CLI).
    slot: this pull's, taken by the caller (the API, which answers PullsBusy before it starts); else taken here
    and given back at the end. fits(source) -> verdict.Verdict, if given: the planner's verdict from the file's
    header (a range request of its first megabytes), said, and DoesNotFit before any download where it does not
    fit; a header that cannot be read (a Whisper model's .bin, a server that ignores ranges) is said and the pull
    goes on. It is asked of hf:// sources always and of URLs only where no hosts judge them (the owner's CLI): the
    header's request would otherwise reach a host the API's judge never saw."""
    expected = check_sha256(sha256)
    scheme = urllib.parse.urlsplit(source).scheme
    catalogued = catalog.resolve(source) if scheme not in ("http", "https", "hf") else None
    if catalogued is not None:  # a short name (qwen3:8b): the catalog's repository and quantization
        entry, source = catalogued
        name, scheme = name or entry.store_name, "hf"
        say(f"{entry.full_name}: {source} ({entry.license}; {', '.join(entry.can)})")
    if scheme not in ("http", "https", "hf"):
        raise SourceRefused(f"SOURCE: {source!r} is neither a name in the catalog (everycycle models catalog), an "
                            "http(s) URL nor hf://OWNER/REPO/FILE.gguf (a file on the box: everycycle models add FILE)")
    name = check_name(name or name_for_file(source_file_name(source)))
    store.refuse_existing(name)
    named = None
    expected_parts: tuple[str | None, ...] = ()
    if hf_quant_parts(source) is not None:  # hf://OWNER/REPO:QUANT: the file and its projector from the listing
        named = hf_names.resolve(source)
        say(f"{source}: {named.model}" + (f" and its {len(named.parts_sha256)} further parts"
                                          if named.parts_sha256 else "")
            + (f", with the projector {named.projector}" if named.projector else ""))
        source, expected, expected_parts = named.model, expected or named.sha256, named.parts_sha256
    sources = part_sources(source)
    if len(sources) > 1 and scheme != "hf":
        raise SourceRefused(f"{source} is part 1 of {len(sources)} of a split GGUF: pull it from the Hub "
                            "(hf://OWNER/REPO/FILE-00001-of-...gguf, which brings every part), or download the parts "
                            "and add the first (everycycle models add FILE)")
    if fits is not None and (scheme == "hf" or hosts is None):
        _check_fit(source, fits, say)
    own = slot is None
    slot = slot or PullSlot.take(store.partial_dir(), name)
    try:
        manifest = _pull_in(store, sources, name, (expected, *expected_parts), scheme, say, observe, hosts, slot)
        if named is not None and named.projector:
            manifest = _with_projector(store, name, named, say)
    finally:
        if own:
            slot.release()
    say(f"{name}: {manifest.size / 2**20:,.1f} MiB, {manifest.architecture} {manifest.quantization}, sha256 "
        f"{manifest.sha256}")
    return manifest


def _check_fit(source: str, fits, say) -> None:
    from host_runtime.models.verdict import VerdictError

    try:
        verdict = fits(source)
    except VerdictError as exc:
        say(f"{source}: not planned before the download ({exc})")
        return
    say(verdict.text)
    if not verdict.fits:
        raise DoesNotFit(f"{source} does not fit this box, so nothing was downloaded: {verdict.text} (a smaller "
                         "quantization may; `everycycle models pull --no-fit-check` pulls it all the same)")


def _with_projector(store: Store, name: str, named: hf_names.Resolved, say) -> Manifest:
    """The repository's projector pulled and kept beside the model just admitted; on failure the model goes again
    (nothing half-pulled)."""
    try:
        from huggingface_hub import hf_hub_download

        repo, path, revision = hf_parts(named.projector)
        say(f"pulling {name}'s projector {path}")
        local = store.partial_dir() / f"hf-{name}-projector"
        file = Path(hf_hub_download(repo, path, revision=revision, local_dir=local))
        if named.projector_sha256 and file_sha256(file).hexdigest() != named.projector_sha256:
            raise SourceRefused(f"{named.projector}: its sha256 is not the listing's: nothing was added")
        manifest = store.attach_projector(name, file)
        shutil.rmtree(local, ignore_errors=True)
        return manifest
    except BaseException:
        store.remove(name)
        raise


def _pull_in(store: Store, sources: list[str], name: str, expected: tuple[str | None, ...], scheme: str, say,
             observe, hosts: PullHosts | None, slot: PullSlot) -> Manifest:
    """The file (or a split GGUF's parts, from the Hub) downloaded, each checked against its expected sha256
    where there is one, and admitted together."""
    if scheme == "hf":
        files = _pull_hf(store, sources, name, say, observe, slot)
    else:
        files = [_pull_http(store, sources[0], name, say, observe, hosts, slot)]
    for source, (_, digest), want in zip(sources, files, expected):
        if want and digest != want:
            slot.finish()
            raise SourceRefused(f"{source}: sha256 {digest} is not the {want} expected: the download was altered "
                                "or is another file; nothing was added")
    try:
        (file, digest), *parts = files
        manifest = store.admit(file, name, digest, sources[0], move=True, parts=tuple(parts))
    except StoreError as exc:
        slot.finish()
        raise SourceRefused(str(exc)) from None
    slot.finish()
    return manifest


def _partial(store: Store, name: str) -> tuple[Path, Path]:
    d = store.partial_dir()
    return d / f"{name}.gguf.part", d / f"{name}.json"


def _open(url: str, headers: dict, hosts: PullHosts | None) -> http_client.Stream:
    """The download's answer. Judged by `hosts` (a pull through the API): every URL before it is fetched, each
    redirect followed here, and the address actually reached; never through a proxy (whose address is the one
    reached). Unjudged (the owner's CLI): redirects followed, through the environment's proxy where one is set."""
    try:
        if hosts is None:
            return http_client.open_stream(url, headers=headers, timeout=HTTP_TIMEOUT_S, trust_env=True)
        for _ in range(MAX_REDIRECTS + 1):
            hosts.check_url(url)
            resp = http_client.open_stream(url, headers=headers, timeout=HTTP_TIMEOUT_S, follow_redirects=False)
            try:
                if resp.peer_address is not None:
                    hosts.check_address(urllib.parse.urlsplit(url).hostname or "", resp.peer_address)
            except SourceRefused:
                resp.close()
                raise
            location = resp.headers.get("Location")
            if resp.status not in (301, 302, 303, 307, 308) or not location:
                return resp
            resp.close()
            url = urllib.parse.urljoin(url, location)
        raise SourceRefused(f"more than {MAX_REDIRECTS} redirects")
    except http_client.HTTPFailure as exc:
        raise StoreError(f"{exc.why}") from None


def _pull_http(store: Store, url: str, name: str, say, observe=None, hosts: PullHosts | None = None,
               slot: PullSlot | None = None) -> tuple[Path, str]:
    part, meta = _partial(store, name)
    try:
        kept = json.loads(meta.read_text()) if meta.exists() else {}
    except ValueError:
        kept = {}
    already = part.stat().st_size if part.exists() and kept.get("source") == url else 0
    if not already:
        part.unlink(missing_ok=True)
    try:
        resp = _open(url, {"Range": f"bytes={already}-"} if already else {}, hosts)
    except StoreError as exc:
        raise type(exc)(f"{url}: {exc}") from None
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
    try:
        may_write = slot.reserve(url, total, store.room(), already)  # beside the other pulls running
    except StoreError:
        resp.close()
        raise
    if already:
        say(f"resuming {name} at {already / 2**20:,.1f} MiB")
    progress = Progress(f"pulling {name}", total, say, already=already, observe=observe)
    digest = file_sha256(part) if already else None
    try:
        # At most what the server declared (or, declaring nothing, the room the store keeps free).
        sha = copy_hashing(resp, part, progress, append=already > 0, digest=digest, limit=may_write)
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


def _pull_hf(store: Store, sources: list[str], name: str, say, observe, slot: PullSlot) -> list[tuple[Path, str]]:
    """Each source's file (one, or a split GGUF's parts) through huggingface_hub, into the pull's own folder
    (hf-NAME, where a pull run again resumes), then hashed: [(file, sha256)] in order."""
    try:
        from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError:
        raise StoreError("hf:// sources need huggingface_hub (pip install huggingface_hub)") from None
    local = store.partial_dir() / f"hf-{name}"
    try:
        wanted = [hf_parts(source) for source in sources]
        sizes = [get_hf_file_metadata(hf_hub_url(repo, path, revision=revision)).size
                 for repo, path, revision in wanted]
        total = None if None in sizes else sum(sizes)
        slot.reserve(sources[0], total, store.room())
        say(f"pulling {name} from {wanted[0][0]} ({(total or 0) / 2**20:,.1f} MiB"
            + (f" in {len(sources)} parts" if len(sources) > 1 else "") + ") through huggingface_hub")
        progress = Progress(f"pulling {name}", total, say, observe=observe)
        files = [Path(hf_hub_download(repo, path, revision=revision, local_dir=local,
                                      tqdm_class=_progress_bar(progress)))
                 for repo, path, revision in wanted]
    except HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None) or 0
        raise _http_error(status)(f"{sources[0]}: {exc}; run the same pull again to resume") from None
    except (LocalEntryNotFoundError, OSError, ValueError) as exc:
        raise StoreError(f"{sources[0]}: {exc}; run the same pull again to resume") from None
    part, _ = _partial(store, name)
    os.replace(files[0], part)  # the others wait in hf-NAME until admitted (the slot's end removes the folder)
    if len(files) == 1:
        shutil.rmtree(local, ignore_errors=True)
    say(f"hashing {name}")
    return [(file, file_sha256(file).hexdigest()) for file in (part, *files[1:])]


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
