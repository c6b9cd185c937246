"""Whether a model fits this box, before it is pulled or chosen (UI-free: the first-boot wizard and the models
screen show it): its size and the planner's verdict, from the GGUF's tensor table alone. A local file is read in
place; a URL (or hf://) gives its header through a range request, its first megabytes, which hold the table (the
planner's sparse inputs: no weights needed), never the whole file."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from host_runtime.common.errors import InputError
from host_runtime.common import http_client
from host_runtime.models import catalog, hf_names
from host_runtime.models.sources import hf_parts, hf_quant_parts, part_sources, source_file_name
from host_runtime.models.errors import SourceRefused, StoreError
from host_runtime.models.gguf_info import read_table_isolated
from host_runtime.placement.planner import PlacementError, PlanRequest, plan
from host_runtime.placement.session import devices_from_topology, live_devices

HEADER_BYTES = (8 << 20, 64 << 20)  # a small vocabulary's header fits the first; a 256k-token one the second
HTTP_TIMEOUT_S = 20.0


class VerdictError(InputError):
    """The model's header cannot be read; says why."""


@dataclass(frozen=True)
class Verdict:
    fits: bool
    size_bytes: int | None
    text: str  # one line: the size, and where and how it would run, or why it does not fit


def header_from_url(url: str, limit: int) -> tuple[bytes, int | None]:
    """The first `limit` bytes of a remote file and its whole size (from Content-Range; a server that ignores
    Range is read no further than `limit` either)."""
    url = _resolved(url)
    try:
        with http_client.open_stream(url, headers={"Range": f"bytes=0-{limit - 1}"}, timeout=HTTP_TIMEOUT_S,
                                     trust_env=True) as stream:
            if stream.status >= 300:
                raise VerdictError(f"{url}: HTTP {stream.status}")
            total = None
            span = stream.headers.get("Content-Range", "")
            if stream.status == 206 and "/" in span and span.rsplit("/", 1)[1].isdigit():
                total = int(span.rsplit("/", 1)[1])
            elif stream.status == 200 and (stream.headers.get("Content-Length") or "").isdigit():
                total = int(stream.headers["Content-Length"])
            return stream.read(limit), total
    except http_client.HTTPFailure as exc:
        raise VerdictError(f"{url}: {exc.why}") from None


def _catalogued(source: str):
    try:
        return catalog.resolve(source)
    except SourceRefused as exc:  # the catalog's name with a tag it lacks
        raise VerdictError(str(exc)) from None


def _named(source: str) -> str:
    """A catalog name or hf://OWNER/REPO:QUANT as the file it stands for (hf://OWNER/REPO/FILE), through the
    repository's listing; any other source as it is."""
    catalogued = _catalogued(source) if "://" not in source else None
    if catalogued is not None:
        source = catalogued[1]
    if source.startswith("hf://") and hf_quant_parts(source) is not None:
        try:
            source = hf_names.resolve(source).model
        except StoreError as exc:
            raise VerdictError(str(exc)) from None
    return source


def _resolved(source: str) -> str:
    if not source.startswith("hf://"):
        return source

    try:
        from huggingface_hub import hf_hub_url
    except ImportError:
        raise VerdictError("hf:// sources need huggingface_hub") from None
    repo, path, revision = hf_parts(source)
    return hf_hub_url(repo, path, revision=revision)


def read_source_table(source: str):
    """(the model's tensor table, its size in bytes) for a local path, an http(s)/hf:// URL or a catalog name."""
    if "://" not in source and (Path(source).is_file() or _catalogued(source) is None):
        path = Path(source)
        if not path.is_file():
            raise VerdictError(f"{source}: no such file")
        try:  # the reader in its own process, unprivileged: the console that asks runs as root (#56, item 3)
            return read_table_isolated(path), path.stat().st_size
        except StoreError as exc:
            raise VerdictError(str(exc)) from None

    source = _named(source)
    last = None
    for limit in HEADER_BYTES:
        whole = False
        with tempfile.TemporaryDirectory(prefix="everycycle-header-") as tmp:
            total: int | None = 0
            for k, each in enumerate(part_sources(source)):  # a split GGUF's parts: each holds its tensors' table
                head, size = header_from_url(each, limit)
                whole = whole or (k == 0 and len(head) < limit)
                total = None if total is None or size is None else total + size
                # the table is named after its file, as once pulled; a split's parts found beside the first
                (Path(tmp) / source_file_name(each)).write_bytes(head)
            try:
                return read_table_isolated(Path(tmp) / source_file_name(source)), total
            except StoreError as exc:
                last = exc
        if whole:  # the first part was read whole: a longer header will not help
            break
    raise VerdictError(f"{source}: not a GGUF whose header could be read ({last})")


def judge(table, size_bytes: int | None, devices, host, context_cap: int) -> Verdict:
    """Pure: the planner's verdict for this table on these devices and this much RAM, at up to context_cap tokens
    per sequence (the model's trained context is the planner's own cap)."""
    size = ("size unknown" if not size_bytes else f"{size_bytes / 2**30:.1f} GiB" if size_bytes >= 2**30
            else f"{size_bytes / 2**20:.0f} MiB" if size_bytes >= 2**20 else f"{size_bytes / 2**10:.0f} KiB")
    try:
        placed = plan(table, devices, host, PlanRequest(n_ctx_per_seq=context_cap))
    except PlacementError as exc:
        return Verdict(False, size_bytes, f"{table.name}: {size}; does not fit: {exc}")
    on_gpu = [s for s in placed.shares if s.device != "CPU" and s.n_layers]
    where = ("all on the CPU" if not on_gpu else
             ", ".join(f"{s.n_layers} layers on {s.description}" for s in on_gpu) + " (the rest on the CPU)")
    trained = f" of {table.n_ctx_train:,} trained" if table.n_ctx_train else ""
    notes = f"; {'; '.join(placed.notes)}" if placed.notes else ""
    return Verdict(True, size_bytes, f"{table.name}: {size}; fits: {placed.n_ctx_per_seq:,}-token context{trained}, "
                                     f"{placed.n_parallel} sequence(s), {where}{notes}")


def verdict_for(source: str, topology: Path | None, context_cap: int) -> Verdict:
    """The verdict with the devices and free memory discovery last wrote (topology.json), else this machine's."""
    table, size = read_source_table(source)
    try:
        devices, host = devices_from_topology(json.loads(topology.read_text())) if topology else live_devices()
    except (OSError, ValueError, KeyError, TypeError):
        devices, host = live_devices()
    return judge(table, size, devices, host, context_cap)
