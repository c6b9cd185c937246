"""A box lending its devices to a model another box holds (`everycycle shard host`).

llama.cpp's RPC server runs in this process on a loopback port, and beside it the facts a holder asks first
(facts.py: what each device lends, the link's speed); stunnel takes the LAN address and lets in only a peer
holding the fleet key (wire_key.py). Loopback is trusted as the box's other loopback services are: the
box runs nothing of anyone else's. The process ends when stunnel does, and stunnel with it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

from host_runtime.common.host_port import split_host_port
from host_runtime.gpu import rpc_devices
from host_runtime.shard.errors import ShardError
from host_runtime.shard.facts import FactsServer, LentDevice, facts_doc, lendable_bytes
from host_runtime.shard.ports import free_loopback_port
from host_runtime.shard.tunnel import Tunnel, wait_listening
from host_runtime.shard.tunnel_conf import server_conf

log = logging.getLogger("everycycle.shard")
SERVER_START_TIMEOUT_S = 30.0


def lent_now(devices, cap_bytes: int | None) -> list[LentDevice]:
    """What each device lends now (facts.lendable_bytes), in the order the RPC server serves them."""
    import psutil

    vm = psutil.virtual_memory()
    return [LentDevice(d.name, d.description, d.type,
                       lendable_bytes(d.type, d.free_bytes, d.total_bytes, vm.available, cap_bytes), d.total_bytes)
            for d in devices]


def lend(listen: str, secrets: str, *, cache_dir: str | None = None, n_threads: int = 0,
         cap_bytes: int | None = None, on_ready=lambda devices: None) -> int:
    """Serve this box's devices on `listen` (HOST:PORT on the LAN) until SIGTERM; the exit status. secrets: its
    wire's secrets file (wire_key: its own IDENTITY:KEY line). cap_bytes:
    the most any device lends (the member's own word: ggml's CPU device calls all RAM free)."""
    from host_runtime import __version__

    _, port = split_host_port(listen)
    lent = rpc_devices.devices_to_lend()
    if not lent:
        raise ShardError("llama.cpp sees no device on this box to lend")
    devices = [device for _, device in lent]
    facts = FactsServer(lambda: facts_doc(lent_now(devices, cap_bytes), __version__, rpc_devices.RPC_PROTOCOL))
    threading.Thread(target=facts.serve_forever, name="shard-facts", daemon=True).start()
    inner = free_loopback_port()
    if cache_dir:
        os.makedirs(cache_dir, mode=0o700, exist_ok=True)
    server = threading.Thread(target=rpc_devices.serve, name="rpc-server", daemon=True,
                              args=(f"127.0.0.1:{inner}", cache_dir, n_threads or os.cpu_count() or 1,
                                    [handle for handle, _ in lent]))
    server.start()
    if not wait_listening(os.getpid(), {inner}, server.is_alive, SERVER_START_TIMEOUT_S):
        raise ShardError("llama.cpp's RPC server did not start (its reason is on stderr above)")
    rpc, facts_at = f"127.0.0.1:{inner}", f"127.0.0.1:{facts.port}"
    tunnel = Tunnel(lambda secrets_file, log_file: server_conf(listen, rpc, facts_at, secrets_file, log_file),
                    secrets, [port])
    stopping = threading.Event()

    def stop(_signum, _frame):
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("lending %s on %s (TLS with the fleet's key; llama.cpp's RPC protocol %d.%d)",
             ", ".join(f"{d.name} ({d.description}, {d.lend_bytes / 2**30:.1f} of {d.total_bytes / 2**30:.1f} GiB)"
                       for d in lent_now(devices, cap_bytes)), listen, *rpc_devices.RPC_PROTOCOL)
    on_ready(devices)
    try:
        while not stopping.wait(0.5):
            if not tunnel.alive():
                log.error("stunnel ended: %s", tunnel.log_tail())
                return 1
            if not server.is_alive():
                log.error("llama.cpp's RPC server ended")
                return 1
        return 0
    finally:
        tunnel.stop()
        facts.shutdown()
