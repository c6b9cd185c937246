"""Discovery as a service: rewrite the topology file when devices or addresses change.

Events come from udev (pci, block, net, drm; kernel uevents where no udevd runs) and
from netlink (links and addresses). Bursts are debounced; the file is rewritten only
when its content hash changes, atomically, so consumers can watch its mtime (or use
inotify on the directory) and never read half a file.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from host_runtime.discovery import topology

log = logging.getLogger(__name__)
UDEV_SUBSYSTEMS = ("pci", "block", "net", "drm")
REFRESH_S = 60.0  # a full re-scan even without events, for what sends none


class TopologyWatcher:
    def __init__(self, path: Path, debounce_s: float = 0.5, bmc_address: str | None = None):
        self.path = path
        self.debounce_s = debounce_s
        self.bmc_address = bmc_address
        self._dirty = threading.Event()
        self._stop = threading.Event()

    def refresh(self) -> bool:
        """Collect now; write if the content changed. True if the file was written."""
        doc = topology.collect(self.bmc_address)
        if doc["content_hash"] == topology.read_hash(self.path):
            return False
        topology.write(doc, self.path)
        log.info("topology written to %s (%s)", self.path, doc["content_hash"][:12])
        return True

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
            if not self._stop.is_set():
                try:
                    self.refresh()
                except Exception:  # one bad scan must not end the service; the next event retries
                    log.exception("topology refresh failed")

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
                if monitor.poll(timeout=1.0) is not None:
                    self._dirty.set()
        except Exception as exc:
            log.warning("udev events unavailable (%s); relying on netlink and periodic scans", exc)

    def _watch_netlink(self) -> None:
        try:
            from pyroute2 import IPRoute

            with IPRoute() as ipr:
                ipr.bind()
                while not self._stop.is_set():
                    if ipr.get():
                        self._dirty.set()
        except Exception as exc:
            log.warning("netlink events unavailable (%s); relying on udev and periodic scans", exc)

