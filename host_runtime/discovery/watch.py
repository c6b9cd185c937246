"""Discovery as a service: rewrite the topology file when devices or addresses change.

Events come from udev (pci, block, net, drm; kernel uevents where no udevd runs) and
from netlink (links and addresses). Bursts are debounced; an event re-reads only the
sections it can change (a link: the network; a disk: storage), the periodic scan all of
them. The file is rewritten only when its content hash changes, atomically, so consumers
can watch its mtime (or use inotify on the directory) and never read half a file.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from host_runtime.discovery import topology

log = logging.getLogger(__name__)
UDEV_SUBSYSTEMS = ("pci", "block", "net", "drm")
# What an event of each udev subsystem can change; pci and drm (a card, a driver bound) change everything.
SECTIONS_BY_SUBSYSTEM = {"net": frozenset({"network"}), "block": frozenset({"storage"})}
REFRESH_S = 60.0  # a full re-scan even without events, for what sends none


class TopologyWatcher:
    def __init__(self, path: Path, debounce_s: float = 0.5, bmc_address: str | None = None):
        self.path = path
        self.debounce_s = debounce_s
        self.bmc_address = bmc_address
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pending: set[str] = set()
        self._doc: dict | None = None

    def refresh(self, only: frozenset[str] | None = None) -> bool:
        """Collect now (only those sections, where a full document was read before); write if the content changed.
        True if the file was written."""
        doc = topology.collect(self.bmc_address, only=only, previous=self._doc)
        self._doc = doc
        if doc["content_hash"] == topology.read_hash(self.path):
            return False
        topology.write(doc, self.path)
        log.info("topology written to %s (%s)", self.path, doc["content_hash"][:12])
        return True

    def mark(self, sections: frozenset[str] | None) -> None:
        """An event: these sections may have changed (None: any of them)."""
        with self._lock:
            self._pending.update(sections if sections is not None else topology.SECTIONS)
        self._dirty.set()

    def _take_pending(self) -> frozenset[str]:
        with self._lock:
            taken, self._pending = frozenset(self._pending), set()
        return taken

    def run(self) -> None:
        self.refresh()
        for target in (self._watch_udev, self._watch_netlink):
            threading.Thread(target=target, daemon=True).start()
        while not self._stop.is_set():
            if self._dirty.wait(timeout=REFRESH_S):
                # Debounce: wait until events stop arriving for a moment.
                while True:
                    self._dirty.clear()
                    if not self._dirty.wait(self.debounce_s):
                        break
                only = self._take_pending()
            else:
                only = None  # the periodic scan, for what sends no events
            if not self._stop.is_set():
                try:
                    self.refresh(only)
                except Exception:  # one bad scan must not end the service; the next event retries it
                    log.exception("topology refresh failed")
                    with self._lock:
                        self._pending.update(only if only is not None else topology.SECTIONS)

    def stop(self) -> None:
        self._stop.set()
        self._dirty.set()

    def _watch_udev(self) -> None:
        try:
            import pyudev

            context = pyudev.Context()
            try:
                monitor = pyudev.Monitor.from_netlink(context, source="udev")
                if not Path("/run/udev/control").exists():
                    raise OSError("no udevd")
            except (OSError, ValueError):
                monitor = pyudev.Monitor.from_netlink(context, source="kernel")
            for subsystem in UDEV_SUBSYSTEMS:
                monitor.filter_by(subsystem)
            monitor.start()
            while not self._stop.is_set():
                device = monitor.poll(timeout=1.0)
                if device is not None:
                    self.mark(SECTIONS_BY_SUBSYSTEM.get(device.subsystem))
        except Exception as exc:
            log.warning("udev events unavailable (%s); relying on netlink and periodic scans", exc)

    def _watch_netlink(self) -> None:
        try:
            from pyroute2 import IPRoute

            with IPRoute() as ipr:
                ipr.bind()
                while not self._stop.is_set():
                    if ipr.get():
                        self.mark(frozenset({"network"}))
        except Exception as exc:
            log.warning("netlink events unavailable (%s); relying on udev and periodic scans", exc)

