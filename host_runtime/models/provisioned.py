"""The model a provisioning bundle names by source (box.toml [model] source = "pull"): pulled into the store at
first boot while the box serves its built-in model, then loaded and served. The server runs this in a thread of
its master; the status it writes (STORE/.provisioned.json, the record of the pull) is what /metrics and the
console show, and what the next start of the server reads to serve the pulled model from the start.

A source that refuses (wrong sha256, not a GGUF, no such file) is not tried again: the owner fixes the bundle.
Anything else (the LAN down, the server restarting) is tried again, later each time, resuming the download."""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import tenacity

from host_runtime.common.atomic_file import atomic_write
from host_runtime.models.errors import SourceRefused, StoreError
from host_runtime.models.pull import pull
from host_runtime.models.store import Store

log = logging.getLogger("everycycle.models")
RECORD = ".provisioned.json"
RETRY_FIRST_S = 5.0
RETRY_MAX_S = 600.0


class _Stopped(Exception):
    """stop() came while a pull waited to be tried again."""


@dataclass(frozen=True)
class PullStatus:
    """One provisioned pull, as written to its record and read by the server's metrics and the console."""
    name: str
    source: str
    sha256: str
    state: str = "pending"        # pending, pulling, retrying (after a passing failure), pulled, failed
    done_bytes: int = 0
    total_bytes: int | None = None
    rate_bytes_s: float = 0.0
    attempts: int = 0
    error: str = ""
    started_at: str = ""
    finished_at: str = ""

    @property
    def fraction(self) -> float | None:
        return self.done_bytes / self.total_bytes if self.total_bytes else None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "PullStatus":
        doc = json.loads(text)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in known})


def read_status(store: Store) -> PullStatus | None:
    try:
        return PullStatus.from_json((store.root / RECORD).read_text())
    except (OSError, ValueError, TypeError):
        return None


def pulled_path(store: Store, name: str, sha256: str) -> Path | None:
    """The pulled model's file when the store holds it with the sha256 the bundle gave; a bundle that gave none (a
    catalog name, hf://OWNER/REPO:QUANT: the Hub's listing gave the pull its sha256) by its name."""
    try:
        manifest = store.get(name)
    except StoreError:
        return None
    return store.path_of(manifest) if not sha256 or manifest.sha256 == sha256.lower() else None


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


class ProvisionedPull:
    def __init__(self, store: Store, name: str, source: str, sha256: str, on_pulled=None):
        """on_pulled(name) is called once the model is in the store (the server loads it then)."""
        self.store = store
        self.on_pulled = on_pulled or (lambda name: None)
        previous = read_status(store)
        attempts = previous.attempts if previous and previous.source == source and previous.name == name else 0
        self.status = PullStatus(name=name, source=source, sha256=sha256.lower(), attempts=attempts)
        self._stop = threading.Event()
        self._lock = threading.Lock()

    def _set(self, **changes) -> None:
        with self._lock:
            self.status = replace(self.status, **changes)
            status = self.status
        try:
            atomic_write(self.store.root / RECORD, status.to_json().encode(), mode=0o644)
        except OSError as exc:
            log.warning("could not write the pull's record: %s", exc)

    def run(self) -> PullStatus:
        """Pull until the model is in the store, the source refuses it, or stop() is called."""
        status = self.status
        if self._already_there():
            return self.status
        self.store.root.mkdir(parents=True, exist_ok=True)
        # A passing failure (the network, a server's 5xx) is tried again, waiting RETRY_FIRST_S and then twice as
        # long each time up to RETRY_MAX_S; a refusal (no such file, no access, a wrong hash) ends it; stop() ends
        # the wait at once.
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(StoreError) & tenacity.retry_if_not_exception_type(SourceRefused),
            wait=tenacity.wait_exponential(multiplier=RETRY_FIRST_S, max=RETRY_MAX_S),
            stop=lambda _: self._stop.is_set(), sleep=self._wait_unless_stopped, before_sleep=self._will_retry,
            reraise=True)
        try:
            for attempt in retrying:
                with attempt:
                    self._set(state="pulling", attempts=self.status.attempts + 1, error="",
                              started_at=self.status.started_at or _now())
                    try:
                        pull(self.store, status.source, status.name, status.sha256 or None, say=log.info,
                             observe=self._observe)
                    except StoreError:
                        if self._already_there():  # pulled meanwhile (an owner's `models pull` of the same file)
                            return self.status
                        raise
        except SourceRefused as exc:
            self._set(state="failed", error=str(exc), finished_at=_now())
            log.error("the bundle's model %s cannot be pulled: %s (the box keeps serving its built-in model)",
                      status.name, exc)
            return self.status
        except (StoreError, _Stopped):
            return self.status  # stop() during a pull or while it waited to try again
        self._done()
        return self.status

    def _wait_unless_stopped(self, seconds: float) -> None:
        if self._stop.wait(seconds):
            raise _Stopped

    def _will_retry(self, retry_state: tenacity.RetryCallState) -> None:
        exc = retry_state.outcome.exception()
        self._set(state="retrying", error=str(exc))
        log.warning("pulling %s failed (%s); trying again in %.0f s", self.status.name, exc,
                    retry_state.upcoming_sleep)

    def _already_there(self) -> bool:
        path = pulled_path(self.store, self.status.name, self.status.sha256)
        if path is None:
            try:
                self.store.get(self.status.name)
            except StoreError:
                return False
            self._set(state="failed", finished_at=_now(),
                      error=f"another model named {self.status.name!r} is in the store (its sha256 is not the "
                            "bundle's): rename one (model.name in box.toml) or remove it")
            log.error("%s", self.status.error)
            return True
        size = path.stat().st_size
        self._done(size)
        return True

    def _done(self, size: int | None = None) -> None:
        size = size if size is not None else (self.status.total_bytes or self.status.done_bytes)
        self._set(state="pulled", done_bytes=size, total_bytes=size, error="",
                  finished_at=self.status.finished_at or _now())
        log.info("the bundle's model %s is in the store", self.status.name)
        try:
            self.on_pulled(self.status.name)
        except Exception:
            log.exception("loading the pulled model %s failed", self.status.name)

    def _observe(self, progress) -> None:
        self._set(done_bytes=progress.done, total_bytes=progress.total, rate_bytes_s=round(progress.rate(), 1))

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="provisioned-pull", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()
