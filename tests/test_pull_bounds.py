"""Pulls asked for through the API (#56, items 4 and 5): where they may go, how many run, how slow a server may be,
the disk they reserve, and the parts they leave. Before: a redirect to 127.0.0.1/admin was fetched; a server
dripping a byte every 29 s held a thread forever; two pulls each passed the room check alone; cut-off parts
stayed, listed nowhere."""

from __future__ import annotations

import os
import socket
import subprocess
import time

import pytest

from host_runtime.common import download
from host_runtime.models import pull as pulling
from host_runtime.models.errors import SourceRefused, StoreError
from host_runtime.models.pull_hosts import PullHosts
from host_runtime.models.pull_slots import PullsBusy, PullSlot, partials
from host_runtime.models.store import Store
from tests.file_server import serve_files
from tests.servers import everycycle
from tests.tiny_gguf import write_tiny_llama


def resolver(*addresses: str):
    def resolve(host, port, type=0):
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, type, 6, "", (a, port)) for a in addresses]
    return resolve


@pytest.mark.parametrize("url, why", [
    ("http://127.0.0.1:9290/telemetry", "loopback"),
    ("http://[::1]/x.gguf", "loopback"),
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://[fd00:ec2::254]/", "metadata"),
    ("http://0.0.0.0:8080/", "no download goes to"),
    ("http://[::ffff:127.0.0.1]/", "loopback"),
])
def test_by_default_the_boxs_own_services_and_metadata_addresses_are_refused(url, why):
    with pytest.raises(SourceRefused, match=why):
        PullHosts().check_url(url)


def test_lan_and_public_hosts_pass_by_default_and_a_name_is_judged_by_every_address_it_resolves_to():
    PullHosts().check_url("http://10.0.0.5:8000/m.gguf")
    PullHosts().check_url("https://models.example/m.gguf", resolve=resolver("93.184.216.34"))
    with pytest.raises(SourceRefused, match="localtest.me .127.0.0.1. is a loopback"):
        PullHosts().check_url("http://localtest.me/m.gguf", resolve=resolver("93.184.216.34", "127.0.0.1"))
    with pytest.raises(SourceRefused, match="http.s. URLs only"):
        PullHosts().check_url("file:///etc/everycycle/tls/ca.key")


def test_named_hosts_alone_pass_where_the_owner_names_some_and_a_named_one_may_be_loopback():
    hosts = PullHosts(("models.lan", "127.0.0.1", "10.0.1.0/24"))
    hosts.check_url("http://models.lan/m.gguf", resolve=resolver("10.9.9.9"))
    hosts.check_url("http://127.0.0.1:8000/m.gguf")
    hosts.check_url("http://10.0.1.7/m.gguf")
    with pytest.raises(SourceRefused, match="not among the hosts serving.toml's pull_hosts allows"):
        hosts.check_url("http://10.0.2.7/m.gguf")
    with pytest.raises(ValueError, match="neither a host name"):
        PullHosts(("http://x/",))


def test_a_redirect_to_a_host_not_allowed_is_refused_before_it_is_fetched(tmp_path):
    target = serve_files(tmp_path, host="127.0.0.2")  # stands in for the BMC agent or the router's admin port
    files = tmp_path / "files"
    files.mkdir()
    write_tiny_llama(files / "tiny.gguf", n_ctx=256)
    source = serve_files(files, redirects={"/tiny.gguf": f"{target.base}/admin/action?do=reboot",
                                           "/loop.gguf": "/loop.gguf?again", "/loop.gguf?again": "/loop.gguf"})
    store = Store(tmp_path / "store")
    try:
        with pytest.raises(SourceRefused, match="127.0.0.2 is not among the hosts"):
            pulling.pull(store, f"{source.base}/tiny.gguf", hosts=PullHosts(("127.0.0.1",)))
        assert target.paths == []  # never asked
        with pytest.raises(SourceRefused, match="127.0.0.1 is a loopback"):  # nothing named: loopback closed
            pulling.pull(store, f"{source.base}/tiny.gguf", hosts=PullHosts())
        with pytest.raises(SourceRefused, match="more than 5 redirects"):
            pulling.pull(store, f"{source.base}/loop.gguf", hosts=PullHosts(("127.0.0.1",)))
        assert target.paths == [] and store.list() == []
    finally:
        source.shutdown()
        target.shutdown()


