"""A model pulled into the box's store through the API (Ollama's /api/pull), with Ollama's progress lines.

The pull is the store's own (models/pull.py: http(s) URLs on the LAN, hf://OWNER/REPO/FILE.gguf through
huggingface_hub, resumable, hashed, read as a GGUF before it is admitted), run in a thread of the serving worker;
its progress comes back as the lines Ollama's clients read: `pulling manifest`, `downloading NAME` with `total`
and `completed` bytes (at most once a second), `verifying sha256 digest`, `writing manifest`, `success`, or an
`error`. One pull of a name at a time, and models/pull_slots.MAX_PULLS on the box: a pull beyond them is refused
(409, 429) before it starts, never queued holding a serving thread. The URL, every redirect and the address
reached are judged by the owner's pull_hosts (models/pull_hosts.py).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator
from pathlib import Path

from host_runtime.models.errors import SourceRefused, StoreError
from host_runtime.models.manifest import check_name, name_for_file
from host_runtime.models import catalog
from host_runtime.models.pull import pull, source_file_name
from host_runtime.models.pull_hosts import PullHosts
from host_runtime.models.pull_slots import PullsBusy, PullSlot
from host_runtime.models.store import Store
from host_runtime.serving.errors import APIError

log = logging.getLogger("everycycle.serve")
_DONE = object()


def _fits_here(source: str):
    """The planner's verdict for an hf:// source on this box (models/pull.py asks it before the download)."""
    from host_runtime.engine.limits import DEFAULT_CTX
    from host_runtime.models.verdict import verdict_for

    return verdict_for(source, None, DEFAULT_CTX)


class PullJob:
    """One pull: start() it, then read lines() (each a dict, Ollama's shape) until it ends."""

    def __init__(self, store_root: str, source: str, hosts: PullHosts = PullHosts()):
        self.source, self.hosts = source, hosts
        self.store = Store(Path(store_root))
        try:
            catalogued = catalog.resolve(source) if "://" not in source else None
            if catalogued is not None:  # qwen3:8b: the catalog's repository, stored as qwen3-8b
                entry, self.source = catalogued
                self.name = entry.store_name
            elif "://" not in source:
                raise APIError(400, f"'model' {source!r} is not in this box's catalog (everycycle models catalog "
                                    "lists it) and there is no Ollama registry here: give a catalog name, an "
                                    "http(s) URL or hf://OWNER/REPO:QUANT", param="model")
            else:
                self.name = check_name(name_for_file(source_file_name(source)))
            self.store.refuse_existing(self.name)
        except StoreError as exc:
            raise APIError(400, str(exc), param="model") from None
        self._lines: queue.Queue = queue.Queue()
        self.error: APIError | None = None

    def start(self) -> None:
        try:
            self._slot = PullSlot.take(self.store.partial_dir(), self.name)
        except PullsBusy as exc:
            if exc.same_name:
                raise APIError(409, str(exc), error_type="invalid_request_error", code="pull_in_progress",
                               param="model") from None
            raise APIError(429, str(exc), error_type="rate_limit_error", code="too_many_pulls",
                           retry_after=30) from None
        except StoreError as exc:  # the store's partial folder: the box's own trouble
            raise APIError(503, str(exc), error_type="server_error", code="store_unavailable") from None
        threading.Thread(target=self._run, name=f"pull-{self.name}", daemon=True).start()

    def lines(self) -> Iterator[dict]:
        while (line := self._lines.get()) is not _DONE:
            yield line

    def _run(self) -> None:
        def observe(progress) -> None:
            if progress.total is not None and progress.done >= progress.total:
                self._lines.put({"status": "verifying sha256 digest"})
            self._lines.put({"status": f"downloading {self.name}", "digest": self.name,
                             "total": progress.total or 0, "completed": progress.done})

        try:
            self._lines.put({"status": "pulling manifest"})
            pull(self.store, self.source, self.name, say=lambda _: None, observe=observe, hosts=self.hosts,
                 slot=self._slot, fits=_fits_here)
            self._lines.put({"status": "writing manifest"})
            self._lines.put({"status": "success"})
        except SourceRefused as exc:  # no such file, no access, not a GGUF, a wrong hash: the request's fault
            self.error = APIError(400, str(exc), param="model", code="pull_refused")
            self._lines.put({"error": str(exc)})
        except StoreError as exc:  # the network, the server, the disk: try again later
            self.error = APIError(502, f"{exc} (run the same pull again to resume)", error_type="server_error",
                                  code="pull_failed")
            self._lines.put({"error": self.error.message})
        finally:
            self._slot.release()
            self._lines.put(_DONE)
