"""The boot check's CPU quota (a slow box on demand) really limits a process: the kernel caps its CPU time."""

import subprocess
import sys
import time

import psutil
import pytest

from image.cpu_quota import CpuQuota

pytestmark = [pytest.mark.system, pytest.mark.cgroup]  # starts a process; root and a cgroup cpu controller


def test_a_busy_process_under_a_20_percent_quota_gets_at_most_that():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        quota = CpuQuota(busy.pid, 20, f"everycycle-test-{busy.pid}")
        try:
            proc = psutil.Process(busy.pid)
            before, started = sum(proc.cpu_times()[:2]), time.monotonic()
            time.sleep(2.0)
            used, wall = sum(proc.cpu_times()[:2]) - before, time.monotonic() - started
            # CFS allows the quota per 100 ms period: at most 20% of the wall time, plus one period's worth.
            assert used <= 0.2 * wall + 0.1, (used, wall)
            assert used > 0.05  # it did run
        finally:
            quota.lift()
        assert not quota.group.exists()
    finally:
        busy.kill()
        busy.wait()