class Drip:
    """A body that comes a byte at a time, each just inside the socket's timeout."""

    def __init__(self, every_s: float):
        self.every_s, self.sent = every_s, 0

    def read_some(self, n: int) -> bytes:
        time.sleep(self.every_s)
        self.sent += 1
        return b"x"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def test_a_server_that_drips_bytes_is_given_up_on_and_what_came_is_kept(tmp_path):
    drip = Drip(0.05)
    with pytest.raises(download.Stalled, match="the server stalled"):
        download.copy_hashing(drip, tmp_path / "part", lambda n: None, stall_window_s=0.5, stall_min_bytes=1024)
    assert 5 <= drip.sent <= 20 and (tmp_path / "part").stat().st_size == drip.sent
    assert isinstance(download.Stalled("x"), OSError)  # pull's "run the same pull again to resume"


def test_pulls_beyond_the_bound_wait_their_turn_and_their_reservations_add_up(tmp_path):
    folder = tmp_path / "partial"
    folder.mkdir()
    first = PullSlot.take(folder, "a")
    with pytest.raises(PullsBusy) as same:
        PullSlot.take(folder, "a")
    assert same.value.same_name
    second = PullSlot.take(folder, "b")
    with pytest.raises(PullsBusy, match="2 pulls are running .a, b.") as third:
        PullSlot.take(folder, "c")
    assert not third.value.same_name
    # a has 30 of its 40 GiB still to come; b asks for 30 GiB where 50 are free: alone it fits, beside a not
    first.reserve("http://x/a.gguf", 40 << 30, 50 << 30)
    (folder / "a.gguf.part").write_bytes(b"\0" * 1024)
    with pytest.raises(StoreError, match="beside the pulls running now"):
        second.reserve("http://x/b.gguf", 30 << 30, 50 << 30)
    assert second.reserve("http://x/b.gguf", 5 << 30, 50 << 30) == 5 << 30
    first.release()
    assert second.reserve("http://x/b.gguf", 30 << 30, 50 << 30) == 30 << 30  # a stopped: its room is free
    PullSlot.take(folder, "c").release()
    second.finish()
    assert sorted(p.name for p in folder.iterdir()) == ["a.gguf.part", "a.json", "a.lock"]


def test_a_part_no_pull_holds_is_listed_then_removed_once_it_has_aged(tmp_path):
    store = Store(tmp_path / "store")
    folder = store.partial_dir()
    (folder / "old.gguf.part").write_bytes(b"\0" * (3 << 20))
    (folder / "old.json").write_text('{"source": "http://x/old.gguf", "total": 8388608}')
    listed = subprocess.run(everycycle("models", "--store", str(store.root), "list"), capture_output=True,
                            text=True, timeout=60)
    assert listed.returncode == 0 and "partial downloads" in listed.stdout, listed.stdout + listed.stderr
    assert "old" in listed.stdout and "3.0M of 8.0M" in listed.stdout and "stopped" in listed.stdout
    [found] = partials(folder)
    assert (found.name, found.done_bytes, found.total_bytes, found.running) == ("old", 3 << 20, 8 << 20, False)
    PullSlot.take(folder, "new").release()
    assert (folder / "old.gguf.part").exists()  # fresh: kept to be resumed
    aged = time.time() - 3 * 86400
    for p in folder.glob("old.*"):
        os.utime(p, (aged, aged))
    PullSlot.take(folder, "new").release()
    assert not list(folder.glob("old.*"))
